-- Ingestion (one by one): locks a scan job and reads whether its evidence is published.
-- $1: scan_job_id
SELECT evidence_published_at IS NOT NULL, position FROM scan_jobs WHERE id = $1 FOR UPDATE
