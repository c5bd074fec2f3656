-- Ingestion: for each completing attempt, how many of its batches are stored below and at or above
-- its batch count.
-- $1 attempt_ids: uuid[]
-- $2 batch_counts: int4[]
SELECT u.attempt_id,
       count(b.id) FILTER (WHERE b.sequence_number < u.batch_count),
       count(b.id) FILTER (WHERE b.sequence_number >= u.batch_count)
FROM UNNEST($1::uuid[], $2::int[]) AS u(attempt_id, batch_count)
LEFT JOIN worker_result_batches b ON b.attempt_id = u.attempt_id
GROUP BY u.attempt_id
