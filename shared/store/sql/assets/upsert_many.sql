-- Ingestion: upserts the batches' assets and links them to their scan jobs.
-- $1 asset_ids: uuid[]
-- $2 organizations: uuid[]
-- $3 kinds: text[]
-- $4 values: text[]
-- $5 link_scans: uuid[]
-- $6 link_organizations: uuid[]
-- $7 link_kinds: text[]
-- $8 link_values: text[]
-- $9 link_jobs: uuid[]
-- $10 link_attempts: uuid[]
WITH upserted AS (
    INSERT INTO assets (id, organization_id, kind, value)
    SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[])
    ON CONFLICT (organization_id, kind, value) DO UPDATE SET last_seen_at = now()
    RETURNING id, organization_id, kind, value
)
INSERT INTO scan_assets (scan_id, asset_id, scan_job_id, attempt_id)
SELECT l.scan_id, a.id, l.scan_job_id, l.attempt_id
FROM UNNEST($5::uuid[], $6::uuid[], $7::text[], $8::text[], $9::uuid[], $10::uuid[])
     AS l(scan_id, organization_id, kind, value, scan_job_id, attempt_id)
JOIN upserted a ON a.organization_id = l.organization_id AND a.kind = l.kind AND a.value = l.value
ON CONFLICT (scan_id, asset_id) DO UPDATE SET attempt_id = EXCLUDED.attempt_id
    WHERE scan_assets.scan_job_id = EXCLUDED.scan_job_id
