-- Ingestion (one by one): a leased attempt runs once its first batch is accepted.
-- $1: claim.attempt_id
-- $2: AttemptStatus::Running.as_str()
-- $3: AttemptStatus::Leased.as_str()
UPDATE worker_task_attempts SET status = $2, updated_at = now() WHERE id = $1 AND status = $3
