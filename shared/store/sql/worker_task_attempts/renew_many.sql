-- Renews many claims in one statement. Every named attempt of its named task is locked with
-- its task in task order (`locked`; the order ingestion locks in, so a batch of renewals
-- never deadlocks with a batch of results), and the fence is read from those locked, latest
-- rows: the claimant's worker, number and token, the attempt live and unexpired by the
-- database clock, the task's current attempt, the task leased or running without a cancel
-- requested. The refusal's reason comes from the same statement: a left join of every claim
-- to its lock and, for a claim naming no attempt of that task, to the task it names.
-- $1 attempt_ids: uuid[]
-- $2 task_ids: uuid[]
-- $3 worker_ids: uuid[]
-- $4 attempt_numbers: int4[]
-- $5 lease_tokens: text[]
-- $6 lease_ttl_seconds: float8
-- $7 live_statuses: text[] — AttemptStatus::LIVE.map(AttemptStatus::as_str)
-- $8 leased_states: text[] — TaskState::LEASED.map(TaskState::as_str)
-- $9 cancel_states: text[] — [TaskState::Cancelling.as_str(), TaskState::Cancelled.as_str()]
-- $10 running_status: text — AttemptStatus::Running.as_str()
-- $11 running_state: text — TaskState::Running.as_str()
-- $12 leased_state: text — TaskState::Leased.as_str()
WITH claim AS (
    SELECT * FROM unnest($1::uuid[], $2::uuid[], $3::uuid[], $4::int[], $5::text[])
        WITH ORDINALITY AS c(attempt_id, task_id, worker_id, attempt_number, lease_token, ordinal)
),
locked AS MATERIALIZED (
    SELECT c.ordinal, a.id AS attempt_id,
           a.worker_id = c.worker_id AND a.attempt_number = c.attempt_number
               AND a.lease_token = c.lease_token AND a.status = ANY($7)
               AND a.lease_expires_at > now() AND t.current_attempt_id = a.id
               AND t.state = ANY($8) AND t.cancel_requested_at IS NULL AS holds,
           t.cancel_requested_at IS NOT NULL OR t.state = ANY($9) AS cancel_requested
    FROM claim c
    JOIN worker_task_attempts a ON a.id = c.attempt_id AND a.task_id = c.task_id
    JOIN worker_tasks t ON t.id = a.task_id
    ORDER BY t.id, a.id
    FOR NO KEY UPDATE OF a, t
),
renewed AS (
    UPDATE worker_task_attempts a
    SET lease_expires_at = now() + make_interval(secs => $6), last_renewed_at = now(),
        status = $10, updated_at = now()
    FROM locked l
    WHERE a.id = l.attempt_id AND l.holds
    RETURNING l.ordinal, a.task_id, a.lease_expires_at
),
started AS (
    UPDATE worker_tasks t SET state = $11, updated_at = now()
    FROM renewed r WHERE t.id = r.task_id AND t.state = $12
)
SELECT c.ordinal,
       (extract(epoch FROM r.lease_expires_at - now()) * 1000)::bigint AS lease_expires_in_ms,
       coalesce(l.cancel_requested,
                t.cancel_requested_at IS NOT NULL OR t.state = ANY($9),
                false) AS cancel_requested
FROM claim c
LEFT JOIN renewed r ON r.ordinal = c.ordinal
LEFT JOIN locked l ON l.ordinal = c.ordinal
LEFT JOIN worker_tasks t ON t.id = c.task_id
ORDER BY c.ordinal
