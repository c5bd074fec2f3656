-- Enrichment requests: the job of a completed scan that has none (a row removed by an
-- operator, or data restored from before it was written): pending when a finding of the scan
-- names a CVE, else recorded as completed (nothing to enrich). No row when a concurrent
-- request created it first.
-- $1 job_id: uuid
-- $2 scan_id: uuid
-- $3 pending_state: text — EnrichmentJobState::Pending.as_str()
-- $4 completed_state: text — EnrichmentJobState::Completed.as_str()
INSERT INTO enrichment_jobs (id, scan_id, organization_id, state, checkpoint, finished_at)
SELECT $1, s.id, s.organization_id,
       CASE WHEN c.cves THEN $3 ELSE $4 END,
       CASE WHEN c.cves THEN '{}'::jsonb
            ELSE jsonb_build_object('cve_ids', '[]'::jsonb, 'source', 'none') END,
       CASE WHEN c.cves THEN NULL ELSE now() END
FROM scans s
CROSS JOIN LATERAL (
    SELECT EXISTS (SELECT 1 FROM findings f WHERE f.scan_id = s.id AND cardinality(f.cve_ids) > 0) AS cves
) c
WHERE s.id = $2
ON CONFLICT (scan_id) DO NOTHING
RETURNING state
