-- Ingestion: what an open session received is not what its commit described; the session
-- ends (the reaper removes what it left). Returns the id when it moved.
-- $1 upload_id: uuid
-- $2 attempt_id: uuid
-- $3 why: text
-- $4 failed_status: text — UploadStatus::Failed.as_str()
-- $5 open_statuses: text[] — UploadStatus::OPEN.map(UploadStatus::as_str)
UPDATE worker_artifact_uploads
SET status = $4, error = $3
WHERE id = $1 AND attempt_id = $2 AND status = ANY($5)
RETURNING id
