-- The outbox, one row per decision (issue 24): the events one transaction writes (a batch of
-- admissions, a batch of results, a lease round) are stored together, in parallel arrays, so
-- a decision writes one outbox row and one index entry per index instead of one per event.
-- Each event keeps its own id, published as its `Nats-Msg-Id`. A row is deleted once every
-- one of its events is acknowledged by the stream; if any is not, the whole row goes back to
-- the poll, and the events already on the stream are dropped there as repeats.
CREATE TABLE IF NOT EXISTS outbox_batches (
    id UUID PRIMARY KEY,
    event_ids UUID[] NOT NULL,
    subjects TEXT[] NOT NULL,
    payloads BYTEA[] NOT NULL,
    headers JSONB[] NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A relay that claimed the row owns it until then; past it, any relay may take it. A row
    -- staged by its committer is written claimed (the hand-off).
    claimed_until TIMESTAMPTZ NULL,
    publish_attempts INTEGER NOT NULL DEFAULT 0,
    CHECK (cardinality(event_ids) > 0
           AND cardinality(subjects) = cardinality(event_ids)
           AND cardinality(payloads) = cardinality(event_ids)
           AND cardinality(headers) = cardinality(event_ids))
);

-- The relay's poll, in the order rows became claimable (as `outbox_claimable_idx`).
CREATE INDEX IF NOT EXISTS outbox_batches_claimable_idx
    ON outbox_batches ((coalesce(claimed_until, created_at)));

-- Older builds write one `outbox` row per event and never read this table; this build's relays
-- publish both tables, so nothing an older build writes during a rollout waits. `outbox` stays
-- until a later migration drops it.
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261203000022, 'adds a table older builds neither read nor write; newer relays publish the old outbox too')
ON CONFLICT (version) DO NOTHING;
