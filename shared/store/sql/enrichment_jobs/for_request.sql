-- Enrichment requests: a scan (of organization $2, or any when NULL), its state, and its
-- enrichment job with that job's state, if it has one.
-- $1 scan_id: uuid
-- $2 organization_id: uuid
SELECT s.state AS scan_state, j.id AS job_id, j.state AS job_state
FROM scans s
LEFT JOIN enrichment_jobs j ON j.scan_id = s.id
WHERE s.id = $1 AND ($2::uuid IS NULL OR s.organization_id = $2)
