-- Reaper: expires upload sessions past their deadline.
-- $1 limit: int8
-- $2 expired_status: text — UploadStatus::Expired.as_str()
-- $3 open_statuses: text[] — UploadStatus::OPEN.map(UploadStatus::as_str)
UPDATE worker_artifact_uploads SET status = $2
WHERE id IN (
    SELECT id FROM worker_artifact_uploads
    WHERE status = ANY($3) AND expires_at <= now()
    ORDER BY expires_at LIMIT $1
    FOR UPDATE SKIP LOCKED
)
