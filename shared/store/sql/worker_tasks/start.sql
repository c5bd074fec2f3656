-- Ingestion (one by one): a leased task runs once its first batch is accepted.
-- $1: claim.task_id
-- $2: TaskState::Running.as_str()
-- $3: TaskState::Leased.as_str()
UPDATE worker_tasks SET state = $2, updated_at = now() WHERE id = $1 AND state = $3
