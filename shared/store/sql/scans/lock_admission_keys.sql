-- Admission: one advisory lock per (organization, target) and per (organization, client, key) of
-- the batch, taken in key order so two batches never deadlock.
-- $1 organizations: uuid[]
-- $2 targets: text[]
-- $3 clients: text[]
-- $4 keys: text[]
SELECT pg_advisory_xact_lock(k)
FROM (
    SELECT DISTINCT k FROM (
        SELECT hashtextextended(u.organization_id::text || '/' || u.target, 0) AS k
        FROM UNNEST($1::uuid[], $2::text[]) AS u(organization_id, target)
        UNION ALL
        SELECT hashtextextended(u.organization_id::text || '/' || u.client_id || '/'
                                || u.idempotency_key, 1)
        FROM UNNEST($1::uuid[], $3::text[], $4::text[])
             AS u(organization_id, client_id, idempotency_key)
    ) keys
    ORDER BY k
) ordered
