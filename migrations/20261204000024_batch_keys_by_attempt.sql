-- Issue 26, item 3: a result batch's idempotency key is scoped by its attempt, not its task. A
-- later attempt that reused an earlier attempt's key was answered `duplicate` without its
-- batch being stored, so its completion was refused `batch_missing` for good.
--
-- Locks: building the index takes a SHARE lock on worker_result_batches (result batches wait;
-- reads go on) for as long as the build, which is bounded by the table's retention.
CREATE UNIQUE INDEX IF NOT EXISTS worker_result_batches_attempt_key_idx
    ON worker_result_batches (attempt_id, idempotency_key);
ALTER TABLE worker_result_batches DROP CONSTRAINT IF EXISTS worker_result_batches_key_unique;

-- Older builds look a key up by task and decide against whatever rows they find: at worst they
-- answer a key an earlier attempt used `duplicate`, as they always did.
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261204000024, 'older builds still decide batches correctly; they only keep scoping keys by task')
ON CONFLICT (version) DO NOTHING;
