-- Ingestion (one by one): completes a task.
-- $1: claim.task_id
-- $2: TaskState::Completed.as_str()
UPDATE worker_tasks SET state = $2, completed_at = now(), updated_at = now() WHERE id = $1
