-- `palisade migrate`: releases the index-build lock (try_lock_online_indexes).
SELECT pg_advisory_unlock(7250271205)
