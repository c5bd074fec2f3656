-- CVE data (issue 11): the local CVE table enrichment reads, kept by an incremental sync from
-- the NVD CVE API 2.0 or filled offline by `palisade cve import`; the sync's watermark; and,
-- per finding, the CVE data its enrichment wrote.

CREATE TABLE IF NOT EXISTS cves (
    -- As messages::validate::is_cve_id checks it.
    id TEXT PRIMARY KEY,
    -- false: NVD answered that it has no such CVE (looked up at checked_at).
    known BOOLEAN NOT NULL,
    published_at TIMESTAMPTZ NULL,
    last_modified_at TIMESTAMPTZ NULL,
    vuln_status TEXT NOT NULL DEFAULT '',
    -- The English description.
    description TEXT NOT NULL DEFAULT '',
    cvss_v31_score DOUBLE PRECISION NULL CHECK (cvss_v31_score BETWEEN 0 AND 10),
    cvss_v31_severity TEXT NULL,
    cvss_v31_vector TEXT NULL,
    cvss_v40_score DOUBLE PRECISION NULL CHECK (cvss_v40_score BETWEEN 0 AND 10),
    cvss_v40_severity TEXT NULL,
    cvss_v40_vector TEXT NULL,
    cwe_ids TEXT[] NOT NULL DEFAULT '{}',
    -- At most store::cves::MAX_REFERENCES of NVD's references, in its order.
    reference_urls TEXT[] NOT NULL DEFAULT '{}',
    -- Where the row came from: the NVD API or an imported file.
    source TEXT NOT NULL,
    checked_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    CONSTRAINT cves_id_format CHECK (id ~ '^CVE-[0-9]{4}-[0-9]{4,7}$'),
    CONSTRAINT cves_source_check CHECK (source IN ('nvd', 'import')),
    CONSTRAINT cves_bounded_references CHECK (cardinality(reference_urls) <= 32)
);

-- One row per source kept by an incremental sync.
CREATE TABLE IF NOT EXISTS cve_sync (
    source TEXT PRIMARY KEY,
    -- Every CVE the source modified before this instant is in `cves` (NULL: never synced).
    synced_through TIMESTAMPTZ NULL,
    -- The enrichment job syncing now; while it is running with a live lease no other job syncs.
    holder_job_id UUID NULL REFERENCES enrichment_jobs(id) ON DELETE SET NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);

-- What enrichment wrote for the finding: one entry per CVE id, in the finding's order (NULL:
-- not enriched).
ALTER TABLE findings ADD COLUMN IF NOT EXISTS cve_data JSONB NULL;

-- The NVD API's sync row: never synced until its first job sets the watermark.
INSERT INTO cve_sync (source) VALUES ('nvd') ON CONFLICT (source) DO NOTHING;
