-- A scan's plugin runs with their tasks, in plugin order, for `palisade scan show`.
-- $1 scan_id: uuid
SELECT t.id AS task_id, j.position, j.plugin, j.state, t.state AS task_state, t.attempt_count, j.finding_count,
       j.asset_count, j.error_code, j.error_message
FROM scan_jobs j LEFT JOIN worker_tasks t ON t.scan_job_id = j.id
WHERE j.scan_id = $1 ORDER BY j.position
