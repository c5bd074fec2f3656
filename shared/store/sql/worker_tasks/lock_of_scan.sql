-- Cancel: locks the scan's tasks, in id order.
-- $1 scan_id: uuid
SELECT id FROM worker_tasks WHERE scan_id = $1 ORDER BY id FOR UPDATE
