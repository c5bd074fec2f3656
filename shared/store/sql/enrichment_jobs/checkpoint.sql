-- Enrichment: records a job's progress, fenced like every write of the job: only while the
-- claim is still the holder's; no row means it lost the job and wrote nothing.
-- $1 job_id: uuid
-- $2 fencing_token: int8
-- $3 checkpoint: jsonb
-- $4 running_state: text — EnrichmentJobState::Running.as_str()
UPDATE enrichment_jobs
SET checkpoint = $3, last_heartbeat_at = now(), updated_at = now()
WHERE id = $1 AND fencing_token = $2 AND state = $4 AND lease_expires_at > now()
RETURNING id
