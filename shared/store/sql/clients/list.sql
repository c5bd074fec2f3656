-- `palisade client list`: clients in id order, a page after the id $1, each with the
-- organizations it is bound to and whether it is revoked.
-- $1 after_id: text — the last id of the previous page, or NULL
-- $2 limit: int8
SELECT id, name, organization_ids, revoked_at, revocation_reason, created_at
FROM clients
WHERE ($1::text IS NULL OR id > $1)
ORDER BY id
LIMIT $2
