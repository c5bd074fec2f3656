-- The relay's poll: claims the oldest unpublished rows nobody holds.
-- $1: limit
-- $2: crate::seconds(claim_for)
WITH claimable AS (
    SELECT id FROM outbox
    WHERE published_at IS NULL AND (claimed_until IS NULL OR claimed_until < now())
    ORDER BY created_at
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox o
SET claimed_until = now() + make_interval(secs => $2), publish_attempts = publish_attempts + 1
FROM claimable
WHERE o.id = claimable.id
RETURNING o.id, o.subject, o.payload, o.headers
