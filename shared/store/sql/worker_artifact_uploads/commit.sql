-- Ingestion: a verified session whose file is in the artifact store becomes part of the
-- evidence (the fence was checked in this transaction). Returns the id when it moved.
-- $1 upload_id: uuid
-- $2 attempt_id: uuid
-- $3 committed_status: text — UploadStatus::Committed.as_str()
-- $4 uploaded_status: text — UploadStatus::Uploaded.as_str()
UPDATE worker_artifact_uploads
SET status = $3, committed_at = now()
WHERE id = $1 AND attempt_id = $2 AND status = $4
RETURNING id
