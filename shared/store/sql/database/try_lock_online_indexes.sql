-- `palisade migrate`: takes the session lock under which one process at a time builds indexes
-- concurrently; false when another holds it (a waiting lock would hold a snapshot the build
-- waits out, so callers poll instead).
SELECT pg_try_advisory_lock(7250271205)
