-- The leasing envelope: tasks, their attempts (fencing), result batches, artifact uploads.

CREATE TABLE IF NOT EXISTS worker_tasks (
    id UUID PRIMARY KEY,
    task_type TEXT NOT NULL DEFAULT 'scanner_plugin',
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    scan_id UUID NULL REFERENCES scans(id) ON DELETE CASCADE,
    scan_job_id UUID NULL REFERENCES scan_jobs(id) ON DELETE CASCADE,
    required_capabilities TEXT[] NOT NULL DEFAULT '{}',
    -- Input snapshot handed to the worker: plugin, target, position.
    payload JSONB NOT NULL DEFAULT '{}'::jsonb,
    state TEXT NOT NULL DEFAULT 'pending',
    priority INTEGER NOT NULL DEFAULT 0,
    available_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    execution_deadline_seconds INTEGER NULL,
    -- Executions started that count against the budget (a release gives one back).
    attempt_count INTEGER NOT NULL DEFAULT 0,
    -- The fencing counter: the attempt_number of the newest attempt; never decreases.
    last_attempt_number INTEGER NOT NULL DEFAULT 0,
    max_attempts INTEGER NOT NULL DEFAULT 3,
    current_attempt_id UUID NULL,
    cancel_requested_at TIMESTAMPTZ NULL,
    completed_at TIMESTAMPTZ NULL,
    last_error_code TEXT NOT NULL DEFAULT '',
    last_error TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT worker_tasks_state_check CHECK (
        state IN ('pending', 'leased', 'running', 'cancelling', 'cancelled', 'completed', 'retry_wait', 'failed_terminal')
    ),
    CONSTRAINT worker_tasks_type_check CHECK (task_type IN ('scanner_plugin', 'ai')),
    CONSTRAINT worker_tasks_attempts_nonnegative CHECK (attempt_count >= 0 AND last_attempt_number >= attempt_count),
    CONSTRAINT worker_tasks_max_attempts_positive CHECK (max_attempts > 0)
);

CREATE UNIQUE INDEX IF NOT EXISTS worker_tasks_scan_job_unique
    ON worker_tasks (scan_job_id)
    WHERE scan_job_id IS NOT NULL AND task_type = 'scanner_plugin';

-- Acquisition: due tasks by priority then age.
CREATE INDEX IF NOT EXISTS worker_tasks_due_idx
    ON worker_tasks (priority DESC, available_at, created_at)
    WHERE state IN ('pending', 'retry_wait');

CREATE INDEX IF NOT EXISTS worker_tasks_org_state_idx ON worker_tasks (organization_id, state);
CREATE INDEX IF NOT EXISTS worker_tasks_scan_idx ON worker_tasks (scan_id);

CREATE TABLE IF NOT EXISTS worker_task_attempts (
    id UUID PRIMARY KEY,
    task_id UUID NOT NULL REFERENCES worker_tasks(id) ON DELETE CASCADE,
    worker_id UUID NOT NULL REFERENCES workers(id) ON DELETE RESTRICT,
    -- The fencing token: strictly increasing per task.
    attempt_number INTEGER NOT NULL CHECK (attempt_number > 0),
    -- The secret the worker presents with every mutating message.
    lease_token TEXT NOT NULL,
    -- The acquire request that granted it: a replayed request returns the same leases.
    acquire_request_id UUID NOT NULL,
    status TEXT NOT NULL DEFAULT 'leased',
    lease_expires_at TIMESTAMPTZ NOT NULL,
    last_renewed_at TIMESTAMPTZ NULL,
    started_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    finished_at TIMESTAMPTZ NULL,
    error_code TEXT NOT NULL DEFAULT '',
    error_message TEXT NOT NULL DEFAULT '',
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT worker_task_attempts_status_check CHECK (
        status IN ('leased', 'running', 'succeeded', 'failed', 'cancelled', 'expired', 'superseded', 'released')
    ),
    CONSTRAINT worker_task_attempts_number_unique UNIQUE (task_id, attempt_number),
    CONSTRAINT worker_task_attempts_token_unique UNIQUE (lease_token)
);

-- I1: at most one live attempt per task.
CREATE UNIQUE INDEX IF NOT EXISTS worker_task_attempts_one_live
    ON worker_task_attempts (task_id)
    WHERE status IN ('leased', 'running');

-- Stale recovery and lease-age metrics.
CREATE INDEX IF NOT EXISTS worker_task_attempts_live_expiry_idx
    ON worker_task_attempts (lease_expires_at)
    WHERE status IN ('leased', 'running');

-- Capacity checks and idempotent acquire.
CREATE INDEX IF NOT EXISTS worker_task_attempts_worker_live_idx
    ON worker_task_attempts (worker_id)
    WHERE status IN ('leased', 'running');
CREATE INDEX IF NOT EXISTS worker_task_attempts_request_idx
    ON worker_task_attempts (worker_id, acquire_request_id);

CREATE TABLE IF NOT EXISTS worker_result_batches (
    id UUID PRIMARY KEY,
    task_id UUID NOT NULL REFERENCES worker_tasks(id) ON DELETE CASCADE,
    attempt_id UUID NOT NULL REFERENCES worker_task_attempts(id) ON DELETE CASCADE,
    sequence_number INTEGER NOT NULL CHECK (sequence_number >= 0),
    idempotency_key TEXT NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 128),
    payload_sha256 TEXT NOT NULL CHECK (payload_sha256 ~ '^[0-9a-f]{64}$'),
    status TEXT NOT NULL DEFAULT 'persisted',
    finding_count INTEGER NOT NULL DEFAULT 0,
    asset_count INTEGER NOT NULL DEFAULT 0,
    received_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    persisted_at TIMESTAMPTZ NULL,
    error TEXT NOT NULL DEFAULT '',
    -- I2: a (task, key) is accepted once.
    CONSTRAINT worker_result_batches_key_unique UNIQUE (task_id, idempotency_key),
    CONSTRAINT worker_result_batches_sequence_unique UNIQUE (attempt_id, sequence_number),
    CONSTRAINT worker_result_batches_status_check CHECK (status IN ('accepted', 'persisted', 'duplicate', 'failed'))
);

CREATE TABLE IF NOT EXISTS worker_artifact_uploads (
    id UUID PRIMARY KEY,
    task_id UUID NOT NULL REFERENCES worker_tasks(id) ON DELETE CASCADE,
    attempt_id UUID NOT NULL REFERENCES worker_task_attempts(id) ON DELETE CASCADE,
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    scan_id UUID NULL REFERENCES scans(id) ON DELETE CASCADE,
    scan_job_id UUID NULL REFERENCES scan_jobs(id) ON DELETE CASCADE,
    object_key TEXT NOT NULL UNIQUE,
    original_name TEXT NOT NULL,
    content_type TEXT NOT NULL DEFAULT 'application/octet-stream',
    size_bytes BIGINT NULL,
    sha256 TEXT NOT NULL DEFAULT '',
    status TEXT NOT NULL DEFAULT 'prepared',
    expires_at TIMESTAMPTZ NOT NULL,
    committed_at TIMESTAMPTZ NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT worker_artifact_uploads_status_check CHECK (status IN ('prepared', 'uploaded', 'committed', 'expired', 'failed'))
);

CREATE INDEX IF NOT EXISTS worker_artifact_uploads_task_idx ON worker_artifact_uploads (task_id);
CREATE INDEX IF NOT EXISTS worker_artifact_uploads_expiry_idx
    ON worker_artifact_uploads (expires_at)
    WHERE status IN ('prepared', 'uploaded');
