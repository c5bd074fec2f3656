-- Ingestion: whether a chunk a worker sent on its upload subject belongs to a session it may
-- still send to: that worker's, still `prepared`, not expired. Returns the id when it does.
-- $1: upload id (the subject's)
-- $2: worker id (the subject's)
-- $3: UploadStatus::Prepared.as_str()
SELECT id FROM worker_artifact_uploads
WHERE id = $1 AND worker_id = $2 AND status = $3 AND expires_at > now()
