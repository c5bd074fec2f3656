-- A new credential replaces the holder's earlier ones: they are refused from now on.
-- $1 worker_id: uuid — may be NULL
-- $2 client_id: text — may be NULL
UPDATE nats_users SET retired_at = now()
WHERE retired_at IS NULL
  AND (worker_id = $1 OR client_id = $2)
