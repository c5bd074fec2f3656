-- Acquire, and leases handed with completions, replayed: the leases earlier grants under each
-- (worker, request id) made, in grant order. Its columns are `lease::GrantedLease`'s, the same
-- as `worker_tasks/grant.sql`'s.
-- $1 worker_ids: uuid[]
-- $2 request_ids: uuid[]
SELECT
    a.task_id, a.id AS attempt_id, a.attempt_number, a.lease_token, t.scan_id, t.scan_job_id,
    t.organization_id, coalesce(t.payload->>'plugin', '') AS plugin,
    coalesce(t.payload->>'target', '') AS target,
    coalesce((t.payload->>'position')::int, 0) AS position,
    greatest(0, (extract(epoch FROM a.lease_expires_at - now()) * 1000)::bigint) AS lease_expires_in_ms,
    t.execution_deadline_seconds,
    (SELECT s.trace_context FROM scans s WHERE s.id = t.scan_id) AS trace_context,
    a.worker_id, a.acquire_request_id AS request_id
FROM UNNEST($1::uuid[], $2::uuid[]) AS u(worker_id, request_id)
JOIN worker_task_attempts a ON a.worker_id = u.worker_id AND a.acquire_request_id = u.request_id
JOIN worker_tasks t ON t.id = a.task_id
ORDER BY a.created_at
