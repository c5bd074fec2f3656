-- Reaper: sessions that ended without a commit whose chunks and object are still to be
-- removed, oldest first.
-- $1: limit
-- $2: [UploadStatus::Expired.as_str(), UploadStatus::Failed.as_str()]
SELECT id, worker_id, object_key FROM worker_artifact_uploads
WHERE status = ANY($2) AND removed_at IS NULL
ORDER BY created_at
LIMIT $1
