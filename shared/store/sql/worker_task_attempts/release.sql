-- Release: ends the attempt its worker gave back.
-- $1: claim.attempt_id
-- $2: reason
-- $3: AttemptStatus::Released.as_str()
UPDATE worker_task_attempts SET status = $3, finished_at = now(), updated_at = now(),
error_message = $2 WHERE id = $1
