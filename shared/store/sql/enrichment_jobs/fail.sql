-- Enrichment: one execution of a job failed, fenced: while the claim is still the holder's,
-- the job goes back to pending after $5 seconds ($4 true: retryable, executions left) or fails
-- for good; its last error is kept either way. No row means it lost the job and wrote nothing.
-- $1 job_id: uuid
-- $2 fencing_token: int8
-- $3 error: text
-- $4 retry: bool
-- $5 delay_seconds: float8
-- $6 pending_state: text — EnrichmentJobState::Pending.as_str()
-- $7 failed_state: text — EnrichmentJobState::Failed.as_str()
-- $8 running_state: text — EnrichmentJobState::Running.as_str()
UPDATE enrichment_jobs
SET state = CASE WHEN $4 THEN $6 ELSE $7 END,
    available_at = CASE WHEN $4 THEN now() + make_interval(secs => $5) ELSE available_at END,
    finished_at = CASE WHEN $4 THEN NULL ELSE now() END,
    last_error = $3, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
WHERE id = $1 AND fencing_token = $2 AND state = $8 AND lease_expires_at > now()
RETURNING id, scan_id, organization_id, attempt_count, state,
          (extract(epoch FROM now()) * 1000)::bigint AS finished_at_unix_ms
