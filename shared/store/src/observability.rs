//! The aggregates behind `/metrics`: one statement, one round trip, every part served by a
//! partial or ordered index so its cost follows the size of the backlog it measures, not of
//! the tables, or read from a counter sequence at a fixed cost. `runtime` caches the answer,
//! so a scrape storm costs one query per refresh.

use std::time::Duration;

use sqlx::PgPool;

use crate::StoreError;
use crate::states::{AttemptStatus, EnrichmentJobState, ScanState, TaskState};

/// The database's view of the system at one instant.
#[derive(Debug, Clone, Default, PartialEq, sqlx::FromRow)]
pub struct Snapshot {
    /// `pending` tasks whose `available_at` has passed (`worker_tasks_due_idx`).
    pub tasks_due_pending: i64,
    /// `retry_wait` tasks whose backoff has passed (`worker_tasks_due_idx`).
    pub tasks_due_retry_wait: i64,
    /// Every `retry_wait` task, due or still backing off (`worker_tasks_due_idx`).
    pub tasks_retry_wait: i64,
    /// Seconds since the oldest due task became due; 0 when none is due.
    pub oldest_due_task_age_seconds: f64,
    /// Attempts in `leased` or `running` (`worker_task_attempts_live_expiry_idx`).
    pub live_attempts: i64,
    /// Seconds since the stalest live lease was renewed (or started, if never renewed);
    /// 0 when no attempt is live. Grows while a killed worker's lease awaits the reaper.
    pub stalest_lease_age_seconds: f64,
    /// Outbox rows not yet published (`outbox_unpublished_idx`).
    pub outbox_unpublished: i64,
    /// Seconds since the oldest unpublished outbox row was written; 0 when none.
    pub outbox_oldest_age_seconds: f64,
    /// Seconds since the newest completed scan finished (`scans_finished_idx`); `None` before
    /// the first.
    pub last_completed_scan_age_seconds: Option<f64>,
    /// Workers seen within the window passed to [`snapshot`] (`workers_last_seen_idx`).
    pub workers_live: i64,
    /// Enrichment jobs in `pending` (`enrichment_jobs_due_idx`).
    pub enrichment_pending: i64,
    /// Times a task entered `retry_wait` since the counters' migration
    /// (`worker_tasks_retries_seq`); may over-count, never decreases.
    pub task_retries: i64,
    /// Tasks that entered `failed_terminal` since the counters' migration
    /// (`worker_tasks_failed_terminal_seq`); may over-count, never decreases.
    pub tasks_failed_terminal: i64,
}

/// Reads every aggregate in one statement. `worker_seen_within` is how recent a worker's
/// `last_seen_at` must be for it to count as live (two lease TTLs).
pub async fn snapshot(pool: &PgPool, worker_seen_within: Duration) -> Result<Snapshot, StoreError> {
    let snapshot = sqlx::query_as::<_, Snapshot>(
        r#"
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
            (SELECT count(*) FROM enrichment_jobs WHERE state = $6) AS enrichment_pending,
            (SELECT CASE WHEN is_called THEN last_value ELSE 0 END FROM worker_tasks_retries_seq) AS task_retries,
            (
                SELECT CASE WHEN is_called THEN last_value ELSE 0 END
                FROM worker_tasks_failed_terminal_seq
            ) AS tasks_failed_terminal
        FROM waiting, live, outbox_backlog
        "#,
    )
    .bind(crate::seconds(worker_seen_within))
    .bind(TaskState::Pending.as_str())
    .bind(TaskState::RetryWait.as_str())
    .bind(AttemptStatus::LIVE.map(AttemptStatus::as_str))
    .bind(ScanState::Completed.as_str())
    .bind(EnrichmentJobState::Pending.as_str())
    .fetch_one(pool)
    .await?;
    Ok(snapshot)
}
