-- Enrollment tokens, newest first, without their secrets; with `$1` false only those still
-- usable (unused, unrevoked, unexpired).
-- $1 include_spent: bool — used, revoked and expired ones too
-- $2 limit: int8
SELECT id, worker_id, worker_name, organization_ids, capabilities, issued_by, created_at,
       expires_at, used_at, used_by_key, revoked_at, revoked_by
FROM enrollment_tokens
WHERE $1 OR (used_at IS NULL AND revoked_at IS NULL AND expires_at > now())
ORDER BY created_at DESC, id
LIMIT $2
