-- The sequence numbers below a batch count that an attempt has not delivered.
-- $1 attempt_id: uuid
-- $2 batch_count: int4
SELECT s FROM generate_series(0, $2 - 1) AS s
WHERE NOT EXISTS (SELECT 1 FROM worker_result_batches b WHERE b.attempt_id = $1 AND b.sequence_number = s)
ORDER BY s LIMIT 1000
