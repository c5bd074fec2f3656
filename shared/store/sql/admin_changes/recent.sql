-- `palisade worker show` and `org show`: the latest changes of a worker, an organization (its
-- limits and assignments) or clients, newest first; NULL filters match nothing.
-- $1 worker_id: uuid — may be NULL
-- $2 organization_id: uuid — may be NULL
-- $3 client_ids: text[]
-- $4 limit: int8
SELECT id, at, actor, reason, action, worker_id, organization_id, client_id, detail
FROM (
    (SELECT * FROM admin_changes WHERE worker_id = $1 ORDER BY id DESC LIMIT $4)
    UNION
    (SELECT * FROM admin_changes WHERE organization_id = $2 ORDER BY id DESC LIMIT $4)
    UNION
    (SELECT * FROM admin_changes WHERE client_id = ANY($3) ORDER BY id DESC LIMIT $4)
) changes
ORDER BY id DESC
LIMIT $4
