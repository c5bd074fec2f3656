-- Ingestion (one by one): completes an attempt.
-- $1: claim.attempt_id
-- $2: AttemptStatus::Succeeded.as_str()
UPDATE worker_task_attempts SET status = $2, finished_at = now(), updated_at = now() WHERE id = $1
