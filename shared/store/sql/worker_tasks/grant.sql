-- Acquire: one statement locks the worker's assignments (FOR SHARE), picks due tasks it may take
-- (SKIP LOCKED), leases them, creates their attempts and marks the worker seen. Their scan jobs
-- and scans are not written: a lease is the attempt row, and `running` is read from it (see
-- `states::ScanState::reported`). It grants nothing under a request id that already has attempts: a
-- worker that asked again with the same request id while its first ask was being granted waited
-- for that grant's commit on the worker row, read before the wait that nothing was granted, and
-- sees the grant only here (the replay answers it on its next look).
-- It grants at most the worker's free slots counted here, not the count `workers/for_acquire.sql`
-- read: that statement's snapshot predates its wait for the worker row, so an acquire that waited
-- for another acquire of the same worker would count without the leases that one granted. This
-- statement starts with the worker row locked, so it sees every committed lease.
-- A task whose attempts are spent is never leased (the reaper fails it, `claim_stranded.sql`).
-- Its columns are `lease::GrantedLease`'s, the same as
-- `worker_task_attempts/replayed_leases.sql`'s and `grant_next.sql`'s.
-- $1 worker_id: uuid
-- $2 capabilities: text[]
-- $3 free: int8
-- $4 request_id: uuid
-- $5 lease_ttl_seconds: float8
-- $6 grantable_states: text[] — [TaskState::Pending.as_str(), TaskState::RetryWait.as_str()]
-- $7 leased_state: text — TaskState::Leased.as_str()
-- $8 leased_status: text — AttemptStatus::Leased.as_str()
-- $9 live_statuses: text[] — LIVE_ATTEMPT_STATUSES
-- $10 leased_states: text[] — TaskState::LEASED (the states of a task in flight)
WITH room AS (
    SELECT least($3::bigint, greatest(0, w.max_concurrent_tasks - (
               SELECT count(*) FROM worker_task_attempts a
               WHERE a.worker_id = w.id AND a.status = ANY($9) AND a.lease_expires_at > now()))) AS free
    FROM workers w WHERE w.id = $1
),
assigned AS (
    SELECT organization_id FROM organization_workers
    WHERE worker_id = $1 AND enabled AND revoked_at IS NULL
      AND NOT EXISTS (SELECT 1 FROM worker_task_attempts a
                      WHERE a.worker_id = $1 AND a.acquire_request_id = $4)
    ORDER BY organization_id
    FOR SHARE
),
in_flight AS (
    -- The worker's live leases by organization (at most its capacity of rows).
    SELECT t.organization_id, count(*) AS n
    FROM worker_task_attempts a
    JOIN worker_tasks t ON t.id = a.task_id
    WHERE a.worker_id = $1 AND a.status = ANY($9) AND a.lease_expires_at > now()
    GROUP BY t.organization_id
),
picked AS (
    -- Each organization's first due tasks in priority order, read in that order from
    -- `worker_tasks_due_by_org_idx` and locked as they are read, then the first of all of
    -- them: an acquire reads about as many tasks as it grants, whatever the backlog. With
    -- several organizations, a task locked here but not granted is skipped by other acquires
    -- until this transaction ends.
    -- Fair between the organizations the worker serves: each task's turn is its
    -- organization's live leases on this worker plus its rank among the organization's due
    -- tasks, and the lowest turns are granted first, so the organization with fewer tasks in
    -- flight here goes first and one organization's burst cannot hold every slot of a worker
    -- while another's tasks wait. Priority and age order each organization's own tasks.
    -- An organization with a cap on tasks in flight (`max_running_tasks`, its row locked by
    -- the acquire before this statement) is granted at most what is left under it; its tasks
    -- leased or running are counted only then (`worker_tasks_org_state_idx`).
    SELECT due.id FROM assigned
    CROSS JOIN LATERAL (
        SELECT coalesce((SELECT n FROM in_flight f
                         WHERE f.organization_id = assigned.organization_id), 0) AS n
    ) busy
    CROSS JOIN LATERAL (
        SELECT CASE WHEN o.max_running_tasks IS NULL THEN coalesce((SELECT free FROM room), 0)
                    ELSE least(coalesce((SELECT free FROM room), 0), greatest(0,
                             o.max_running_tasks - (SELECT count(*) FROM worker_tasks r
                                                    WHERE r.organization_id = o.id
                                                      AND r.state = ANY($10))))
               END AS n
        FROM organizations o WHERE o.id = assigned.organization_id
    ) cap
    CROSS JOIN LATERAL (
        SELECT locked.id, locked.priority, locked.available_at, locked.created_at,
               busy.n + row_number() OVER (
                   ORDER BY locked.priority DESC, locked.available_at, locked.created_at
               ) AS turn
        FROM (
            SELECT t.id, t.priority, t.available_at, t.created_at FROM worker_tasks t
            WHERE t.organization_id = assigned.organization_id
              AND t.state = ANY($6)
              AND t.available_at <= now()
              AND t.cancel_requested_at IS NULL
              AND t.attempt_count < t.max_attempts
              AND t.required_capabilities <@ $2
            ORDER BY t.priority DESC, t.available_at, t.created_at
            LIMIT cap.n
            FOR UPDATE SKIP LOCKED
        ) locked
    ) due
    ORDER BY due.turn, due.priority DESC, due.available_at, due.created_at
    LIMIT coalesce((SELECT free FROM room), 0)
),
leased AS (
    UPDATE worker_tasks t
    SET state = $7, attempt_count = t.attempt_count + 1,
        last_attempt_number = t.last_attempt_number + 1,
        current_attempt_id = gen_random_uuid(), updated_at = now()
    FROM picked WHERE t.id = picked.id
    RETURNING t.*
),
a AS (
    INSERT INTO worker_task_attempts
        (id, task_id, worker_id, attempt_number, lease_token, acquire_request_id, status, lease_expires_at)
    SELECT l.current_attempt_id, l.id, $1, l.last_attempt_number,
           replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''),
           $4, $8, now() + make_interval(secs => $5)
    FROM leased l
    RETURNING *
),
seen AS (
    UPDATE workers SET last_seen_at = now() WHERE id = $1
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
