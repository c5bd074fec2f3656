-- Revokes a client: its credentials are refused from now on; the change recorded. No row: no
-- such client.
-- $1 client_id: text
-- $2 reason: text
-- $3 change_id: uuid — the change's id (Uuid::now_v7())
-- $4 who: text
-- $5 client_revoked_action: text — AdminAction::ClientRevoked
WITH revoked AS (
    UPDATE clients SET revoked_at = coalesce(revoked_at, now()), revocation_reason = $2,
           updated_at = now()
    WHERE id = $1 RETURNING id
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, client_id)
    SELECT $3, $4, $2, $5, id FROM revoked
)
SELECT id FROM revoked
