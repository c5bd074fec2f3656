-- Enables a revoked client again.
-- $1: client_id
UPDATE clients SET revoked_at = NULL, revocation_reason = '', updated_at = now() WHERE id = $1
