-- Progress: completes scans whose last plugin completed, counting their findings, and creates
-- each one's enrichment job (born completed when no finding names a CVE).
-- $1 scan_ids: uuid[]
-- $2 job_ids: uuid[]
-- $3 completed_scan_state: text — ScanState::Completed.as_str()
-- $4 pending_state: text — EnrichmentJobState::Pending.as_str()
-- $5 completed_state: text — EnrichmentJobState::Completed.as_str()
WITH input AS (
    -- Each scan's findings are read once: their count, and whether any names a CVE.
    SELECT u.scan_id, u.job_id, f.findings, f.cves
    FROM UNNEST($1::uuid[], $2::uuid[]) AS u(scan_id, job_id)
    CROSS JOIN LATERAL (
        SELECT count(*) AS findings, coalesce(bool_or(cardinality(cve_ids) > 0), false) AS cves
        FROM findings WHERE findings.scan_id = u.scan_id
    ) f
), done AS (
    UPDATE scans s SET state = $3, finished_at = now(), updated_at = now(),
           finding_count = input.findings
    FROM input
    WHERE s.id = input.scan_id
    RETURNING s.id, s.organization_id, s.finding_count,
              (extract(epoch FROM s.finished_at) * 1000)::bigint AS completed_at_unix_ms,
              input.job_id, input.cves
), created AS (
    -- A scan without CVE findings has nothing to enrich: its job is born completed,
    -- so enrichment never spends a claim on it.
    INSERT INTO enrichment_jobs (id, scan_id, organization_id, state, checkpoint, finished_at)
    SELECT job_id, id, organization_id,
           CASE WHEN cves THEN $4 ELSE $5 END,
           CASE WHEN cves THEN '{}'::jsonb
                ELSE jsonb_build_object('cve_ids', '[]'::jsonb, 'source', 'none') END,
           CASE WHEN cves THEN NULL ELSE now() END
    FROM done
    ON CONFLICT (scan_id) DO NOTHING
    RETURNING id, scan_id
)
SELECT done.id AS scan_id, done.organization_id, done.finding_count, done.completed_at_unix_ms,
       coalesce(created.id, existing.id) AS enrichment_job_id
FROM done
LEFT JOIN created ON created.scan_id = done.id
LEFT JOIN enrichment_jobs existing ON existing.scan_id = done.id
