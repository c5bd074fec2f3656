-- Ingestion: the stored batches that the batch's (attempt, idempotency key) or (attempt,
-- sequence) pairs collide with.
-- $1 key_attempt_ids: uuid[]
-- $2 keys: text[]
-- $3 sequence_attempt_ids: uuid[]
-- $4 sequences: int4[]
SELECT b.attempt_id, b.sequence_number, b.idempotency_key, b.payload_sha256
FROM UNNEST($1::uuid[], $2::text[]) AS u(attempt_id, key)
JOIN worker_result_batches b ON b.attempt_id = u.attempt_id AND b.idempotency_key = u.key
UNION
SELECT b.attempt_id, b.sequence_number, b.idempotency_key, b.payload_sha256
FROM UNNEST($3::uuid[], $4::int[]) AS u(attempt_id, sequence_number)
JOIN worker_result_batches b
  ON b.attempt_id = u.attempt_id AND b.sequence_number = u.sequence_number
