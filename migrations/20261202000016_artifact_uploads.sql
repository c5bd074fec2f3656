-- Artifact upload sessions (issue 12 item 4): who sent the chunks, how many, why a session
-- failed, when it was verified, and when what it left on the bus was removed.
ALTER TABLE worker_artifact_uploads
    ADD COLUMN IF NOT EXISTS worker_id UUID NULL REFERENCES workers(id) ON DELETE CASCADE,
    ADD COLUMN IF NOT EXISTS chunks INTEGER NULL,
    ADD COLUMN IF NOT EXISTS error TEXT NOT NULL DEFAULT '',
    ADD COLUMN IF NOT EXISTS uploaded_at TIMESTAMPTZ NULL,
    ADD COLUMN IF NOT EXISTS removed_at TIMESTAMPTZ NULL;

-- A scan's committed artifacts, in commit order.
CREATE INDEX IF NOT EXISTS worker_artifact_uploads_scan_idx
    ON worker_artifact_uploads (scan_id, committed_at)
    WHERE status = 'committed';

-- The reaper's removal pass: sessions that ended without a commit and still have chunks or
-- an object to remove.
CREATE INDEX IF NOT EXISTS worker_artifact_uploads_removable_idx
    ON worker_artifact_uploads (created_at)
    WHERE status IN ('expired', 'failed') AND removed_at IS NULL;
