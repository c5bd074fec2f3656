-- Reaper, and ingestion after purging a committed session's chunks: what these sessions left on
-- the bus is gone (a committed session's chunks; an ended one's chunks and any object).
-- $1 upload_ids: uuid[]
UPDATE worker_artifact_uploads SET removed_at = now() WHERE id = ANY($1) AND removed_at IS NULL
