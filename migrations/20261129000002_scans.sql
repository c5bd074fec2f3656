-- Scans and their user-visible plugin executions (scan jobs).

CREATE TABLE IF NOT EXISTS scans (
    id UUID PRIMARY KEY,
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    target_id UUID NOT NULL REFERENCES targets(id) ON DELETE CASCADE,
    client_id TEXT NOT NULL CHECK (length(client_id) BETWEEN 1 AND 128),
    idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 128),
    -- sha256 over the request's semantic fields (messages::scan_request_fingerprint).
    request_fingerprint TEXT NOT NULL,
    plugins TEXT[] NOT NULL CHECK (cardinality(plugins) BETWEEN 1 AND 16),
    priority INTEGER NOT NULL DEFAULT 0,
    execution_deadline_seconds INTEGER NULL CHECK (execution_deadline_seconds IS NULL OR execution_deadline_seconds > 0),
    state TEXT NOT NULL DEFAULT 'pending',
    failure_code TEXT NOT NULL DEFAULT '',
    failure_reason TEXT NOT NULL DEFAULT '',
    finding_count INTEGER NOT NULL DEFAULT 0,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at TIMESTAMPTZ NULL,
    finished_at TIMESTAMPTZ NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT scans_state_check CHECK (state IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    -- I5: one scan per (organization, client, key).
    CONSTRAINT scans_idempotency_unique UNIQUE (organization_id, client_id, idempotency_key)
);

-- I6: at most one pending/running scan per (organization, target). Admission also takes a
-- transaction-scoped advisory lock on the pair, so the index is the backstop, not the queue.
CREATE UNIQUE INDEX IF NOT EXISTS scans_one_active_per_target
    ON scans (organization_id, target_id)
    WHERE state IN ('pending', 'running');

-- The hourly quota counts an organization's recent admissions.
CREATE INDEX IF NOT EXISTS scans_org_created_idx ON scans (organization_id, created_at DESC);

-- Retention and "last successful scan".
CREATE INDEX IF NOT EXISTS scans_finished_idx ON scans (state, finished_at DESC) WHERE finished_at IS NOT NULL;

CREATE TABLE IF NOT EXISTS scan_jobs (
    id UUID PRIMARY KEY,
    scan_id UUID NOT NULL REFERENCES scans(id) ON DELETE CASCADE,
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL CHECK (position >= 0),
    plugin TEXT NOT NULL,
    state TEXT NOT NULL DEFAULT 'pending',
    -- Set once, in the transaction that completes the task: I7 evidence once.
    evidence_published_at TIMESTAMPTZ NULL,
    finding_count INTEGER NOT NULL DEFAULT 0,
    asset_count INTEGER NOT NULL DEFAULT 0,
    summary TEXT NOT NULL DEFAULT '',
    error_code TEXT NOT NULL DEFAULT '',
    error_message TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    started_at TIMESTAMPTZ NULL,
    finished_at TIMESTAMPTZ NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT scan_jobs_state_check CHECK (state IN ('pending', 'running', 'completed', 'failed', 'cancelled')),
    CONSTRAINT scan_jobs_position_unique UNIQUE (scan_id, position)
);
