-- An enrollment token as an enrollment checks it, locked until the enrollment commits so it
-- is used once whatever races it.
-- $1 token_id: uuid
SELECT worker_id, worker_name, capacity, secret_sha256, organization_ids, capabilities,
       account_public_key, issued_by, used_at IS NOT NULL AS used, used_by_key,
       revoked_at IS NOT NULL AS revoked,
       expires_at <= now() AS expired
FROM enrollment_tokens
WHERE id = $1
FOR UPDATE
