-- Revocation: scan jobs of tasks returned to pending wait again.
-- $1: task_ids
-- $2: ScanJobState::Pending.as_str()
-- $3: ScanJobState::Running.as_str()
UPDATE scan_jobs SET state = $2, updated_at = now()
WHERE id IN (SELECT scan_job_id FROM worker_tasks WHERE id = ANY($1)) AND state = $3
