-- Issue 47: coverage. What a plugin checked, per rule and resource, found or not: its
-- evaluations, written by ingestion in the same fenced transaction as the findings of the batch
-- that carried them (upserted by key; what a superseded attempt of the scan job wrote is deleted
-- when a later attempt completes, as for findings).
--
-- Not marked backward compatible: a build before it drops the evaluations of the batches it
-- decodes, and its completions keep what a superseded attempt evaluated; during a rolling
-- upgrade that could leave a superseded attempt's pass standing. Older builds stop at start-up
-- against this schema (docs/deploy.md "Upgrading to coverage").
CREATE TABLE IF NOT EXISTS evaluations (
    id UUID PRIMARY KEY,
    organization_id UUID NOT NULL REFERENCES organizations(id) ON DELETE CASCADE,
    scan_id UUID NOT NULL REFERENCES scans(id) ON DELETE CASCADE,
    scan_job_id UUID NOT NULL REFERENCES scan_jobs(id) ON DELETE CASCADE,
    -- The attempt that last wrote it; completion removes what superseded attempts left behind.
    attempt_id UUID NOT NULL,
    -- sha256 of plugin, rule and resource as the worker sent them (`evidence::evaluation_key`).
    evaluation_key TEXT NOT NULL,
    plugin TEXT NOT NULL,
    rule_id TEXT NOT NULL,
    -- Redacted, as asset values are: required pairs are matched on it.
    resource TEXT NOT NULL,
    status TEXT NOT NULL,
    reason_code TEXT NOT NULL DEFAULT '',
    evidence TEXT NOT NULL DEFAULT '',
    -- For a failure: the key of the finding it produced (findings.finding_key, same scan).
    finding_key TEXT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT evaluations_status_check CHECK (status IN ('pass', 'fail', 'error', 'not_applicable')),
    -- An error or a not-applicable says why.
    CONSTRAINT evaluations_reason_check CHECK (status IN ('pass', 'fail') OR reason_code <> ''),
    -- A failure names its finding; nothing else does.
    CONSTRAINT evaluations_finding_check CHECK ((status = 'fail') = (finding_key IS NOT NULL)),
    -- I16: one evaluation per (scan, plugin, rule, resource).
    CONSTRAINT evaluations_key_unique UNIQUE (scan_id, evaluation_key)
);

CREATE INDEX IF NOT EXISTS evaluations_scan_job_idx ON evaluations (scan_job_id);

-- What a worker's plugins check, as its last hello declared it: {plugin: [{"rule": …,
-- "kinds": […]}, …]} (`store::coverage::DeclaredRules`).
ALTER TABLE workers ADD COLUMN IF NOT EXISTS declared_rules JSONB NOT NULL DEFAULT '{}';

-- The rules a completed scan job requires evaluations of: its plugin's declaration by the
-- worker whose attempt completed it, copied at completion. NULL until then (and for a job
-- completed by a build before coverage: its coverage reads unknown).
ALTER TABLE scan_jobs ADD COLUMN IF NOT EXISTS required_rules JSONB NULL;
