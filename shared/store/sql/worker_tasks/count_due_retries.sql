-- Reaper: whether tasks in retry_wait are due (a hint for dispatch).
-- $1 retry_wait_state: text — TaskState::RetryWait.as_str()
SELECT count(*) FROM (SELECT 1 FROM worker_tasks WHERE state = $1 AND available_at <= now() LIMIT 1000) due
