-- Marks an enrollment token used by a worker's key, and records the enrollment: the actor
-- names the token and who issued it.
-- $1 token_id: uuid
-- $2 public_key: text — the enrolled worker's NATS user key
-- $3 change_id: uuid — the change's id (Uuid::now_v7())
-- $4 organization_ids: uuid[] — what the worker was enrolled for
-- $5 capabilities: text[]
-- $6 worker_enrolled_action: text — AdminAction::WorkerEnrolled
WITH used AS (
    UPDATE enrollment_tokens SET used_at = now(), used_by_key = $2
    WHERE id = $1 AND used_at IS NULL AND revoked_at IS NULL
    RETURNING id, worker_id, issued_by
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, worker_id, detail)
    SELECT $3, 'enrollment token ' || id || ' issued by ' || issued_by, '', $6, worker_id,
           jsonb_build_object('token_id', id, 'public_key', $2::text,
                              'organization_ids', $4::uuid[], 'capabilities', $5::text[])
    FROM used
)
SELECT worker_id FROM used
