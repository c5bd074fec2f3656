-- `palisade worker list`: workers in id order, a page after the id $1, each with the
-- organizations it serves now (its enabled assignments), its live leases and its last hello.
-- $1 after_id: uuid — the last id of the previous page, or NULL
-- $2 limit: int8
-- $3 live_statuses: text[] — LIVE_ATTEMPT_STATUSES
SELECT w.id, w.name, w.enabled, w.revoked_at, w.max_concurrent_tasks AS capacity,
       w.capabilities, w.software_version, w.last_seen_at, w.created_at,
       (SELECT count(*) FROM worker_task_attempts a
        WHERE a.worker_id = w.id AND a.status = ANY($3) AND a.lease_expires_at > now()) AS live_leases,
       ARRAY(SELECT ow.organization_id FROM organization_workers ow
             WHERE ow.worker_id = w.id AND ow.enabled AND ow.revoked_at IS NULL
             ORDER BY ow.organization_id) AS organization_ids
FROM workers w
WHERE ($1::uuid IS NULL OR w.id > $1)
ORDER BY w.id
LIMIT $2
