-- Enables a worker again, and records the change. Every credential of its account issued at
-- or before `$6` is refused from now on: it gets fresh ones. No row: no such worker.
-- $1 worker_id: uuid
-- $2 change_id: uuid — the change's id (Uuid::now_v7())
-- $3 who: text
-- $4 why: text
-- $5 worker_enabled_action: text — AdminAction::WorkerEnabled
-- $6 credentials_issued_after: timestamptz — the command's clock, whole seconds
WITH enabled AS (
    UPDATE workers SET enabled = true, revoked_at = NULL, revocation_reason = '',
           credentials_issued_after = $6, updated_at = now()
    WHERE id = $1 RETURNING id
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, worker_id)
    SELECT $2, $3, $4, $5, id FROM enabled
)
SELECT id FROM enabled
