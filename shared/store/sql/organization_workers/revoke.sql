-- Revokes a worker's assignment to an organization, and records the change.
-- $1 organization_id: uuid
-- $2 worker_id: uuid
-- $3 reason: text
-- $4 change_id: uuid — the change's id (Uuid::now_v7())
-- $5 who: text
-- $6 assignment_revoked_action: text — AdminAction::AssignmentRevoked
WITH revoked AS (
    UPDATE organization_workers SET enabled = false, revoked_at = coalesce(revoked_at, now()),
           revocation_reason = $3, updated_at = now()
    WHERE organization_id = $1 AND worker_id = $2 RETURNING organization_id, worker_id
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, worker_id, organization_id)
    SELECT $4, $5, $3, $6, worker_id, organization_id FROM revoked
)
SELECT worker_id FROM revoked
