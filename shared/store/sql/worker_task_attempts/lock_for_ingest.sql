-- Ingestion (set-wise): locks every attempt and task the batch names, in task order, and reads
-- their scan jobs.
-- $1 attempt_ids: uuid[]
SELECT a.id AS attempt_id, a.task_id AS attempt_task_id,
       a.attempt_number, a.lease_token, a.status AS attempt_status, a.worker_id,
       a.lease_expires_at > now() AS lease_live,
       t.state AS task_state, t.current_attempt_id, t.organization_id, t.scan_id,
       t.scan_job_id, t.attempt_count, t.max_attempts,
       t.cancel_requested_at IS NOT NULL AS cancel_requested,
       coalesce(t.payload->>'plugin', '') AS plugin,
       j.position, j.evidence_published_at IS NOT NULL AS evidence_published
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id
LEFT JOIN scan_jobs j ON j.id = t.scan_job_id
WHERE a.id = ANY($1)
ORDER BY t.id, a.id
FOR UPDATE OF a, t
