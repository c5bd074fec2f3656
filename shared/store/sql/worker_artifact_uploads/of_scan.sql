-- A scan's committed artifacts, in commit order.
-- $1 scan_id: uuid
-- $2 committed_status: text — UploadStatus::Committed.as_str()
SELECT * FROM worker_artifact_uploads
WHERE scan_id = $1 AND status = $2
ORDER BY committed_at, id
