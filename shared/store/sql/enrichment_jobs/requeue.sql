-- Enrichment requests: a failed job back to pending with a fresh budget of executions,
-- keeping its checkpoint (the next execution resumes) and its last error (the record of why
-- it failed). No row when it is no longer failed: a concurrent request requeued it first.
-- $1 job_id: uuid
-- $2 pending_state: text — EnrichmentJobState::Pending.as_str()
-- $3 failed_state: text — EnrichmentJobState::Failed.as_str()
UPDATE enrichment_jobs
SET state = $2, attempt_count = 0, available_at = now(), finished_at = NULL, updated_at = now()
WHERE id = $1 AND state = $3
RETURNING id
