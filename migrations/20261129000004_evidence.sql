-- Evidence: assets (per organization, deduplicated), which scan saw them, and findings.

CREATE TABLE IF NOT EXISTS assets (
    id UUID PRIMARY KEY,
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    kind TEXT NOT NULL CHECK (length(kind) BETWEEN 1 AND 64),
    value TEXT NOT NULL CHECK (length(value) BETWEEN 1 AND 2048),
    first_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT assets_identity_unique UNIQUE (organization_id, kind, value)
);

-- Which scan (and which of its plugins) discovered an asset; later plugins of the scan get them.
CREATE TABLE IF NOT EXISTS scan_assets (
    scan_id UUID NOT NULL REFERENCES scans(id) ON DELETE CASCADE,
    asset_id UUID NOT NULL REFERENCES assets(id) ON DELETE CASCADE,
    scan_job_id UUID NOT NULL REFERENCES scan_jobs(id) ON DELETE CASCADE,
    attempt_id UUID NOT NULL,
    PRIMARY KEY (scan_id, asset_id)
);

CREATE TABLE IF NOT EXISTS findings (
    id UUID PRIMARY KEY,
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    scan_id UUID NOT NULL REFERENCES scans(id) ON DELETE CASCADE,
    scan_job_id UUID NOT NULL REFERENCES scan_jobs(id) ON DELETE CASCADE,
    -- The attempt that last wrote it; completion removes what superseded attempts left behind.
    attempt_id UUID NOT NULL,
    -- sha256 of plugin, rule, resource scope and discriminator: never presentation fields.
    finding_key TEXT NOT NULL,
    plugin TEXT NOT NULL,
    rule_id TEXT NOT NULL,
    resource TEXT NOT NULL,
    discriminator TEXT NOT NULL DEFAULT '',
    severity TEXT NOT NULL,
    title TEXT NOT NULL,
    description TEXT NOT NULL DEFAULT '',
    evidence TEXT NOT NULL DEFAULT '',
    cve_ids TEXT[] NOT NULL DEFAULT '{}',
    status TEXT NOT NULL DEFAULT 'open',
    status_reason TEXT NOT NULL DEFAULT '',
    revision INTEGER NOT NULL DEFAULT 1 CHECK (revision > 0),
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT findings_severity_check CHECK (severity IN ('info', 'low', 'medium', 'high', 'critical')),
    CONSTRAINT findings_status_check CHECK (
        status IN ('open', 'needs_review', 'gate_exempt', 'accepted_risk', 'ignore', 'false_positive', 'fixed')
    ),
    -- The five exclusion states need a reason.
    CONSTRAINT findings_exclusion_reason_check CHECK (
        status IN ('open', 'needs_review') OR length(btrim(status_reason)) > 0
    ),
    -- I7: one finding per (scan, finding_key).
    CONSTRAINT findings_key_unique UNIQUE (scan_id, finding_key)
);

CREATE INDEX IF NOT EXISTS findings_scan_job_idx ON findings (scan_job_id);
CREATE INDEX IF NOT EXISTS findings_cve_idx ON findings USING GIN (cve_ids) WHERE cardinality(cve_ids) > 0;
