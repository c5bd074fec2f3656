-- Reaper: what these sessions left on the bus (chunks, object) is gone.
-- $1: upload ids
UPDATE worker_artifact_uploads SET removed_at = now() WHERE id = ANY($1) AND removed_at IS NULL
