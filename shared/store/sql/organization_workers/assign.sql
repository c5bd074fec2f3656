-- Assigns a worker to an organization (again, if it was revoked), and records the change.
-- $1 organization_id: uuid
-- $2 worker_id: uuid
-- $3 change_id: uuid — the change's id (Uuid::now_v7())
-- $4 who: text
-- $5 why: text
-- $6 assignment_added_action: text — AdminAction::AssignmentAdded
WITH assigned AS (
    INSERT INTO organization_workers (organization_id, worker_id) VALUES ($1, $2)
    ON CONFLICT (organization_id, worker_id) DO UPDATE
    SET enabled = true, revoked_at = NULL, revocation_reason = '', updated_at = now()
    RETURNING organization_id, worker_id
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, worker_id, organization_id)
    SELECT $3, $4, $5, $6, worker_id, organization_id FROM assigned
)
SELECT worker_id FROM assigned
