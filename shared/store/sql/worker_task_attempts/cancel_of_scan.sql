-- Cancel: ends the scan's live attempts (their writes are refused from now on).
-- $1 scan_id: uuid
-- $2 reason: text
-- $3 cancelled_status: text — AttemptStatus::Cancelled.as_str()
-- $4 live_statuses: text[] — AttemptStatus::LIVE.map(AttemptStatus::as_str)
UPDATE worker_task_attempts a
SET status = $3, finished_at = now(), updated_at = now(),
    error_code = 'cancel_requested', error_message = $2
FROM worker_tasks t
WHERE t.id = a.task_id AND t.scan_id = $1 AND a.status = ANY($4)
