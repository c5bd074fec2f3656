-- What renewing a worker's credentials checks: its account's key (NULL: not enrolled),
-- whether it may serve, and whether `$2` is its current NATS key. No row: no such worker.
-- $1 worker_id: uuid
-- $2 public_key: text
SELECT w.nats_account, w.enabled AND w.revoked_at IS NULL AS serves,
       EXISTS (
           SELECT 1 FROM nats_users u
           WHERE u.worker_id = w.id AND u.public_key = $2 AND u.retired_at IS NULL
       ) AS current_key
FROM workers w
WHERE w.id = $1
