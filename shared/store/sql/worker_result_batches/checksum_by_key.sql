-- Ingestion (one by one): the checksum of the batch a task's idempotency key already names.
-- $1: claim.task_id
-- $2: params.idempotency_key
SELECT payload_sha256 FROM worker_result_batches WHERE task_id = $1 AND idempotency_key = $2
