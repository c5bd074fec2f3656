-- The scan a task belongs to and its organization (a cancel by task id cancels that scan).
-- $1 task_id: uuid
SELECT scan_id, organization_id FROM worker_tasks WHERE id = $1
