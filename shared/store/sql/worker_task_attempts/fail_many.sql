-- Ingestion: ends the attempts their workers reported failed, each with its own error.
-- $1 attempt_ids: uuid[]
-- $2 codes: text[]
-- $3 texts: text[]
-- $4 failed_status: text — AttemptStatus::Failed.as_str()
UPDATE worker_task_attempts a SET status = $4, finished_at = now(), updated_at = now(),
       error_code = u.code, error_message = u.text
FROM UNNEST($1::uuid[], $2::text[], $3::text[]) AS u(attempt_id, code, text)
WHERE a.id = u.attempt_id
