-- Retention reads only what it removes (issue 8, "cost flat in table size"): result-batch
-- records are pruned oldest first by their own arrival. Choosing them through the tasks
-- that ended before the cutoff walked every such task on every sweep (tasks are never
-- pruned), and the plan joined the chosen ids back to all of worker_result_batches with a
-- sequential scan; `tests/tests/system/flat.rs` caught both on a large history.
CREATE INDEX IF NOT EXISTS worker_result_batches_received_idx ON worker_result_batches (received_at);
