-- `palisade org list`: organizations in id order, a page after the id $1, each with its limits
-- and how many workers serve it now (enabled assignments), clients act for it (unrevoked) and
-- schedules it has. The clients are read once for the page: they are few (services, not users).
-- $1 after_id: uuid — the last id of the previous page, or NULL
-- $2 limit: int8
WITH page AS (
    SELECT o.id, o.name, o.hourly_scan_quota, o.max_running_tasks, o.created_at
    FROM organizations o
    WHERE ($1::uuid IS NULL OR o.id > $1)
    ORDER BY o.id
    LIMIT $2
), acting AS (
    SELECT bound.organization_id, count(*) AS clients
    FROM clients c CROSS JOIN LATERAL unnest(c.organization_ids) AS bound(organization_id)
    WHERE c.revoked_at IS NULL AND bound.organization_id IN (SELECT id FROM page)
    GROUP BY bound.organization_id
)
SELECT p.id, p.name, p.hourly_scan_quota, p.max_running_tasks, p.created_at,
       (SELECT count(*) FROM organization_workers ow
        WHERE ow.organization_id = p.id AND ow.enabled AND ow.revoked_at IS NULL) AS workers,
       coalesce(a.clients, 0) AS clients,
       (SELECT count(*) FROM scan_schedules s WHERE s.organization_id = p.id) AS schedules
FROM page p LEFT JOIN acting a ON a.organization_id = p.id
ORDER BY p.id
