-- Revokes a client: its credentials are refused from now on.
-- $1: client_id
-- $2: reason
UPDATE clients SET revoked_at = coalesce(revoked_at, now()), revocation_reason = $2, updated_at = now()
WHERE id = $1
