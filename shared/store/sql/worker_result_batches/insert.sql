-- Ingestion (one by one): stores one accepted result batch.
-- $1: Uuid::now_v7()
-- $2: claim.task_id
-- $3: claim.attempt_id
-- $4: params.sequence_number
-- $5: params.idempotency_key
-- $6: params.payload_sha256
-- $7: params.findings.len() as i32
-- $8: params.assets.len() as i32
-- $9: ResultBatchStatus::Persisted.as_str()
INSERT INTO worker_result_batches (id, task_id, attempt_id, sequence_number, idempotency_key,
                                   payload_sha256, status, finding_count, asset_count, persisted_at)
VALUES ($1, $2, $3, $4, $5, $6, $9, $7, $8, now())
ON CONFLICT DO NOTHING
RETURNING id
