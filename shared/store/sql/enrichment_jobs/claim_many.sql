-- Enrichment: claims up to $3 due pending jobs, oldest first, `SKIP LOCKED`, each with a new
-- fencing token and one more execution counted. A running job whose lease lapsed is not
-- claimed here: the reaper returns it to pending (or fails it once its executions are spent).
-- $1 owner: text
-- $2 lease_ttl_seconds: float8
-- $3 limit: int8
-- $4 pending_state: text — EnrichmentJobState::Pending.as_str()
-- $5 running_state: text — EnrichmentJobState::Running.as_str()
WITH due AS (
    SELECT id FROM enrichment_jobs
    WHERE state = $4 AND available_at <= now()
    ORDER BY available_at, created_at
    LIMIT $3
    FOR UPDATE SKIP LOCKED
)
UPDATE enrichment_jobs j
SET state = $5, lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2),
    last_heartbeat_at = now(), fencing_token = j.fencing_token + 1, attempt_count = j.attempt_count + 1,
    updated_at = now()
FROM due WHERE j.id = due.id
RETURNING j.id, j.scan_id, j.organization_id, j.fencing_token, j.attempt_count, j.max_attempts,
          j.checkpoint,
          (SELECT s.trace_context FROM scans s WHERE s.id = j.scan_id) AS trace_context
