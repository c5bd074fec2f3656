-- Reaper: locks up to $1 running jobs whose lease lapsed (their holder crashed or stalled),
-- `SKIP LOCKED`, so a sweep never waits on a job a holder is still writing.
-- $1 limit: int8
-- $2 running_state: text — EnrichmentJobState::Running.as_str()
SELECT id, scan_id, organization_id, attempt_count, max_attempts
FROM enrichment_jobs
WHERE state = $2 AND lease_expires_at <= now()
ORDER BY lease_expires_at
LIMIT $1
FOR UPDATE SKIP LOCKED
