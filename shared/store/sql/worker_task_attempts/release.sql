-- Release: ends the attempt its worker gave back.
-- $1 attempt_id: uuid
-- $2 reason: text
-- $3 released_status: text — AttemptStatus::Released.as_str()
UPDATE worker_task_attempts SET status = $3, finished_at = now(), updated_at = now(),
error_message = $2 WHERE id = $1
