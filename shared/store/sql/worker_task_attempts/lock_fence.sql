-- The fence of one claim (artifact uploads, renewals): locks an attempt and its task (attempt,
-- then task) and reads what the fence decides on.
-- $1 attempt_id: uuid
-- $2 task_id: uuid
SELECT a.attempt_number, a.lease_token, a.status AS attempt_status, a.worker_id,
       a.lease_expires_at > now() AS lease_live,
       t.state AS task_state, t.current_attempt_id, t.organization_id, t.scan_id,
       t.scan_job_id, t.attempt_count, t.max_attempts,
       t.cancel_requested_at IS NOT NULL AS cancel_requested,
       coalesce(t.payload->>'plugin', '') AS plugin
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id
WHERE a.id = $1 AND a.task_id = $2
FOR UPDATE OF a, t
