-- `palisade scan gate`: a scan's state, its collection revision, its plugins and how many
-- completed with their evidence published, and its findings counted by (status, severity), in
-- one snapshot. No row: no such scan.
-- $1 scan_id: uuid
-- $2 organization_id: uuid — NULL: any
-- $3 completed_job_state: text — ScanJobState::Completed.as_str()
SELECT s.state, s.findings_revision,
       (SELECT count(*) FROM scan_jobs j WHERE j.scan_id = s.id) AS plugins,
       (SELECT count(*) FROM scan_jobs j
        WHERE j.scan_id = s.id AND j.state = $3 AND j.evidence_published_at IS NOT NULL)
           AS plugins_complete,
       coalesce((SELECT jsonb_agg(jsonb_build_array(c.status, c.severity, c.n))
                 FROM (SELECT f.status, f.severity, count(*) AS n FROM findings f
                       WHERE f.scan_id = s.id GROUP BY f.status, f.severity) c), '[]') AS counts
FROM scans s
WHERE s.id = $1 AND ($2::uuid IS NULL OR s.organization_id = $2)
