-- Issues an enrollment token (its secret's SHA-256 only) for one worker id, and records who
-- issued it. Refused, writing nothing, when an organization does not exist: the row then
-- names them and carries no expiry.
-- $1 token_id: uuid
-- $2 worker_id: uuid
-- $3 worker_name: text
-- $4 capacity: int4
-- $5 secret_sha256: bytea — SHA-256 of the token's secret
-- $6 organization_ids: uuid[]
-- $7 capabilities: text[]
-- $8 account_public_key: text — the worker's own NATS account (A…)
-- $9 ttl_seconds: float8 — how long it may be used, from now
-- $10 change_id: uuid — the change's id (Uuid::now_v7())
-- $11 who: text
-- $12 why: text
-- $13 token_created_action: text — AdminAction::EnrollmentTokenCreated
WITH unknown AS (
    SELECT coalesce(array_agg(o.id ORDER BY o.id), '{}'::uuid[]) AS ids
    FROM unnest($6::uuid[]) AS o (id)
    WHERE NOT EXISTS (SELECT 1 FROM organizations WHERE organizations.id = o.id)
), created AS (
    INSERT INTO enrollment_tokens (id, worker_id, worker_name, capacity, secret_sha256,
        organization_ids, capabilities, account_public_key, issued_by, reason, expires_at)
    SELECT $1, $2, $3, $4, $5, $6, $7, $8, $11, $12, now() + make_interval(secs => $9)
    FROM unknown WHERE cardinality(unknown.ids) = 0
    RETURNING id, worker_id, expires_at
), recorded AS (
    INSERT INTO admin_changes (id, actor, reason, action, worker_id, detail)
    SELECT $10, $11, $12, $13, worker_id,
           jsonb_build_object('token_id', id, 'organization_ids', $6::uuid[],
                              'capabilities', $7::text[], 'expires_at', expires_at)
    FROM created
)
SELECT (SELECT ids FROM unknown) AS unknown_organizations,
       (SELECT expires_at FROM created) AS expires_at
