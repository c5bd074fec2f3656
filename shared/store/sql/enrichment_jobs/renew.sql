-- Enrichment: extends a job's lease, only while the claim is still the holder's (same
-- fencing token, running, lease not lapsed); no row means it lost the job.
-- $1 job_id: uuid
-- $2 fencing_token: int8
-- $3 lease_ttl_seconds: float8
-- $4 running_state: text — EnrichmentJobState::Running.as_str()
UPDATE enrichment_jobs
SET lease_expires_at = now() + make_interval(secs => $3), last_heartbeat_at = now(),
    updated_at = now()
WHERE id = $1 AND fencing_token = $2 AND state = $4 AND lease_expires_at > now()
RETURNING id
