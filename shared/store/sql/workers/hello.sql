-- A worker's hello: its capabilities, capacity and software, and that it was seen.
-- $1: params.worker_id
-- $2: params.capabilities
-- $3: params.capacity
-- $4: params.software_version
-- $5: params.protocol_version
UPDATE workers
SET capabilities = $2, max_concurrent_tasks = $3, software_version = $4,
    protocol_version = $5, last_seen_at = now(), updated_at = now()
WHERE id = $1
RETURNING enabled, revoked_at IS NOT NULL
