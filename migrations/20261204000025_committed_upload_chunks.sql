-- Issue 26, item 4: the reaper also purges the chunks of a committed upload session that
-- ingestion did not purge itself (it stopped between its commit and its purge). For a committed
-- session `removed_at` now says when its chunks were purged (its object is the artifact and
-- stays): ingestion sets it after its own purge, and the reaper takes a committed session still
-- without it once `store::artifacts::COMMITTED_CHUNKS_GRACE` has passed since its commit.
CREATE INDEX IF NOT EXISTS worker_artifact_uploads_committed_chunks_idx
    ON worker_artifact_uploads (committed_at)
    WHERE status = 'committed' AND removed_at IS NULL;

-- Sessions committed by older builds never had it set. Those committed more than a day ago have
-- no chunk left (every chunk was sent before its commit, and the uploads stream keeps one a day
-- at most, `bus::artifacts::UPLOAD_MAX_AGE`): recorded as purged, so the reaper does not purge
-- them again one by one. Younger ones it purges again, which removes nothing or what a crash
-- left.
UPDATE worker_artifact_uploads
SET removed_at = now()
WHERE status = 'committed' AND removed_at IS NULL AND committed_at < now() - interval '1 day';

-- Older builds read `removed_at` only of sessions that expired or failed, and never read the
-- index; a committed session they leave without `removed_at` has its chunks purged once more by
-- this build's reaper, which is harmless.
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261204000025, 'adds an index older builds do not use; removed_at of committed sessions, which older builds do not read, now records the purge of their chunks')
ON CONFLICT (version) DO NOTHING;
