-- The relay's poll: claims the rows nobody holds, in the order they became claimable (written
-- and never claimed: `created_at`; claim lapsed: `claimed_until`), from both tables: a batch
-- row (one decision's events) and a row an older build wrote (one event). Batch rows are taken
-- while the events before them number fewer than the limit, so one large row is still taken.
-- $1 limit: int8
-- $2 claim_for_seconds: float8
WITH single AS (
    SELECT id FROM outbox
    WHERE published_at IS NULL AND coalesce(claimed_until, created_at) <= now()
    ORDER BY coalesce(claimed_until, created_at)
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), claimed_single AS (
    UPDATE outbox o
    SET claimed_until = now() + make_interval(secs => $2), publish_attempts = publish_attempts + 1
    FROM single
    WHERE o.id = single.id
    RETURNING o.id, ARRAY[o.id] AS event_ids, ARRAY[o.subject] AS subjects,
              ARRAY[o.payload] AS payloads, ARRAY[o.headers] AS headers
), batches AS (
    SELECT id, coalesce(claimed_until, created_at) AS since, cardinality(event_ids) AS events
    FROM outbox_batches
    WHERE coalesce(claimed_until, created_at) <= now()
    ORDER BY coalesce(claimed_until, created_at)
    LIMIT $1
    FOR UPDATE SKIP LOCKED
), within AS (
    SELECT id FROM (
        SELECT id, events, sum(events) OVER (ORDER BY since, id) AS running FROM batches
    ) counted
    WHERE running - events < $1
), claimed_batches AS (
    UPDATE outbox_batches b
    SET claimed_until = now() + make_interval(secs => $2), publish_attempts = publish_attempts + 1
    FROM within
    WHERE b.id = within.id
    RETURNING b.id, b.event_ids, b.subjects, b.payloads, b.headers
)
SELECT id, event_ids, subjects, payloads, headers FROM claimed_single
UNION ALL
SELECT id, event_ids, subjects, payloads, headers FROM claimed_batches
