-- Reaper: claims leases that expired (skipping attempts or tasks someone holds locked), marks
-- their attempts expired, and returns each with its task for `progress::fail_tasks`.
-- $1 limit: int8
-- $2 leased_status: text — AttemptStatus::Leased.as_str()
-- $3 running_status: text — AttemptStatus::Running.as_str()
-- $4 expired_status: text — AttemptStatus::Expired.as_str()
-- $5 leased_state: text — TaskState::Leased.as_str()
-- $6 running_state: text — TaskState::Running.as_str()
-- $7 error_code: text — LEASE_EXPIRED
-- $8 error_message: text — LEASE_EXPIRED_MESSAGE
WITH stale AS (
    SELECT a.id AS attempt_id, t.id AS task_id, t.organization_id, t.scan_id, t.scan_job_id,
           coalesce(t.payload->>'plugin', '') AS plugin, t.attempt_count, t.max_attempts,
           (t.current_attempt_id = a.id AND t.state IN ($5, $6)) AS task_live
    FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
    WHERE a.status IN ($2, $3) AND a.lease_expires_at <= now()
    ORDER BY a.lease_expires_at
    LIMIT $1
    FOR UPDATE OF a, t SKIP LOCKED
), expired AS (
    UPDATE worker_task_attempts a
    SET status = $4, finished_at = now(), updated_at = now(), error_code = $7,
        error_message = $8
    FROM stale WHERE a.id = stale.attempt_id
)
SELECT * FROM stale
