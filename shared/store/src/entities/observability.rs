//! The aggregates behind `/metrics`: one statement, one round trip, every part served by a
//! partial or ordered index so its cost follows the size of the backlog it measures, not of
//! the tables, or read from a counter sequence at a fixed cost. `runtime` caches the answer,
//! so a scrape storm costs one query per refresh.

use std::time::Duration;

use sqlx::PgPool;

use crate::StoreError;
use crate::sql;
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
    /// Outbox rows not yet published (`outbox_claimable_idx` holds them all).
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
    /// Seconds since the oldest due pending enrichment job became due; 0 when none is due.
    pub enrichment_oldest_due_age_seconds: f64,
    /// Enrichment jobs `running` under a claim (`enrichment_jobs_running_expiry_idx`).
    pub enrichment_running: i64,
    /// Seconds since the stalest running enrichment job was renewed or checkpointed; 0 when
    /// none runs. Grows while a crashed process's claim awaits the reaper.
    pub enrichment_stalest_heartbeat_age_seconds: f64,
    /// Times a task entered `retry_wait` since the counters' migration
    /// (`worker_tasks_retries_seq`); may over-count, never decreases.
    pub task_retries: i64,
    /// Tasks that entered `failed_terminal` since the counters' migration
    /// (`worker_tasks_failed_terminal_seq`); may over-count, never decreases.
    pub tasks_failed_terminal: i64,
    /// Schedules not paused (`scan_schedules_due_idx`).
    pub schedules_active: i64,
    /// When the soonest active schedule fires next (Unix seconds); `None` when none is active.
    pub schedule_next_fire_timestamp_seconds: Option<f64>,
}

/// Reads every aggregate in one statement. `worker_seen_within` is how recent a worker's
/// `last_seen_at` must be for it to count as live (two lease TTLs).
pub async fn snapshot(pool: &PgPool, worker_seen_within: Duration) -> Result<Snapshot, StoreError> {
    let snapshot = sql::worker_tasks::QueueSnapshot {
        worker_seen_within_seconds: crate::seconds(worker_seen_within),
        pending_state: TaskState::Pending.as_str(),
        retry_wait_state: TaskState::RetryWait.as_str(),
        live_statuses: AttemptStatus::LIVE.map(AttemptStatus::as_str),
        completed_scan_state: ScanState::Completed.as_str(),
        pending_enrichment_state: EnrichmentJobState::Pending.as_str(),
        running_enrichment_state: EnrichmentJobState::Running.as_str(),
    }
    .query_as::<Snapshot>()
    .fetch_one(pool)
    .await?;
    Ok(snapshot)
}

/// Unfinished tasks of one organization, plugin and state (`palisade queue`).
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct Backlog {
    pub organization_id: uuid::Uuid,
    pub plugin: String,
    pub state: String,
    pub tasks: i64,
    /// Of them, due now (for `pending` and `retry_wait`: waiting for a worker).
    pub due: i64,
    /// How long the oldest due one has waited (0 when none is due).
    pub oldest_due_age_seconds: f64,
}

/// The unfinished tasks by organization, plugin and state, in one statement.
pub async fn backlog(pool: &PgPool) -> Result<Vec<Backlog>, StoreError> {
    let states = [
        TaskState::Pending,
        TaskState::RetryWait,
        TaskState::Leased,
        TaskState::Running,
    ]
    .map(TaskState::as_str);
    Ok(sql::worker_tasks::Backlog {
        unfinished_states: states,
    }
    .query_as()
    .fetch_all(pool)
    .await?)
}
