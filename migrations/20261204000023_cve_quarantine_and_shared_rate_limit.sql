-- Issue 26, item 1: upstream CVE records palisade could not keep as served are quarantined
-- instead of failing the page, and the NVD API's rate limit is one window shared by every
-- enrichment replica, kept across restarts.

-- CVE records the sync, a lookup or `palisade cve import` stored sanitised (a NUL removed, a
-- date PostgreSQL cannot hold dropped) or set aside (unreadable), one row per record: the
-- record's CVE id, or for a record without a readable one `sha256:` and the hash of its JSON.
CREATE TABLE IF NOT EXISTS cve_quarantine (
    record_key TEXT PRIMARY KEY,
    cve_id TEXT NULL,
    -- store::cves::QuarantineAction
    action TEXT NOT NULL,
    -- What was wrong with it, in words.
    reason TEXT NOT NULL,
    -- Where it was last seen: the NVD API or an imported file.
    source TEXT NOT NULL,
    first_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    last_seen_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    times_seen BIGINT NOT NULL DEFAULT 1,
    CONSTRAINT cve_quarantine_action_check CHECK (action IN ('sanitised', 'set_aside')),
    CONSTRAINT cve_quarantine_source_check CHECK (source IN ('nvd', 'import'))
);

CREATE INDEX IF NOT EXISTS cve_quarantine_recent_idx ON cve_quarantine (last_seen_at DESC);
-- Enrichment's misses skip ids set aside lately.
CREATE INDEX IF NOT EXISTS cve_quarantine_cve_id_idx ON cve_quarantine (cve_id);

-- Rolling-window rate limits shared by every process: the instants (the database's clock) the
-- requests of the current window started, oldest first. One row per limited upstream.
CREATE TABLE IF NOT EXISTS rate_limits (
    name TEXT PRIMARY KEY,
    starts TIMESTAMPTZ[] NOT NULL DEFAULT '{}'
);

INSERT INTO rate_limits (name) VALUES ('nvd') ON CONFLICT (name) DO NOTHING;

-- Older builds neither read nor write either table (their limiter stays per process).
INSERT INTO backward_compatible_migrations (version, reason)
VALUES (20261204000023, 'adds two tables older builds neither read nor write')
ON CONFLICT (version) DO NOTHING;
