-- Revocation: cancels a worker's live attempts (all, or those of one organization's tasks) and
-- returns their tasks to pending without counting the attempt against the budget.
-- $1 worker_id: uuid
-- $2 organization_id: uuid
-- $3 live_statuses: text[] — AttemptStatus::LIVE.map(AttemptStatus::as_str)
-- $4 cancelled_status: text — AttemptStatus::Cancelled.as_str()
-- $5 pending_state: text — TaskState::Pending.as_str()
-- $6 leased_states: text[] — TaskState::LEASED.map(TaskState::as_str)
WITH live AS (
    SELECT a.id, a.task_id FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
    WHERE a.worker_id = $1 AND a.status = ANY($3)
      AND ($2::uuid IS NULL OR t.organization_id = $2)
    ORDER BY a.id
    FOR UPDATE OF a
),
voided AS (
    UPDATE worker_task_attempts a
    SET status = $4, finished_at = now(), updated_at = now(),
        error_code = 'worker_revoked', error_message = 'the worker or its assignment was revoked'
    FROM live WHERE a.id = live.id
    RETURNING a.id, a.task_id
)
UPDATE worker_tasks t
SET state = $5, attempt_count = t.attempt_count - 1, available_at = now(), updated_at = now()
FROM voided
WHERE t.id = voided.task_id AND t.current_attempt_id = voided.id AND t.state = ANY($6)
RETURNING t.id, t.scan_id, t.organization_id, coalesce(t.payload->>'plugin', '')
