-- Ingestion (one by one): how many of an attempt's batches are stored below a sequence number.
-- $1: claim.attempt_id
-- $2: batch_count
SELECT count(*) FROM worker_result_batches WHERE attempt_id = $1 AND sequence_number < $2
