-- Enables a revoked client again, and records the change. No row: no such client.
-- $1: client_id
-- $2: the change's id (Uuid::now_v7())
-- $3: who
-- $4: why
-- $5: AdminAction::ClientEnabled
WITH enabled AS (
    UPDATE clients SET revoked_at = NULL, revocation_reason = '', updated_at = now()
    WHERE id = $1 RETURNING id
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, client_id)
    SELECT $2, $3, $4, $5, id FROM enabled
)
SELECT id FROM enabled
