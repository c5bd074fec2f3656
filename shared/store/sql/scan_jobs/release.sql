-- Release: the scan job waits again.
-- $1: scan_job_id
-- $2: ScanJobState::Pending.as_str()
-- $3: ScanJobState::Running.as_str()
UPDATE scan_jobs SET state = $2, updated_at = now() WHERE id = $1 AND state = $3
