-- Revokes a worker: disabled, with the time and reason.
-- $1: worker_id
-- $2: reason
UPDATE workers SET enabled = false, revoked_at = coalesce(revoked_at, now()),
       revocation_reason = $2, updated_at = now()
WHERE id = $1 RETURNING id
