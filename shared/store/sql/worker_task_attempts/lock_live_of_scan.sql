-- Cancel: locks the scan's live attempts (attempt, then task, then scan: the lock order of
-- ingestion).
-- $1 scan_id: uuid
-- $2 live_statuses: text[] — AttemptStatus::LIVE.map(AttemptStatus::as_str)
SELECT a.id FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
WHERE t.scan_id = $1 AND a.status = ANY($2)
ORDER BY a.id
FOR UPDATE OF a
