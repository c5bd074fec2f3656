-- `palisade finding show`: one finding, with its scan's target and collection revision.
-- $1 finding_id: uuid
-- $2 organization_id: uuid — NULL: any
SELECT f.id, f.scan_id, f.organization_id, s.target_id, s.findings_revision AS collection_revision,
       f.finding_key, f.plugin, f.rule_id, f.resource, f.discriminator, f.severity, f.title,
       f.description, f.evidence, f.cve_ids, f.cve_data, f.status, f.status_reason, f.revision,
       f.reviewed_by, f.reviewed_at, f.created_at, f.updated_at
FROM findings f JOIN scans s ON s.id = f.scan_id
WHERE f.id = $1 AND ($2::uuid IS NULL OR f.organization_id = $2)
