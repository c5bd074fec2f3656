-- Enrichment: the job ($1, $2) takes the sync of source $4 when it is due (never synced, or
-- synced through more than $5 seconds ago) and no other running job with a live lease holds
-- it. Returns where the sync stands and the database's clock, the window's end; no row when
-- not taken (not due, another job syncs, or the claim was lost).
-- $1 job_id: uuid
-- $2 fencing_token: int8
-- $3 running_state: text — EnrichmentJobState::Running.as_str()
-- $4 source: text
-- $5 sync_interval_seconds: float8 — sync interval in seconds
WITH holder AS (
    SELECT id FROM enrichment_jobs
    WHERE id = $1 AND fencing_token = $2 AND state = $3 AND lease_expires_at > now()
    FOR SHARE
)
UPDATE cve_sync s
SET holder_job_id = $1, updated_at = now()
FROM holder
WHERE s.source = $4
  AND (s.synced_through IS NULL OR s.synced_through < now() - make_interval(secs => $5))
  AND (s.holder_job_id IS NULL OR s.holder_job_id = $1 OR NOT EXISTS (
        SELECT 1 FROM enrichment_jobs j
        WHERE j.id = s.holder_job_id AND j.state = $3 AND j.lease_expires_at > now()))
RETURNING s.synced_through, now() AS until
