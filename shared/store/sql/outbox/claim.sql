-- The relay's poll: claims the rows nobody holds, in the order they became claimable (written
-- and never claimed: `created_at`; claim lapsed: `claimed_until`), from `outbox_claimable_idx`.
-- $1: limit
-- $2: crate::seconds(claim_for)
WITH claimable AS (
    SELECT id FROM outbox
    WHERE published_at IS NULL AND coalesce(claimed_until, created_at) <= now()
    ORDER BY coalesce(claimed_until, created_at)
    LIMIT $1
    FOR UPDATE SKIP LOCKED
)
UPDATE outbox o
SET claimed_until = now() + make_interval(secs => $2), publish_attempts = publish_attempts + 1
FROM claimable
WHERE o.id = claimable.id
RETURNING o.id, o.subject, o.payload, o.headers
