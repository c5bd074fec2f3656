-- Leases handed with completions: the workers that asked, locked in id order as acquire locks
-- one (a revocation waits for this grant and this grant for a revocation), with the room each
-- has left. Disabled, revoked and unknown workers are not returned: they get nothing.
-- $1 worker_ids: uuid[]
-- $2 live_statuses: text[] — LIVE_ATTEMPT_STATUSES
SELECT w.id,
       w.max_concurrent_tasks - (SELECT count(*) FROM worker_task_attempts a
                                 WHERE a.worker_id = w.id AND a.status = ANY($2)
                                   AND a.lease_expires_at > now()) AS room
FROM workers w
WHERE w.id = ANY($1) AND w.enabled AND w.revoked_at IS NULL
ORDER BY w.id
FOR NO KEY UPDATE OF w
