-- Cancel: ends the scan's plugin runs that have not ended.
-- $1 scan_id: uuid
-- $2 reason: text
-- $3 cancelled_job_state: text — ScanJobState::Cancelled.as_str()
-- $4 failure_code: text — CANCELLED, the failure code of everything a cancel ends
-- $5 cancellable_job_states: text[] — [ScanJobState::Pending.as_str(), ScanJobState::Running.as_str()]
UPDATE scan_jobs SET state = $3, finished_at = now(), updated_at = now(),
       error_code = $4, error_message = $2
WHERE scan_id = $1 AND state = ANY($5)
