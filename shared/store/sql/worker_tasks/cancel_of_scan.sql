-- Cancel: ends every task of the scan that has not ended.
-- $1 scan_id: uuid
-- $2 reason: text
-- $3 cancelled_state: text — TaskState::Cancelled.as_str()
-- $4 failure_code: text — CANCELLED, the failure code of everything a cancel ends
-- $5 terminal_states: text[] — TaskState::TERMINAL.map(TaskState::as_str)
UPDATE worker_tasks
SET state = $3, cancel_requested_at = now(), completed_at = now(), updated_at = now(),
    last_error_code = $4, last_error = $2
WHERE scan_id = $1 AND state <> ALL($5)
