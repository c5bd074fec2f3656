-- One upload session, in any state.
-- $1: upload id
SELECT * FROM worker_artifact_uploads WHERE id = $1
