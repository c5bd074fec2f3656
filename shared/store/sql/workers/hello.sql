-- A worker's hello: its capabilities, declared rules, capacity and software, and that it was
-- seen; only for an enabled worker that is not revoked and declares only capabilities it may
-- (an enrolled worker: its token's); a refused hello writes nothing. Returns no row for an
-- unknown worker, else whether the hello was taken (false when the worker is disabled or
-- revoked, also by a revocation that committed while this statement waited) and whether its
-- capabilities are allowed.
-- $1 worker_id: uuid
-- $2 capabilities: text[]
-- $3 capacity: int4
-- $4 software_version: text
-- $5 protocol_version: text
-- $6 declared_rules: jsonb — `coverage::DeclaredRules`
WITH updated AS (
    UPDATE workers
    SET capabilities = $2, max_concurrent_tasks = $3, software_version = $4,
        protocol_version = $5, declared_rules = $6, last_seen_at = now(), updated_at = now()
    WHERE id = $1 AND enabled AND revoked_at IS NULL
      AND (allowed_capabilities IS NULL OR $2 <@ allowed_capabilities)
    RETURNING id
)
SELECT EXISTS (SELECT 1 FROM updated) AS accepted,
       allowed_capabilities IS NULL OR $2 <@ allowed_capabilities AS capabilities_allowed
FROM workers
WHERE id = $1
