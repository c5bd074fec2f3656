-- Tenancy and worker identity: organizations, their targets, workers and assignments.
-- Every statement is idempotent (IF NOT EXISTS) so a re-run after a partial failure converges;
-- sqlx also runs each migration in one transaction.

DO $$
BEGIN
    IF current_setting('server_version_num')::int < 130000 THEN
        RAISE EXCEPTION 'palisade needs PostgreSQL 13 or newer (found %): upgrade the server, then re-run palisade migrate',
            current_setting('server_version');
    END IF;
END $$;

CREATE TABLE IF NOT EXISTS organizations (
    id UUID PRIMARY KEY,
    name TEXT NOT NULL,
    -- Scans admitted per rolling hour; NULL means no quota.
    hourly_scan_quota INTEGER NULL CHECK (hourly_scan_quota IS NULL OR hourly_scan_quota >= 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS targets (
    id UUID PRIMARY KEY,
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    locator TEXT NOT NULL CHECK (length(locator) BETWEEN 1 AND 512),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT targets_locator_unique UNIQUE (organization_id, locator)
);

CREATE TABLE IF NOT EXISTS workers (
    id UUID PRIMARY KEY,
    name TEXT NOT NULL,
    worker_type TEXT NOT NULL DEFAULT 'scanner',
    enabled BOOLEAN NOT NULL DEFAULT true,
    revoked_at TIMESTAMPTZ NULL,
    revocation_reason TEXT NOT NULL DEFAULT '',
    software_version TEXT NOT NULL DEFAULT '',
    protocol_version TEXT NOT NULL DEFAULT '',
    -- Last capability advertisement accepted at hello: plugin names and other capabilities.
    capabilities TEXT[] NOT NULL DEFAULT '{}',
    max_concurrent_tasks INTEGER NOT NULL DEFAULT 1,
    last_seen_at TIMESTAMPTZ NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT workers_type_check CHECK (worker_type IN ('scanner', 'ai')),
    CONSTRAINT workers_capacity_positive CHECK (max_concurrent_tasks > 0)
);

CREATE INDEX IF NOT EXISTS workers_last_seen_idx ON workers (last_seen_at DESC);

-- Many-to-many, soft-revoked so that history survives and acquisition can lock the row.
CREATE TABLE IF NOT EXISTS organization_workers (
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    worker_id UUID NOT NULL REFERENCES workers(id) ON DELETE CASCADE,
    enabled BOOLEAN NOT NULL DEFAULT true,
    assigned_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    revoked_at TIMESTAMPTZ NULL,
    revocation_reason TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (organization_id, worker_id)
);

CREATE INDEX IF NOT EXISTS organization_workers_worker_enabled_idx
    ON organization_workers (worker_id, organization_id)
    WHERE enabled AND revoked_at IS NULL;
