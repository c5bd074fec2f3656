-- `palisade migrate`, outside any transaction (store::online_indexes): drops the index of a
-- target's scans when an interrupted build left it INVALID, before building it again.
DROP INDEX CONCURRENTLY IF EXISTS scans_target_created_idx
