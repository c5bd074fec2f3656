-- Ingestion: stores accepted result batches.
-- $1: ids
-- $2: task_ids
-- $3: attempt_ids
-- $4: sequences
-- $5: keys
-- $6: checksums
-- $7: finding_counts
-- $8: asset_counts
-- $9: ResultBatchStatus::Persisted.as_str()
INSERT INTO worker_result_batches (id, task_id, attempt_id, sequence_number, idempotency_key,
                                   payload_sha256, status, finding_count, asset_count, persisted_at)
SELECT u.id, u.task_id, u.attempt_id, u.sequence_number, u.key, u.checksum, $9,
       u.finding_count, u.asset_count, now()
FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::int[], $5::text[], $6::text[],
            $7::int[], $8::int[])
     AS u(id, task_id, attempt_id, sequence_number, key, checksum, finding_count, asset_count)
