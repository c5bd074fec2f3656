-- Everything `/metrics` samples in one statement: due and waiting tasks and the oldest's age,
-- live leases and the stalest renewal, the outbox backlog, the newest completion's age and the
-- enrichment backlog (due age, running jobs and their stalest renewal), the active schedules and
-- the soonest next fire.
-- $1 worker_seen_within_seconds: float8
-- $2 pending_state: text — TaskState::Pending.as_str()
-- $3 retry_wait_state: text — TaskState::RetryWait.as_str()
-- $4 live_statuses: text[] — AttemptStatus::LIVE.map(AttemptStatus::as_str)
-- $5 completed_scan_state: text — ScanState::Completed.as_str()
-- $6 pending_enrichment_state: text — EnrichmentJobState::Pending.as_str()
-- $7 running_enrichment_state: text — EnrichmentJobState::Running.as_str()
WITH waiting AS (
    SELECT
        count(*) FILTER (WHERE state = $2 AND available_at <= now()) AS due_pending,
        count(*) FILTER (WHERE state = $3 AND available_at <= now()) AS due_retry_wait,
        count(*) FILTER (WHERE state = $3) AS retry_wait,
        min(available_at) FILTER (WHERE available_at <= now()) AS oldest_due
    FROM worker_tasks
    WHERE state IN ($2, $3)
),
live AS (
    SELECT count(*) AS n, min(coalesce(last_renewed_at, started_at)) AS stalest
    FROM worker_task_attempts
    WHERE status = ANY($4)
),
enrichment_pending AS (
    -- Each part reads one partial index of enrichment_jobs (`state IN (…)` would match
    -- neither and read the whole table): the backlog, not the history.
    SELECT count(*) AS n, min(available_at) FILTER (WHERE available_at <= now()) AS oldest_due
    FROM enrichment_jobs
    WHERE state = $6
),
enrichment_running AS (
    SELECT count(*) AS n, min(last_heartbeat_at) AS stalest
    FROM enrichment_jobs
    WHERE state = $7
),
outbox_backlog AS (
    SELECT count(*) AS n, min(created_at) AS oldest
    FROM outbox
    WHERE published_at IS NULL
)
SELECT
    waiting.due_pending AS tasks_due_pending,
    waiting.due_retry_wait AS tasks_due_retry_wait,
    waiting.retry_wait AS tasks_retry_wait,
    coalesce(extract(epoch FROM now() - waiting.oldest_due)::float8, 0) AS oldest_due_task_age_seconds,
    live.n AS live_attempts,
    greatest(coalesce(extract(epoch FROM now() - live.stalest)::float8, 0), 0) AS stalest_lease_age_seconds,
    outbox_backlog.n AS outbox_unpublished,
    coalesce(extract(epoch FROM now() - outbox_backlog.oldest)::float8, 0) AS outbox_oldest_age_seconds,
    (
        SELECT extract(epoch FROM now() - finished_at)::float8
        FROM scans
        WHERE state = $5 AND finished_at IS NOT NULL
        ORDER BY finished_at DESC
        LIMIT 1
    ) AS last_completed_scan_age_seconds,
    (
        SELECT count(*) FROM workers
        WHERE last_seen_at > now() - make_interval(secs => $1)
    ) AS workers_live,
    enrichment_pending.n AS enrichment_pending,
    coalesce(extract(epoch FROM now() - enrichment_pending.oldest_due)::float8, 0) AS enrichment_oldest_due_age_seconds,
    enrichment_running.n AS enrichment_running,
    greatest(coalesce(extract(epoch FROM now() - enrichment_running.stalest)::float8, 0), 0) AS enrichment_stalest_heartbeat_age_seconds,
    (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM worker_tasks_retries_seq) AS task_retries,
    (
        SELECT CASE WHEN is_called THEN last_value ELSE 0 END
        FROM worker_tasks_failed_terminal_seq
    ) AS tasks_failed_terminal,
    (SELECT count(*) FROM scan_schedules WHERE NOT paused) AS schedules_active,
    (
        SELECT extract(epoch FROM min(next_fire_at))::float8
        FROM scan_schedules
        WHERE NOT paused
    ) AS schedule_next_fire_timestamp_seconds
FROM waiting, live, outbox_backlog, enrichment_pending, enrichment_running
