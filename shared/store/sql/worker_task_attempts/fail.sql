-- Ingestion (one by one): ends an attempt that its worker reported failed.
-- $1: claim.attempt_id
-- $2: params.error_code
-- $3: params.error_message
-- $4: AttemptStatus::Failed.as_str()
UPDATE worker_task_attempts SET status = $4, finished_at = now(), updated_at = now(),
       error_code = $2, error_message = $3
WHERE id = $1
