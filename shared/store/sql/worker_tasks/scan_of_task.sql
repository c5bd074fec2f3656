-- The scan a task belongs to, the task's state and its organization.
-- $1: task_id
SELECT scan_id, state, organization_id FROM worker_tasks WHERE id = $1
