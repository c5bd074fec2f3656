-- Reaper: returns each locked expired job to pending after its delay ($2 true) or fails it
-- for good (its executions are spent), recording why; set-wise.
-- $1 ids: uuid[]
-- $2 retries: bool[]
-- $3 delay_seconds: float8[]
-- $4 error: text
-- $5 pending_state: text — EnrichmentJobState::Pending.as_str()
-- $6 failed_state: text — EnrichmentJobState::Failed.as_str()
UPDATE enrichment_jobs j
SET state = CASE WHEN r.retry THEN $5 ELSE $6 END,
    available_at = CASE WHEN r.retry THEN now() + make_interval(secs => r.delay) ELSE j.available_at END,
    finished_at = CASE WHEN r.retry THEN NULL ELSE now() END,
    last_error = $4, lease_owner = NULL, lease_expires_at = NULL, updated_at = now()
FROM UNNEST($1::uuid[], $2::bool[], $3::float8[]) AS r(id, retry, delay)
WHERE j.id = r.id
RETURNING j.id, j.scan_id, j.organization_id, j.attempt_count, j.state,
          (extract(epoch FROM now()) * 1000)::bigint AS finished_at_unix_ms
