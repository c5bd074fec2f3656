//! Cancellation (SPEC §4.2): persisted first, seen by the worker at its next renew (and by
//! every batch, completion and failure it still sends), racing cleanly with completion.
//!
//! A cancel ends the scan's unfinished tasks at once (`cancelled` is terminal) and cancels
//! their live attempts; `cancel_requested_at` records that the end was a cancellation, which
//! is what the attempt's worker is told. Whichever of cancel and completion commits first
//! wins: a later completion is refused `cancel_requested`, a later cancel of a finished scan
//! answers `AlreadyTerminal`. Locks are taken attempt → task → scan, the order ingestion
//! uses, so the two do not deadlock each other.

use messages::{EventKind, Subjects, v1};
use prost::Message as _;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;
use crate::outbox::{self, OutboxEvent};
use crate::sql;
use crate::states::{AttemptStatus, ScanJobState, ScanState, TaskState};

/// The failure code of everything a cancel ends: tasks, scan jobs, the scan.
const CANCELLED: &str = "cancelled";

/// What to cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelTarget {
    /// The scan and every unfinished task of it.
    Scan(Uuid),
    /// One task's scan, whatever the state of that task (a scan cannot finish without its
    /// tasks).
    Task(Uuid),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// This request cancelled it.
    Cancelled {
        scan_id: Uuid,
        /// The scan's W3C trace context, as admission stored it: where the cancel is traced.
        trace_context: Option<String>,
    },
    /// It had already ended (completed, failed or cancelled); nothing changed.
    AlreadyTerminal {
        scan_id: Uuid,
        state: String,
    },
    NotFound,
}

/// Cancels `target` in one transaction. With `organization_id`, only a scan or task of that
/// organization: another's answers `NotFound`, exactly as one that does not exist, so a client
/// learns nothing of other tenants.
pub async fn cancel(
    pool: &PgPool,
    subjects: &Subjects,
    organization_id: Option<Uuid>,
    target: CancelTarget,
    reason: &str,
) -> Result<CancelOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let scan_id = match target {
        CancelTarget::Scan(scan_id) => Some(scan_id),
        CancelTarget::Task(task_id) => {
            let task: Option<(Option<Uuid>, Uuid)> = sql::worker_tasks::ScanOfTask { task_id }
                .query_as()
                .fetch_optional(&mut *tx)
                .await?;
            // Any task of a scan names the scan, whatever the task's own state: cancelling the
            // first plugin's task after it completed cancels the scan while a later plugin
            // runs. The answer is the scan's (`AlreadyTerminal` only once the scan ended).
            task.filter(|(_, owner)| organization_id.is_none_or(|id| id == *owner))
                .and_then(|(scan_id, _)| scan_id)
        }
    };
    let Some(scan_id) = scan_id else {
        return Ok(CancelOutcome::NotFound);
    };
    let outcome = cancel_scan(&mut tx, subjects, organization_id, scan_id, reason).await?;
    tx.commit().await?;
    Ok(outcome)
}

/// Cancels the scan: locks it (`lock_scan`), decides (not found, outside `scope`, already
/// ended), then ends its live attempts, unfinished tasks, scan jobs and the scan itself
/// (`end_scan`) and enqueues its `scan.cancelled`.
async fn cancel_scan(
    conn: &mut PgConnection,
    subjects: &Subjects,
    scope: Option<Uuid>,
    scan_id: Uuid,
    reason: &str,
) -> Result<CancelOutcome, StoreError> {
    let Some(scan) = lock_scan(conn, scan_id).await? else {
        return Ok(CancelOutcome::NotFound);
    };
    if scope.is_some_and(|scope| scope != scan.organization_id) {
        // Nothing was written; the transaction rolls back with its locks.
        return Ok(CancelOutcome::NotFound);
    }
    if !ScanState::parse(&scan.state).is_some_and(|state| ScanState::ACTIVE.contains(&state)) {
        return Ok(CancelOutcome::AlreadyTerminal {
            scan_id,
            state: scan.state,
        });
    }
    let cancelled_at_unix_ms = end_scan(conn, scan_id, reason).await?;
    let trace_context = scan.trace_context.clone();
    let event = v1::ScanCancelled {
        scan_id: scan_id.to_string(),
        organization_id: scan.organization_id.to_string(),
        client_id: scan.client_id,
        idempotency_key: scan.idempotency_key,
        reason: reason.to_owned(),
        cancelled_at_unix_ms,
    };
    outbox::enqueue(
        conn,
        &[OutboxEvent::for_tenant(
            subjects,
            &scan.organization_id,
            EventKind::ScanCancelled,
            event.encode_to_vec(),
        )
        .in_trace_of(scan_id)],
    )
    .await?;
    Ok(CancelOutcome::Cancelled {
        scan_id,
        trace_context,
    })
}

/// A scan as a cancel locked it.
struct LockedScan {
    state: String,
    organization_id: Uuid,
    client_id: String,
    idempotency_key: String,
    trace_context: Option<String>,
}

/// Locks the scan's live attempts, its tasks, then the scan (attempt → task → scan, like
/// ingestion's fence then scan lock), and reads the scan; `None` when it does not exist.
async fn lock_scan(
    conn: &mut PgConnection,
    scan_id: Uuid,
) -> Result<Option<LockedScan>, StoreError> {
    sql::worker_task_attempts::LockLiveOfScan {
        scan_id,
        live_statuses: AttemptStatus::LIVE.map(AttemptStatus::as_str),
    }
    .query()
    .execute(&mut *conn)
    .await?;
    sql::worker_tasks::LockOfScan { scan_id }
        .query()
        .execute(&mut *conn)
        .await?;
    type Row = (String, Uuid, String, String, Option<String>);
    let scan: Option<Row> = sql::scans::LockForCancel { scan_id }
        .query_as()
        .fetch_optional(&mut *conn)
        .await?;
    Ok(scan.map(
        |(state, organization_id, client_id, idempotency_key, trace_context)| LockedScan {
            state,
            organization_id,
            client_id,
            idempotency_key,
            trace_context,
        },
    ))
}

/// Cancels the scan's live attempts, then its unfinished tasks, its pending and running scan
/// jobs, and the scan, one statement each. Returns when the scan was cancelled (Unix ms).
async fn end_scan(conn: &mut PgConnection, scan_id: Uuid, reason: &str) -> Result<i64, StoreError> {
    // Attempts leased after the first lock (by an acquire we then waited for) are live too.
    sql::worker_task_attempts::CancelOfScan {
        scan_id,
        reason,
        cancelled_status: AttemptStatus::Cancelled.as_str(),
        live_statuses: AttemptStatus::LIVE.map(AttemptStatus::as_str),
    }
    .query()
    .execute(&mut *conn)
    .await?;
    sql::worker_tasks::CancelOfScan {
        scan_id,
        reason,
        cancelled_state: TaskState::Cancelled.as_str(),
        failure_code: CANCELLED,
        terminal_states: TaskState::TERMINAL.map(TaskState::as_str),
    }
    .query()
    .execute(&mut *conn)
    .await?;
    sql::scan_jobs::CancelOfScan {
        scan_id,
        reason,
        cancelled_job_state: ScanJobState::Cancelled.as_str(),
        failure_code: CANCELLED,
        cancellable_job_states: [
            ScanJobState::Pending.as_str(),
            ScanJobState::Running.as_str(),
        ],
    }
    .query()
    .execute(&mut *conn)
    .await?;
    Ok(sql::scans::Cancel {
        scan_id,
        reason,
        cancelled_scan_state: ScanState::Cancelled.as_str(),
        failure_code: CANCELLED,
    }
    .query_scalar()
    .fetch_one(conn)
    .await?)
}
