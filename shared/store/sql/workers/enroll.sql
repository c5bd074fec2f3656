-- Registers a worker enrolling with a token, or updates one enrolling again: limited to the
-- token's capabilities, with its account's key. Returns whether it may serve (not revoked).
-- $1 worker_id: uuid
-- $2 name: text
-- $3 capacity: int4
-- $4 allowed_capabilities: text[]
-- $5 nats_account: text — the worker's own NATS account (A…)
INSERT INTO workers (id, name, max_concurrent_tasks, allowed_capabilities, nats_account)
VALUES ($1, $2, $3, $4, $5)
ON CONFLICT (id) DO UPDATE
SET allowed_capabilities = EXCLUDED.allowed_capabilities, nats_account = EXCLUDED.nats_account,
    updated_at = now()
RETURNING enabled AND revoked_at IS NULL AS serves
