-- One upload session, in any state.
-- $1 upload_id: uuid
SELECT * FROM worker_artifact_uploads WHERE id = $1
