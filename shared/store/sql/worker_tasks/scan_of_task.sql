-- The scan a task belongs to, and the task's state.
-- $1: task_id
SELECT scan_id, state FROM worker_tasks WHERE id = $1
