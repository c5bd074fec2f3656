-- Ingestion (one by one): how many findings and assets a scan job holds.
-- $1: scan_job_id
SELECT (SELECT count(*) FROM findings WHERE scan_job_id = $1), (SELECT count(*) FROM scan_assets WHERE scan_job_id = $1)
