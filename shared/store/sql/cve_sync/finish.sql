-- Enrichment: the job ($1, $2) synced source $4 through $5: the watermark moves there (never
-- back) and the job lets the sync go; fenced, so a lost claim moves nothing. Returns the
-- watermark; no row when the claim was lost.
-- $1 job_id: uuid
-- $2 fencing_token: int8
-- $3 running_state: text — EnrichmentJobState::Running.as_str()
-- $4 source: text
-- $5 synced_through: timestamptz
WITH holder AS (
    SELECT id FROM enrichment_jobs
    WHERE id = $1 AND fencing_token = $2 AND state = $3 AND lease_expires_at > now()
    FOR SHARE
)
UPDATE cve_sync s
SET synced_through = GREATEST(s.synced_through, $5),
    holder_job_id = CASE WHEN s.holder_job_id = $1 THEN NULL ELSE s.holder_job_id END,
    updated_at = now()
FROM holder
WHERE s.source = $4
RETURNING s.synced_through
