-- Ingestion (one by one): deletes the asset links an earlier attempt of a scan job left.
-- $1: scan_job_id
-- $2: claim.attempt_id
DELETE FROM scan_assets WHERE scan_job_id = $1 AND attempt_id <> $2
