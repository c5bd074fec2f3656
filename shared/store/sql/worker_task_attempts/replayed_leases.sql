-- Acquire, replayed: the leases an earlier acquire with this request id granted, in grant order.
-- Its columns are `lease::GrantedLease`'s, the same as `worker_tasks/grant.sql`'s.
-- $1: params.worker_id
-- $2: params.request_id
SELECT
    a.task_id, a.id AS attempt_id, a.attempt_number, a.lease_token, t.scan_id, t.scan_job_id,
    t.organization_id, coalesce(t.payload->>'plugin', '') AS plugin,
    coalesce(t.payload->>'target', '') AS target,
    coalesce((t.payload->>'position')::int, 0) AS position,
    greatest(0, (extract(epoch FROM a.lease_expires_at - now()) * 1000)::bigint) AS lease_expires_in_ms,
    t.execution_deadline_seconds,
    (SELECT s.trace_context FROM scans s WHERE s.id = t.scan_id) AS trace_context
FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
WHERE a.worker_id = $1 AND a.acquire_request_id = $2
ORDER BY a.created_at
