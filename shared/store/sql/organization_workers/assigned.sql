-- The organizations a worker serves now (enabled, not revoked).
-- $1 worker_id: uuid
SELECT organization_id FROM organization_workers
WHERE worker_id = $1 AND enabled AND revoked_at IS NULL
