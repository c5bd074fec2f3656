-- Acquire, for acquires of distinct workers decided together: each worker (locked in id order,
-- as every grant locks workers: a revocation waits for this acquire and this acquire for a
-- revocation; two acquires of one worker take turns), its live leases, whether its request was
-- already granted, its organizations, and whether one of them caps its tasks in flight. Unknown
-- workers are not returned.
-- $1 worker_ids: uuid[]
-- $2 request_ids: uuid[]
-- $3 live_statuses: text[] — LIVE_ATTEMPT_STATUSES
SELECT w.id, w.enabled, w.revoked_at IS NOT NULL AS revoked, w.capabilities,
       w.max_concurrent_tasks AS capacity,
       (SELECT count(*) FROM worker_task_attempts a
        WHERE a.worker_id = w.id AND a.status = ANY($3) AND a.lease_expires_at > now()) AS live,
       EXISTS (SELECT 1 FROM worker_task_attempts a
               WHERE a.worker_id = w.id AND a.acquire_request_id = r.request_id) AS replayed,
       ARRAY(SELECT o.organization_id FROM organization_workers o
             WHERE o.worker_id = w.id AND o.enabled AND o.revoked_at IS NULL
             ORDER BY o.organization_id) AS organization_ids,
       EXISTS (SELECT 1 FROM organization_workers o
               JOIN organizations g ON g.id = o.organization_id
               WHERE o.worker_id = w.id AND o.enabled AND o.revoked_at IS NULL
                 AND g.max_running_tasks IS NOT NULL) AS serves_capped
FROM UNNEST($1::uuid[], $2::uuid[]) AS r(worker_id, request_id)
JOIN workers w ON w.id = r.worker_id
ORDER BY w.id
FOR NO KEY UPDATE OF w
