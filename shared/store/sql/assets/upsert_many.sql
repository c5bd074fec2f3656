-- Ingestion: stores the batches' assets and links them to their scan jobs. An asset already
-- stored is only read (its row is not written, so concurrent decisions reporting the same asset,
-- every scan of one host, never wait for each other); only an asset another transaction stored
-- after this statement began is locked, to learn its id. So `assets.last_seen_at` stays at
-- `first_seen_at`: when a scan last saw an asset is in `scan_assets` (no reader uses it).
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
WITH wanted AS (
    SELECT * FROM UNNEST($1::uuid[], $2::uuid[], $3::text[], $4::text[])
        AS w(id, organization_id, kind, value)
), stored AS (
    SELECT a.id, a.organization_id, a.kind, a.value
    FROM assets a JOIN wanted w USING (organization_id, kind, value)
), inserted AS (
    INSERT INTO assets (id, organization_id, kind, value)
    SELECT w.id, w.organization_id, w.kind, w.value FROM wanted w
    WHERE NOT EXISTS (SELECT 1 FROM stored s
                      WHERE s.organization_id = w.organization_id AND s.kind = w.kind
                        AND s.value = w.value)
    ORDER BY w.organization_id, w.kind, w.value
    ON CONFLICT (organization_id, kind, value) DO UPDATE SET last_seen_at = assets.last_seen_at
    RETURNING id, organization_id, kind, value
), known AS (
    SELECT * FROM stored UNION ALL SELECT * FROM inserted
)
INSERT INTO scan_assets (scan_id, asset_id, scan_job_id, attempt_id)
SELECT l.scan_id, a.id, l.scan_job_id, l.attempt_id
FROM UNNEST($5::uuid[], $6::uuid[], $7::text[], $8::text[], $9::uuid[], $10::uuid[])
     AS l(scan_id, organization_id, kind, value, scan_job_id, attempt_id)
JOIN known a ON a.organization_id = l.organization_id AND a.kind = l.kind AND a.value = l.value
ON CONFLICT (scan_id, asset_id) DO UPDATE SET attempt_id = EXCLUDED.attempt_id
    WHERE scan_assets.scan_job_id = EXCLUDED.scan_job_id
