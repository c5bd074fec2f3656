-- Enables a worker again.
-- $1: worker_id
UPDATE workers SET enabled = true, revoked_at = NULL, revocation_reason = '', updated_at = now() WHERE id = $1
