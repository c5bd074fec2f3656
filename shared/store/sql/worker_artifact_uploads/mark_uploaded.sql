-- Ingestion: the chunks of an open, unexpired session were read back and match the commit's
-- count and size (the fence was checked in this transaction); its file streams into the store
-- next, its sha256 checked on the way. Returns the id when it moved.
-- $1 upload_id: uuid
-- $2 attempt_id: uuid
-- $3 size_bytes: int8 — size in bytes
-- $4 sha256: text — lowercase hex
-- $5 chunks: int4
-- $6 uploaded_status: text — UploadStatus::Uploaded.as_str()
-- $7 open_statuses: text[] — UploadStatus::OPEN.map(UploadStatus::as_str)
UPDATE worker_artifact_uploads
SET status = $6, size_bytes = $3, sha256 = $4, chunks = $5, uploaded_at = now()
WHERE id = $1 AND attempt_id = $2 AND status = ANY($7) AND expires_at > now()
RETURNING id
