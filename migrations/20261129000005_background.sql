-- Background machinery: enrichment jobs, leader leases, the transactional outbox.

CREATE TABLE IF NOT EXISTS enrichment_jobs (
    id UUID PRIMARY KEY,
    -- I11: one enrichment job per scan, ever.
    scan_id UUID NOT NULL UNIQUE REFERENCES scans(id) ON DELETE CASCADE,
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    state TEXT NOT NULL DEFAULT 'pending',
    attempt_count INTEGER NOT NULL DEFAULT 0 CHECK (attempt_count >= 0),
    max_attempts INTEGER NOT NULL DEFAULT 3 CHECK (max_attempts > 0),
    fencing_token BIGINT NOT NULL DEFAULT 0,
    lease_owner TEXT NULL,
    lease_expires_at TIMESTAMPTZ NULL,
    last_heartbeat_at TIMESTAMPTZ NULL,
    available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    checkpoint JSONB NOT NULL DEFAULT '{}'::jsonb,
    last_error TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ NULL,
    CONSTRAINT enrichment_jobs_state_check CHECK (state IN ('pending', 'running', 'completed', 'failed'))
);

CREATE INDEX IF NOT EXISTS enrichment_jobs_due_idx
    ON enrichment_jobs (available_at, created_at)
    WHERE state = 'pending';
CREATE INDEX IF NOT EXISTS enrichment_jobs_running_expiry_idx
    ON enrichment_jobs (lease_expires_at)
    WHERE state = 'running';

CREATE TABLE IF NOT EXISTS leader_leases (
    name TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    term_started_at TIMESTAMPTZ NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- Events written in the transaction that makes them true; relayed to JetStream with
-- Nats-Msg-Id = id. The relay claims rows with SKIP LOCKED (never "id > cursor": ids and
-- sequences commit out of order).
CREATE TABLE IF NOT EXISTS outbox (
    id UUID PRIMARY KEY,
    subject TEXT NOT NULL,
    payload BYTEA NOT NULL,
    headers JSONB NOT NULL DEFAULT '{}'::jsonb,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    -- A relay that claimed the row owns it until then; past it, any relay may take it.
    claimed_until TIMESTAMPTZ NULL,
    publish_attempts INTEGER NOT NULL DEFAULT 0,
    published_at TIMESTAMPTZ NULL
);

CREATE INDEX IF NOT EXISTS outbox_unpublished_idx
    ON outbox (created_at)
    WHERE published_at IS NULL;
CREATE INDEX IF NOT EXISTS outbox_published_idx
    ON outbox (published_at)
    WHERE published_at IS NOT NULL;

-- Messages that failed max_deliver times for reasons of their own: recorded, never lost silently.
CREATE TABLE IF NOT EXISTS dead_letters (
    id UUID PRIMARY KEY,
    consumer TEXT NOT NULL,
    subject TEXT NOT NULL,
    stream_sequence BIGINT NOT NULL,
    delivered BIGINT NOT NULL,
    reason TEXT NOT NULL,
    payload BYTEA NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT dead_letters_message_unique UNIQUE (consumer, stream_sequence)
);

-- Retention of result-batch records of ended tasks.
CREATE INDEX IF NOT EXISTS worker_tasks_ended_idx
    ON worker_tasks (completed_at)
    WHERE state IN ('completed', 'failed_terminal', 'cancelled');
CREATE INDEX IF NOT EXISTS dead_letters_created_idx ON dead_letters (created_at);
