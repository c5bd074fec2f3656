-- Ingestion: stores the batches' evaluations, one row per (scan, evaluation key), a later
-- message replacing an earlier one's verdict (the batches' keys are unique in one call).
-- $1 ids: uuid[]
-- $2 organizations: uuid[]
-- $3 scans: uuid[]
-- $4 jobs: uuid[]
-- $5 attempts: uuid[]
-- $6 keys: text[]
-- $7 plugins: text[]
-- $8 rule_ids: text[]
-- $9 resources: text[]
-- $10 statuses: text[]
-- $11 reason_codes: text[]
-- $12 evidence: text[]
-- $13 finding_keys: text[] — '' for none
INSERT INTO evaluations (id, organization_id, scan_id, scan_job_id, attempt_id, evaluation_key,
                         plugin, rule_id, resource, status, reason_code, evidence, finding_key)
SELECT u.id, u.organization_id, u.scan_id, u.scan_job_id, u.attempt_id, u.key, u.plugin,
       u.rule_id, u.resource, u.status, u.reason_code, u.evidence, nullif(u.finding_key, '')
FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::uuid[], $5::uuid[], $6::text[], $7::text[],
            $8::text[], $9::text[], $10::text[], $11::text[], $12::text[], $13::text[])
     AS u(id, organization_id, scan_id, scan_job_id, attempt_id, key, plugin, rule_id, resource,
          status, reason_code, evidence, finding_key)
ON CONFLICT (scan_id, evaluation_key) DO UPDATE
SET attempt_id = EXCLUDED.attempt_id,
    status = EXCLUDED.status, reason_code = EXCLUDED.reason_code,
    evidence = EXCLUDED.evidence, finding_key = EXCLUDED.finding_key, updated_at = now()
