-- Ingestion: whether a chunk a worker sent on its upload subject belongs to a session it may
-- still send to: that worker's, still `prepared`, not expired. Returns the id when it does.
-- $1 upload_id: uuid — the subject's
-- $2 worker_id: uuid — the subject's
-- $3 prepared_status: text — UploadStatus::Prepared.as_str()
SELECT id FROM worker_artifact_uploads
WHERE id = $1 AND worker_id = $2 AND status = $3 AND expires_at > now()
