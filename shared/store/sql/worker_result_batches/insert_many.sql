-- Ingestion: stores accepted result batches.
-- $1 ids: uuid[]
-- $2 task_ids: uuid[]
-- $3 attempt_ids: uuid[]
-- $4 sequences: int4[]
-- $5 keys: text[]
-- $6 checksums: text[]
-- $7 finding_counts: int4[]
-- $8 asset_counts: int4[]
-- $9 persisted_status: text — ResultBatchStatus::Persisted.as_str()
INSERT INTO worker_result_batches (id, task_id, attempt_id, sequence_number, idempotency_key,
                                   payload_sha256, status, finding_count, asset_count, persisted_at)
SELECT u.id, u.task_id, u.attempt_id, u.sequence_number, u.key, u.checksum, $9,
       u.finding_count, u.asset_count, now()
FROM UNNEST($1::uuid[], $2::uuid[], $3::uuid[], $4::int[], $5::text[], $6::text[],
            $7::int[], $8::int[])
     AS u(id, task_id, attempt_id, sequence_number, key, checksum, finding_count, asset_count)
