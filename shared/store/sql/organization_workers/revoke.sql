-- Revokes a worker's assignment to an organization.
-- $1: organization_id
-- $2: worker_id
-- $3: reason
UPDATE organization_workers SET enabled = false, revoked_at = coalesce(revoked_at, now()),
       revocation_reason = $3, updated_at = now()
WHERE organization_id = $1 AND worker_id = $2 RETURNING worker_id
