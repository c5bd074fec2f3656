-- Acquire: the worker (locked: a revocation waits for this acquire and this acquire for a
-- revocation; two acquires of one worker take turns), its live leases, whether this request was
-- already granted, and its organizations.
-- $1: params.worker_id
-- $2: params.request_id
-- $3: LIVE_ATTEMPT_STATUSES
SELECT w.enabled, w.revoked_at IS NOT NULL AS revoked, w.capabilities,
       w.max_concurrent_tasks AS capacity,
       (SELECT count(*) FROM worker_task_attempts a
        WHERE a.worker_id = w.id AND a.status = ANY($3) AND a.lease_expires_at > now()) AS live,
       EXISTS (SELECT 1 FROM worker_task_attempts a
               WHERE a.worker_id = w.id AND a.acquire_request_id = $2) AS replayed,
       ARRAY(SELECT o.organization_id FROM organization_workers o
             WHERE o.worker_id = w.id AND o.enabled AND o.revoked_at IS NULL
             ORDER BY o.organization_id) AS organization_ids
FROM workers w WHERE w.id = $1
FOR NO KEY UPDATE OF w
