-- One scan with its target, for `palisade scan show`. It started with its first attempt (no lease
-- writes the scan row; an older build stored `started_at`). Its trace id is the second field of
-- the W3C traceparent admission stored (none when admission ran without tracing).
-- $1 scan_id: uuid
SELECT s.id, s.organization_id, t.locator AS target, s.client_id, s.idempotency_key, s.plugins,
       s.state, s.failure_code, s.failure_reason, s.finding_count, s.created_at,
       coalesce(s.started_at, (SELECT min(a.started_at) FROM worker_tasks wt
                               JOIN worker_task_attempts a ON a.task_id = wt.id
                               WHERE wt.scan_id = s.id)) AS started_at,
       s.finished_at, NULLIF(split_part(s.trace_context, '-', 2), '') AS trace_id
FROM scans s JOIN targets t ON t.id = s.target_id WHERE s.id = $1
