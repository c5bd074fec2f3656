//! The reaper's sweeps (SPEC §4.5). Stale-attempt recovery: expired leases go back to the
//! queue or fail terminally when the budget is spent. Execution deadlines: overdue attempts
//! fail terminally. Stranded tasks (never leased, no live worker offers their plugin by the
//! pending deadline) fail terminally. Each is one transaction of a fixed number of statements
//! whatever the number of rows: one claims the tasks (`FOR UPDATE SKIP LOCKED`, guarded on
//! status and time, so it never waits on a busy row and never touches an attempt that
//! completed, renewed or was superseded meanwhile) and ends their attempts,
//! [`progress::fail_tasks`] fails the tasks, scan jobs and scans set-wise, and one statement
//! inserts the events. Upload expiry and each retention table are one statement.

use messages::Subjects;
use messages::v1;
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::outbox;
use crate::progress::{self, FailedTask, Failure};
use crate::retry::RetryPolicy;
use crate::sql;
use crate::states::{AttemptStatus, TaskState, UploadStatus};

/// What one recovery pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryOutcome {
    /// Tasks returned to `retry_wait`.
    pub retried: Vec<Uuid>,
    /// Tasks that spent their budget and failed terminally (their scans failed too).
    pub failed: Vec<Uuid>,
}

impl RecoveryOutcome {
    pub fn is_empty(&self) -> bool {
        self.retried.is_empty() && self.failed.is_empty()
    }
}

/// An attempt a sweep claimed and ended, with its task (both locked).
#[derive(sqlx::FromRow)]
struct Claimed {
    /// `None` for a task that was never leased (the stranded sweep).
    attempt_id: Option<Uuid>,
    task_id: Uuid,
    organization_id: Uuid,
    scan_id: Option<Uuid>,
    scan_job_id: Option<Uuid>,
    plugin: String,
    attempt_count: i32,
    max_attempts: i32,
    /// The task fails now: it is `leased` or `running` with this attempt current, or it is a
    /// stranded task that was never leased. Otherwise only the attempt ended (its task moved
    /// on without it).
    task_live: bool,
}

/// The rest of a sweep step after its claim: fails the claimed attempts' live tasks set-wise
/// and enqueues their events in one statement, then commits.
async fn fail_claimed(
    mut tx: sqlx::Transaction<'_, sqlx::Postgres>,
    subjects: &Subjects,
    retry: RetryPolicy,
    failure: &Failure<'_>,
    claimed: &[Claimed],
) -> Result<RecoveryOutcome, StoreError> {
    let tasks: Vec<FailedTask<'_>> = claimed
        .iter()
        .filter(|row| row.task_live)
        .map(|row| FailedTask {
            task_id: row.task_id,
            attempt_id: row.attempt_id,
            organization_id: row.organization_id,
            scan_id: row.scan_id,
            scan_job_id: row.scan_job_id,
            plugin: &row.plugin,
            attempt_count: row.attempt_count,
            max_attempts: row.max_attempts,
        })
        .collect();
    let failed = progress::fail_tasks(&mut tx, subjects, retry, failure, &tasks).await?;
    outbox::enqueue(&mut tx, &failed.events).await?;
    tx.commit().await?;
    Ok(RecoveryOutcome {
        retried: failed.retried,
        failed: failed.failed,
    })
}

/// Recovers up to `limit` expired attempts in one transaction of a fixed number of
/// statements, whatever their number: one claims them (`FOR UPDATE SKIP LOCKED` on attempt
/// and task, guarded on status and expiry, so it never waits on a busy row and never touches
/// an attempt that completed, renewed or was superseded meanwhile) and marks them `expired`;
/// [`progress::fail_tasks`] moves their tasks to `retry_wait` or, budget spent,
/// `failed_terminal` with their scans (failure code `lease_expired`); one inserts the events.
pub async fn recover_expired(
    pool: &PgPool,
    subjects: &Subjects,
    retry: RetryPolicy,
    limit: i64,
) -> Result<RecoveryOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let claimed = sql::worker_task_attempts::RecoverExpired {
        limit,
        leased_status: AttemptStatus::Leased.as_str(),
        running_status: AttemptStatus::Running.as_str(),
        expired_status: AttemptStatus::Expired.as_str(),
        leased_state: TaskState::Leased.as_str(),
        running_state: TaskState::Running.as_str(),
        error_code: LEASE_EXPIRED,
        error_message: LEASE_EXPIRED_MESSAGE,
    }
    .query_as::<Claimed>()
    .fetch_all(&mut *tx)
    .await?;
    if claimed.is_empty() {
        tx.commit().await?;
        return Ok(RecoveryOutcome::default());
    }
    // A failure code, not a refusal: like plugin failure codes it is free-form, and it is
    // the same code the attempt and task rows record.
    let error = v1::Error {
        code: LEASE_EXPIRED.into(),
        message: "every attempt's lease expired without renewal".into(),
        ..Default::default()
    };
    let failure = Failure {
        error: &error,
        task_message: LEASE_EXPIRED_MESSAGE,
        retryable: true,
        scan_reason: "spent its attempt budget: every lease expired",
        from: &TaskState::LEASED,
    };
    fail_claimed(tx, subjects, retry, &failure, &claimed).await
}

const LEASE_EXPIRED: &str = "lease_expired";
const LEASE_EXPIRED_MESSAGE: &str = "lease expired without renewal";
const DEADLINE_EXCEEDED: &str = "deadline_exceeded";
const DEADLINE_EXCEEDED_MESSAGE: &str = "the execution deadline passed";

/// How many `retry_wait` tasks are due now (index-served).
pub async fn due_retries(pool: &PgPool) -> Result<i64, StoreError> {
    Ok(sql::worker_tasks::CountDueRetries {
        retry_wait_state: TaskState::RetryWait.as_str(),
    }
    .query_scalar()
    .fetch_one(pool)
    .await?)
}

/// Fails live attempts that passed their task's execution deadline, even if they renew:
/// lease expiry and the deadline are separate clocks. A deadline failure is not retried (the
/// same work would overrun again); the task fails terminally and its scan with it. A fixed
/// number of statements whatever the number of rows, like [`recover_expired`]: one claims
/// and fails the attempts (skipping rows another transaction holds), one fails their tasks,
/// scan jobs and scans ([`progress::fail_tasks`]), one inserts the events.
pub async fn fail_overdue(
    pool: &PgPool,
    subjects: &Subjects,
    limit: i64,
) -> Result<Vec<Uuid>, StoreError> {
    let mut tx = pool.begin().await?;
    let claimed = sql::worker_task_attempts::FailOverdue {
        limit,
        leased_status: AttemptStatus::Leased.as_str(),
        running_status: AttemptStatus::Running.as_str(),
        failed_status: AttemptStatus::Failed.as_str(),
        leased_state: TaskState::Leased.as_str(),
        running_state: TaskState::Running.as_str(),
        error_code: DEADLINE_EXCEEDED,
        error_message: DEADLINE_EXCEEDED_MESSAGE,
    }
    .query_as::<Claimed>()
    .fetch_all(&mut *tx)
    .await?;
    if claimed.is_empty() {
        tx.commit().await?;
        return Ok(Vec::new());
    }
    fail_terminally(
        tx,
        subjects,
        (DEADLINE_EXCEEDED, DEADLINE_EXCEEDED_MESSAGE),
        "ran past its execution deadline",
        &TaskState::LEASED,
        &claimed,
    )
    .await
}

/// A task never leased, failed because no live worker could take it before its pending
/// deadline: its scan fails with this code and the scan's target is free again.
pub const NO_WORKER: &str = "no_worker";
const NO_WORKER_MESSAGE: &str = "no live worker of the organization could take this task (none \
     offers its plugin, or its attempts are spent); register or start one that offers it";

/// Fails up to `limit` tasks that have been `pending` longer than `pending_deadline` while no
/// live worker (seen within `worker_live_within`, or holding a live lease) of their
/// organization offers their plugin (SPEC I4: nothing stranded), and due tasks whose attempts
/// are spent (the grant never leases them) as long, in one transaction of a fixed
/// number of statements: one claims them (`SKIP LOCKED`), [`progress::fail_tasks`] fails them
/// terminally with their scan jobs and scans (code [`NO_WORKER`]), one inserts the events.
pub async fn fail_stranded(
    pool: &PgPool,
    subjects: &Subjects,
    pending_deadline: std::time::Duration,
    worker_live_within: std::time::Duration,
    limit: i64,
) -> Result<Vec<Uuid>, StoreError> {
    let mut tx = pool.begin().await?;
    let stranded = sql::worker_tasks::ClaimStranded {
        limit,
        waiting_states: [TaskState::Pending.as_str(), TaskState::RetryWait.as_str()],
        pending_deadline_seconds: crate::seconds(pending_deadline),
        worker_live_within_seconds: crate::seconds(worker_live_within),
        live_statuses: AttemptStatus::LIVE.map(AttemptStatus::as_str),
        pending_state: TaskState::Pending.as_str(),
    }
    .query_as::<Claimed>()
    .fetch_all(&mut *tx)
    .await?;
    if stranded.is_empty() {
        tx.commit().await?;
        return Ok(Vec::new());
    }
    fail_terminally(
        tx,
        subjects,
        (NO_WORKER, NO_WORKER_MESSAGE),
        "could be taken by no live worker before the pending deadline",
        &[TaskState::Pending, TaskState::RetryWait],
        &stranded,
    )
    .await
}

/// Fails claimed tasks terminally, not retried whatever their budget, with one code for all:
/// the end of [`fail_overdue`] and [`fail_stranded`].
async fn fail_terminally(
    tx: sqlx::Transaction<'_, sqlx::Postgres>,
    subjects: &Subjects,
    (code, message): (&str, &str),
    scan_reason: &str,
    from: &[TaskState],
    claimed: &[Claimed],
) -> Result<Vec<Uuid>, StoreError> {
    let error = v1::Error {
        code: code.into(),
        message: message.into(),
        ..Default::default()
    };
    let failure = Failure {
        error: &error,
        task_message: message,
        retryable: false,
        scan_reason,
        from,
    };
    let outcome = fail_claimed(tx, subjects, RetryPolicy::default(), &failure, claimed).await?;
    Ok(outcome.failed)
}

/// Upload sessions past their expiry (never committed) become `expired`, in one statement.
pub async fn expire_uploads(pool: &PgPool, limit: i64) -> Result<u64, StoreError> {
    Ok(sql::worker_artifact_uploads::Expire {
        limit,
        expired_status: UploadStatus::Expired.as_str(),
        open_statuses: UploadStatus::OPEN.map(UploadStatus::as_str),
    }
    .query()
    .execute(pool)
    .await?
    .rows_affected())
}

/// What one retention pass removed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Pruned {
    pub outbox: u64,
    pub batches: u64,
    pub dead_letters: u64,
    /// Quarantined CVE records not seen since the cutoff.
    pub cve_quarantine: u64,
    /// Fire records of schedule slots older than the cutoff.
    pub schedule_fires: u64,
}

/// Removes transport history older than `retention`: outbox rows earlier versions marked
/// published (published rows are deleted at once now), result-batch records of tasks that
/// ended, dead letters, quarantined CVE records no longer seen, fire records of old schedule slots. Evidence (scans, findings, assets) and attempt history are kept. At most `limit` rows of each per pass.
///
/// Each statement reads only what it removes, whatever the tables hold: the rows are chosen
/// in an index's order (`ARRAY(…)`, an init plan run once) and then deleted by primary key,
/// so the planner cannot join the chosen ids back to the whole table with a sequential scan.
/// Result batches are chosen by their own arrival (`worker_result_batches_received_idx`),
/// not by walking every task that ended before the cutoff (tasks are never pruned, so that
/// walk would grow with all history); each one's task is checked by primary key in a lateral
/// subquery kept apart from the join (`OFFSET 0`), so the planner cannot hash-join the batches
/// to a sequential scan of every task instead, which it prefers on small tables.
pub async fn prune(
    pool: &PgPool,
    retention: std::time::Duration,
    limit: i64,
) -> Result<Pruned, StoreError> {
    let retention_seconds = crate::seconds(retention);
    let outbox = sql::outbox::Prune {
        retention_seconds,
        limit,
    }
    .query()
    .execute(pool)
    .await?
    .rows_affected();
    let batches = sql::worker_result_batches::Prune {
        retention_seconds,
        limit,
        terminal_states: TaskState::TERMINAL.map(TaskState::as_str),
    }
    .query()
    .execute(pool)
    .await?
    .rows_affected();
    let dead_letters = sql::dead_letters::Prune {
        retention_seconds,
        limit,
    }
    .query()
    .execute(pool)
    .await?
    .rows_affected();
    let cve_quarantine = sql::cve_quarantine::Prune {
        retention_seconds,
        limit,
    }
    .query()
    .execute(pool)
    .await?
    .rows_affected();
    let schedule_fires = sql::schedule_fires::Prune {
        retention_seconds,
        limit,
    }
    .query()
    .execute(pool)
    .await?
    .rows_affected();
    Ok(Pruned {
        outbox,
        batches,
        dead_letters,
        cve_quarantine,
        schedule_fires,
    })
}
