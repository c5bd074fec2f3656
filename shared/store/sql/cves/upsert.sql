-- Enrichment and `palisade cve import`: writes CVE records. A row is replaced only by a
-- record NVD modified later, or a known record replacing an unknown one; an unknown record
-- only refreshes when an unknown row was checked. So writing the same records again writes
-- nothing. With a job ($1, $2) the write is fenced: it happens only while that claim holds
-- the job, whose row stays locked FOR SHARE until commit (a newer claim waits for it, or it
-- sees the newer claim and writes nothing).
-- $1 job_id: uuid — NULL for an import
-- $2 fencing_token: int8
-- $3 running_state: text — EnrichmentJobState::Running.as_str()
-- $4 records: jsonb — a JSON array of objects with the columns below
-- $5 source: text — 'nvd' or 'import'
WITH holder AS (
    SELECT id FROM enrichment_jobs
    WHERE id = $1 AND fencing_token = $2 AND state = $3 AND lease_expires_at > now()
    FOR SHARE
), written AS (
    INSERT INTO cves AS c (id, known, published_at, last_modified_at, vuln_status, description,
        cvss_v31_score, cvss_v31_severity, cvss_v31_vector,
        cvss_v40_score, cvss_v40_severity, cvss_v40_vector,
        cwe_ids, reference_urls, source, checked_at)
    SELECT r.id, r.known, r.published_at, r.last_modified_at, r.vuln_status, r.description,
           r.cvss_v31_score, r.cvss_v31_severity, r.cvss_v31_vector,
           r.cvss_v40_score, r.cvss_v40_severity, r.cvss_v40_vector,
           r.cwe_ids, r.reference_urls, $5, now()
    FROM jsonb_to_recordset($4) AS r(id text, known boolean, published_at timestamptz,
        last_modified_at timestamptz, vuln_status text, description text,
        cvss_v31_score double precision, cvss_v31_severity text, cvss_v31_vector text,
        cvss_v40_score double precision, cvss_v40_severity text, cvss_v40_vector text,
        cwe_ids text[], reference_urls text[])
    WHERE $1::uuid IS NULL OR EXISTS (SELECT 1 FROM holder)
    ON CONFLICT (id) DO UPDATE SET
        known = EXCLUDED.known, published_at = EXCLUDED.published_at,
        last_modified_at = EXCLUDED.last_modified_at, vuln_status = EXCLUDED.vuln_status,
        description = EXCLUDED.description,
        cvss_v31_score = EXCLUDED.cvss_v31_score, cvss_v31_severity = EXCLUDED.cvss_v31_severity,
        cvss_v31_vector = EXCLUDED.cvss_v31_vector,
        cvss_v40_score = EXCLUDED.cvss_v40_score, cvss_v40_severity = EXCLUDED.cvss_v40_severity,
        cvss_v40_vector = EXCLUDED.cvss_v40_vector,
        cwe_ids = EXCLUDED.cwe_ids, reference_urls = EXCLUDED.reference_urls,
        source = EXCLUDED.source, checked_at = now()
    WHERE (EXCLUDED.known AND (NOT c.known OR c.last_modified_at IS NULL
                               OR EXCLUDED.last_modified_at > c.last_modified_at))
       OR (NOT EXCLUDED.known AND NOT c.known)
    RETURNING 1
)
SELECT ($1::uuid IS NULL OR EXISTS (SELECT 1 FROM holder)) AS holds,
       (SELECT count(*) FROM written) AS written
