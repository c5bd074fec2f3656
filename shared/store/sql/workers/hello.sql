-- A worker's hello: its capabilities, capacity and software, and that it was seen; only
-- for an enabled worker that is not revoked (a refused hello writes nothing). Returns no
-- row for an unknown worker, else whether the hello was taken: false when the worker is
-- disabled or revoked, also by a revocation that committed while this statement waited.
-- $1 worker_id: uuid
-- $2 capabilities: text[]
-- $3 capacity: int4
-- $4 software_version: text
-- $5 protocol_version: text
WITH updated AS (
    UPDATE workers
    SET capabilities = $2, max_concurrent_tasks = $3, software_version = $4,
        protocol_version = $5, last_seen_at = now(), updated_at = now()
    WHERE id = $1 AND enabled AND revoked_at IS NULL
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM updated) AS accepted
FROM workers
WHERE id = $1
