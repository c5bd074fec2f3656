-- Revokes an enrollment token that was not used yet, and records who did. No row: no such
-- token, or it was used or revoked already.
-- $1 token_id: uuid
-- $2 change_id: uuid — the change's id (Uuid::now_v7())
-- $3 who: text
-- $4 why: text
-- $5 token_revoked_action: text — AdminAction::EnrollmentTokenRevoked
WITH revoked AS (
    UPDATE enrollment_tokens SET revoked_at = now(), revoked_by = $3
    WHERE id = $1 AND used_at IS NULL AND revoked_at IS NULL
    RETURNING id, worker_id
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, worker_id, detail)
    SELECT $2, $3, $4, $5, worker_id, jsonb_build_object('token_id', id) FROM revoked
)
SELECT worker_id FROM revoked
