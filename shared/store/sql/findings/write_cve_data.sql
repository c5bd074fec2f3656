-- Enrichment: writes, fenced, each CVE finding of the job's scan its CVE data from the CVE
-- table, one entry per CVE id in the finding's order: `known` with NVD's data, `unknown` (NVD
-- has no such CVE) or `missing` (the table has nothing on it). A finding whose data is
-- unchanged is not written, so enriching again writes nothing. The job's row stays locked
-- FOR SHARE until commit: a newer claim waits for it, or it sees the newer claim and writes
-- nothing (`holds` false).
-- $1 job_id: uuid
-- $2 fencing_token: int8
-- $3 running_state: text — EnrichmentJobState::Running.as_str()
WITH holder AS (
    SELECT scan_id FROM enrichment_jobs
    WHERE id = $1 AND fencing_token = $2 AND state = $3 AND lease_expires_at > now()
    FOR SHARE
), data AS (
    SELECT f.id, jsonb_agg(
        CASE
            WHEN v.id IS NULL THEN jsonb_build_object('id', wanted.id, 'status', 'missing')
            WHEN NOT v.known THEN jsonb_build_object('id', wanted.id, 'status', 'unknown')
            ELSE jsonb_strip_nulls(jsonb_build_object(
                'id', wanted.id,
                'status', 'known',
                'published', to_char(v.published_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                'last_modified', to_char(v.last_modified_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.MS"Z"'),
                'vuln_status', v.vuln_status,
                'description', v.description,
                'cvss_v31', CASE WHEN v.cvss_v31_score IS NOT NULL THEN jsonb_build_object(
                    'score', v.cvss_v31_score, 'severity', v.cvss_v31_severity,
                    'vector', v.cvss_v31_vector) END,
                'cvss_v40', CASE WHEN v.cvss_v40_score IS NOT NULL THEN jsonb_build_object(
                    'score', v.cvss_v40_score, 'severity', v.cvss_v40_severity,
                    'vector', v.cvss_v40_vector) END,
                'cwe_ids', to_jsonb(v.cwe_ids),
                'references', to_jsonb(v.reference_urls)))
        END ORDER BY wanted.ordinal) AS cve_data
    FROM holder h
    JOIN findings f ON f.scan_id = h.scan_id AND cardinality(f.cve_ids) > 0
    CROSS JOIN LATERAL unnest(f.cve_ids) WITH ORDINALITY AS wanted(id, ordinal)
    LEFT JOIN cves v ON v.id = wanted.id
    GROUP BY f.id
), written AS (
    UPDATE findings f SET cve_data = d.cve_data, updated_at = now()
    FROM data d
    WHERE f.id = d.id AND f.cve_data IS DISTINCT FROM d.cve_data
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM holder) AS holds,
       (SELECT count(*) FROM data) AS findings,
       (SELECT count(*) FROM written) AS written
