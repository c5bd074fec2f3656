-- Ingestion: stores the batches' findings.
-- $1 ids: uuid[]
-- $2 organizations: uuid[]
-- $3 scans: uuid[]
-- $4 jobs: uuid[]
-- $5 attempts: uuid[]
-- $6 keys: text[]
-- $7 plugins: text[]
-- $8 rule_ids: text[]
-- $9 resources: text[]
-- $10 discriminators: text[]
-- $11 severities: text[]
-- $12 titles: text[]
-- $13 descriptions: text[]
-- $14 evidence: text[]
-- $15 cves: text[]
INSERT INTO findings (id, organization_id, scan_id, scan_job_id, attempt_id, finding_key, plugin,
                      rule_id, resource, discriminator, severity, title, description, evidence, cve_ids)
SELECT u.id, u.organization_id, u.scan_id, u.scan_job_id, u.attempt_id, u.key, u.plugin,
       u.rule_id, u.resource, u.discriminator, u.severity, u.title, u.description, u.evidence,
       coalesce(string_to_array(nullif(u.cves, ''), ','), '{}')::text[]
FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::uuid[], $5::uuid[], $6::text[], $7::text[],
            $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[],
            $14::text[], $15::text[])
     AS u(id, organization_id, scan_id, scan_job_id, attempt_id, key, plugin, rule_id, resource,
          discriminator, severity, title, description, evidence, cves)
ON CONFLICT (scan_id, finding_key) DO UPDATE
SET attempt_id = EXCLUDED.attempt_id, severity = EXCLUDED.severity, title = EXCLUDED.title,
    description = EXCLUDED.description, evidence = EXCLUDED.evidence,
    cve_ids = coalesce(EXCLUDED.cve_ids, '{}'), updated_at = now()
