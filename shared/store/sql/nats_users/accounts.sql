-- Every worker and client holding a NATS credential or an enrollment token (or only the one of
-- $1/$2), with what its own NATS account is signed with: the organizations a client is bound
-- to, the keys NATS must refuse (replaced ones, and all of a revoked worker's or client's),
-- whether it is revoked (its account then refuses every user), and since when its
-- credentials count (re-enabled: every user issued at or before it is refused).
-- $1 worker_id: uuid — NULL with $2 NULL: every identity
-- $2 client_id: text
WITH holders AS (
    SELECT worker_id, client_id FROM nats_users
    WHERE ($1::uuid IS NULL AND $2::text IS NULL) OR worker_id = $1 OR client_id = $2
    UNION
    SELECT worker_id, NULL::text FROM enrollment_tokens
    WHERE ($1::uuid IS NULL AND $2::text IS NULL) OR worker_id = $1
)
SELECT h.worker_id,
       h.client_id,
       coalesce(c.organization_ids, '{}'::uuid[]) AS organization_ids,
       coalesce(
           array_agg(u.public_key ORDER BY u.public_key) FILTER (
               WHERE u.retired_at IS NOT NULL OR w.revoked_at IS NOT NULL OR c.revoked_at IS NOT NULL
           ),
           '{}'::text[]
       ) AS refused,
       (w.revoked_at IS NOT NULL OR c.revoked_at IS NOT NULL) AS revoked,
       coalesce(w.credentials_issued_after, c.credentials_issued_after) AS credentials_issued_after
FROM holders h
LEFT JOIN nats_users u ON u.worker_id = h.worker_id OR u.client_id = h.client_id
LEFT JOIN workers w ON w.id = h.worker_id
LEFT JOIN clients c ON c.id = h.client_id
GROUP BY h.worker_id, h.client_id, c.organization_ids, w.revoked_at, c.revoked_at,
         w.credentials_issued_after, c.credentials_issued_after
ORDER BY h.worker_id, h.client_id
