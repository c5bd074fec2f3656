-- Release: a released task is due again at once, and the attempt is not counted against its budget.
-- $1 task_id: uuid
-- $2 pending_state: text — TaskState::Pending.as_str()
UPDATE worker_tasks SET state = $2, attempt_count = attempt_count - 1, available_at = now(),
updated_at = now() WHERE id = $1
