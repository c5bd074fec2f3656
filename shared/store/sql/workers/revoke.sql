-- Revokes a worker: disabled, with the time and reason, and the change recorded.
-- $1 worker_id: uuid
-- $2 reason: text
-- $3 change_id: uuid — the change's id (Uuid::now_v7())
-- $4 who: text
-- $5 worker_revoked_action: text — AdminAction::WorkerRevoked
WITH revoked AS (
    UPDATE workers SET enabled = false, revoked_at = coalesce(revoked_at, now()),
           revocation_reason = $2, updated_at = now()
    WHERE id = $1 RETURNING id
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, worker_id)
    SELECT $3, $4, $2, $5, id FROM revoked
)
SELECT id FROM revoked
