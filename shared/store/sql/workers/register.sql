-- Registers a worker, or changes the name and capacity of a registered one.
-- $1 id: uuid
-- $2 name: text
-- $3 capacity: int4
INSERT INTO workers (id, name, max_concurrent_tasks) VALUES ($1, $2, $3)
ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, updated_at = now()
