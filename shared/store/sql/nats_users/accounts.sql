-- Every worker and client holding a NATS credential (or only the one of $1/$2), with what its
-- own NATS account is signed with: the organizations a client is bound to, and the keys NATS
-- must refuse (replaced ones, and all of a revoked worker's or client's).
-- $1 worker_id: uuid — NULL with $2 NULL: every identity
-- $2 client_id: text
SELECT u.worker_id,
       u.client_id,
       coalesce(c.organization_ids, '{}'::uuid[]) AS organization_ids,
       coalesce(
           array_agg(u.public_key ORDER BY u.public_key) FILTER (
               WHERE u.retired_at IS NOT NULL OR w.revoked_at IS NOT NULL OR c.revoked_at IS NOT NULL
           ),
           '{}'::text[]
       ) AS refused
FROM nats_users u
LEFT JOIN workers w ON w.id = u.worker_id
LEFT JOIN clients c ON c.id = u.client_id
WHERE ($1::uuid IS NULL AND $2::text IS NULL) OR u.worker_id = $1 OR u.client_id = $2
GROUP BY u.worker_id, u.client_id, c.organization_ids
ORDER BY u.worker_id, u.client_id
