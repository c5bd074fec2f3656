-- `palisade finding list`: a page of a scan's findings in finding-key order after $5, with
-- the scan's collection revision read in the same snapshot (the page is bound to it). One row
-- with a NULL id for a scan without findings on the page; no row: no such scan.
-- $1 scan_id: uuid
-- $2 organization_id: uuid — NULL: any
-- $3 statuses: text[] — NULL: all
-- $4 severities: text[] — NULL: all
-- $5 after_finding_key: text — after this finding key ('' from the start)
-- $6 limit: int8 — page size
WITH scan AS (
    SELECT id, state, findings_revision FROM scans
    WHERE id = $1 AND ($2::uuid IS NULL OR organization_id = $2)
)
SELECT scan.state AS scan_state, scan.findings_revision AS collection_revision, page.*
FROM scan
LEFT JOIN LATERAL (
    SELECT f.id, f.finding_key, f.plugin, f.rule_id, f.resource, f.discriminator, f.severity,
           f.title, f.description, f.evidence, f.cve_ids, f.cve_data, f.status, f.status_reason,
           f.revision, f.reviewed_by, f.reviewed_at, f.created_at, f.updated_at
    FROM findings f
    WHERE f.scan_id = scan.id
      AND ($3::text[] IS NULL OR f.status = ANY($3))
      AND ($4::text[] IS NULL OR f.severity = ANY($4))
      AND f.finding_key > $5
    ORDER BY f.finding_key
    LIMIT $6
) page ON true
ORDER BY page.finding_key
