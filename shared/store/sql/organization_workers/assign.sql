-- Assigns a worker to an organization (again, if it was revoked).
-- $1: organization_id
-- $2: worker_id
INSERT INTO organization_workers (organization_id, worker_id) VALUES ($1, $2)
ON CONFLICT (organization_id, worker_id) DO UPDATE
SET enabled = true, revoked_at = NULL, revocation_reason = '', updated_at = now()
