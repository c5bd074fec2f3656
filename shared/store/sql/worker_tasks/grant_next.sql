-- Leases handed with completions, in ingestion's transaction: for each (worker, request id) the
-- caller allows (the request id is the completed attempt's id), the pending task of that
-- attempt's scan, when the worker is enabled and not revoked, offers the plugin, serves the
-- scan's organization and has room. The workers are share-locked in id order, so a
-- revocation, or an acquire of the worker, waits until this commits (and counts the leases
-- handed on); the caller bounds the wait for a worker an acquire, a hello or a revocation holds
-- (`lock_timeout`, in a savepoint of its own). Room is counted under that lock, each worker's
-- asks granted in task order up to it. Each assignment is share-locked the same way. Each task
-- is leased and its attempt created under that request id, as `grant.sql` does for an acquire;
-- the worker is not marked seen (that needs its row locked for update, which two ingestion
-- transactions handing on to one worker would each wait for the other to give up; a worker
-- with a live lease counts as live anyway). Its columns are `lease::GrantedLease`'s.
-- $1 worker_ids: uuid[]
-- $2 request_ids: uuid[]
-- $3 lease_ttl_seconds: float8
-- $4 pending_state: text — TaskState::Pending.as_str()
-- $5 leased_state: text — TaskState::Leased.as_str()
-- $6 leased_status: text — AttemptStatus::Leased.as_str()
-- $7 live_statuses: text[] — LIVE_ATTEMPT_STATUSES
WITH locked_workers AS (
    SELECT w.id AS worker_id, w.capabilities,
           w.max_concurrent_tasks - (SELECT count(*) FROM worker_task_attempts a
                                     WHERE a.worker_id = w.id AND a.status = ANY($7)
                                       AND a.lease_expires_at > now()) AS free
    FROM workers w
    WHERE w.id = ANY($1) AND w.enabled AND w.revoked_at IS NULL
    ORDER BY w.id
    FOR SHARE OF w
),
asks AS (
    SELECT u.worker_id, u.request_id, done.scan_id
    FROM UNNEST($1::uuid[], $2::uuid[]) AS u(worker_id, request_id)
    JOIN worker_task_attempts ca ON ca.id = u.request_id AND ca.worker_id = u.worker_id
    JOIN worker_tasks done ON done.id = ca.task_id
),
assigned AS (
    SELECT o.worker_id, o.organization_id FROM organization_workers o
    WHERE o.worker_id = ANY($1) AND o.enabled AND o.revoked_at IS NULL
    ORDER BY o.worker_id, o.organization_id
    FOR SHARE
),
picked AS (
    SELECT t.id, asks.worker_id, asks.request_id
    FROM asks
    JOIN locked_workers w ON w.worker_id = asks.worker_id
    JOIN worker_tasks t ON t.scan_id = asks.scan_id
    WHERE t.state = $4
      AND t.available_at <= now()
      AND t.cancel_requested_at IS NULL
      AND t.attempt_count < t.max_attempts
      AND t.required_capabilities <@ w.capabilities
      AND EXISTS (SELECT 1 FROM assigned
                  WHERE assigned.worker_id = asks.worker_id
                    AND assigned.organization_id = t.organization_id)
    FOR UPDATE OF t SKIP LOCKED
),
fitting AS (
    SELECT ranked.id, ranked.worker_id, ranked.request_id
    FROM (SELECT picked.*, row_number() OVER (PARTITION BY picked.worker_id ORDER BY picked.id) AS n
          FROM picked) ranked
    JOIN locked_workers room ON room.worker_id = ranked.worker_id
    WHERE ranked.n <= room.free
),
leased AS (
    UPDATE worker_tasks t
    SET state = $5, attempt_count = t.attempt_count + 1,
        last_attempt_number = t.last_attempt_number + 1,
        current_attempt_id = gen_random_uuid(), updated_at = now()
    FROM fitting WHERE t.id = fitting.id
    RETURNING t.*, fitting.worker_id AS granted_to, fitting.request_id AS granted_for
),
a AS (
    INSERT INTO worker_task_attempts
        (id, task_id, worker_id, attempt_number, lease_token, acquire_request_id, status, lease_expires_at)
    SELECT l.current_attempt_id, l.id, l.granted_to, l.last_attempt_number,
           replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''),
           l.granted_for, $6, now() + make_interval(secs => $3)
    FROM leased l
    RETURNING *
)
SELECT
    a.task_id, a.id AS attempt_id, a.attempt_number, a.lease_token, t.scan_id, t.scan_job_id,
    t.organization_id, coalesce(t.payload->>'plugin', '') AS plugin,
    coalesce(t.payload->>'target', '') AS target,
    coalesce((t.payload->>'position')::int, 0) AS position,
    greatest(0, (extract(epoch FROM a.lease_expires_at - now()) * 1000)::bigint) AS lease_expires_in_ms,
    t.execution_deadline_seconds,
    (SELECT s.trace_context FROM scans s WHERE s.id = t.scan_id) AS trace_context,
    a.worker_id, a.acquire_request_id AS request_id
FROM a JOIN leased t ON t.id = a.task_id
ORDER BY t.priority DESC, t.created_at
