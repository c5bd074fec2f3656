-- Ingestion (one by one): deletes the findings an earlier attempt of a scan job left.
-- $1: scan_job_id
-- $2: claim.attempt_id
DELETE FROM findings WHERE scan_job_id = $1 AND attempt_id <> $2
