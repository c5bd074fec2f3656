-- Reaper: claims attempts past their task's execution deadline (skipping attempts or tasks
-- someone holds locked), marks them failed, and returns each with its task for
-- `progress::fail_tasks`. The same shape as `recover_expired.sql`, ordered by its own index.
-- $1 limit: int8
-- $2 leased_status: text — AttemptStatus::Leased.as_str()
-- $3 running_status: text — AttemptStatus::Running.as_str()
-- $4 failed_status: text — AttemptStatus::Failed.as_str()
-- $5 leased_state: text — TaskState::Leased.as_str()
-- $6 running_state: text — TaskState::Running.as_str()
-- $7 error_code: text — DEADLINE_EXCEEDED
-- $8 error_message: text — DEADLINE_EXCEEDED_MESSAGE
WITH overdue AS (
    SELECT a.id AS attempt_id, t.id AS task_id, t.organization_id, t.scan_id, t.scan_job_id,
           coalesce(t.payload->>'plugin', '') AS plugin, t.attempt_count, t.max_attempts,
           (t.current_attempt_id = a.id AND t.state IN ($5, $6)) AS task_live
    FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
    WHERE a.status IN ($2, $3) AND t.execution_deadline_seconds IS NOT NULL
      AND a.started_at + make_interval(secs => t.execution_deadline_seconds) <= now()
    ORDER BY a.started_at
    LIMIT $1
    FOR UPDATE OF a, t SKIP LOCKED
), failed AS (
    UPDATE worker_task_attempts a
    SET status = $4, finished_at = now(), updated_at = now(), error_code = $7,
        error_message = $8
    FROM overdue WHERE a.id = overdue.attempt_id
)
SELECT * FROM overdue
