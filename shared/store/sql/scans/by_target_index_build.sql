-- `palisade migrate`, outside any transaction (store::online_indexes): builds the index of a
-- target's scans, newest first, without blocking writes to `scans`.
CREATE INDEX CONCURRENTLY IF NOT EXISTS scans_target_created_idx ON scans (target_id, created_at DESC)
