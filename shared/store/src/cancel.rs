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
use crate::states::{AttemptStatus, ScanJobState, ScanState, TaskState};

/// The failure code of everything a cancel ends: tasks, scan jobs, the scan.
const CANCELLED: &str = "cancelled";

/// What to cancel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CancelTarget {
    /// The scan and every unfinished task of it.
    Scan(Uuid),
    /// One task; a scan cannot finish without it, so its scan is cancelled too.
    Task(Uuid),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CancelOutcome {
    /// This request cancelled it.
    Cancelled {
        scan_id: Uuid,
    },
    /// It had already ended (completed, failed or cancelled); nothing changed.
    AlreadyTerminal {
        scan_id: Uuid,
        state: String,
    },
    NotFound,
}

/// Cancels `target` in one transaction.
pub async fn cancel(
    pool: &PgPool,
    subjects: &Subjects,
    target: CancelTarget,
    reason: &str,
) -> Result<CancelOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let scan_id = match target {
        CancelTarget::Scan(scan_id) => Some(scan_id),
        CancelTarget::Task(task_id) => {
            let task: Option<(Option<Uuid>, String)> =
                sqlx::query_as("SELECT scan_id, state FROM worker_tasks WHERE id = $1")
                    .bind(task_id)
                    .fetch_optional(&mut *tx)
                    .await?;
            match task {
                // A task that ended stays ended (terminal is terminal); its scan goes on.
                Some((Some(scan_id), state))
                    if TaskState::parse(&state).is_some_and(TaskState::is_terminal) =>
                {
                    return Ok(CancelOutcome::AlreadyTerminal { scan_id, state });
                }
                Some((scan_id, _)) => scan_id,
                None => None,
            }
        }
    };
    let Some(scan_id) = scan_id else {
        return Ok(CancelOutcome::NotFound);
    };
    let outcome = cancel_scan(&mut tx, subjects, scan_id, reason).await?;
    tx.commit().await?;
    Ok(outcome)
}

async fn cancel_scan(
    conn: &mut PgConnection,
    subjects: &Subjects,
    scan_id: Uuid,
    reason: &str,
) -> Result<CancelOutcome, StoreError> {
    // attempt → task → scan, like ingestion's fence then scan lock.
    sqlx::query(
        r#"
        SELECT a.id FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
        WHERE t.scan_id = $1 AND a.status = ANY($2)
        ORDER BY a.id
        FOR UPDATE OF a
        "#,
    )
    .bind(scan_id)
    .bind(AttemptStatus::LIVE.map(AttemptStatus::as_str))
    .execute(&mut *conn)
    .await?;
    sqlx::query("SELECT id FROM worker_tasks WHERE scan_id = $1 ORDER BY id FOR UPDATE")
        .bind(scan_id)
        .execute(&mut *conn)
        .await?;
    let scan: Option<(String, Uuid, String, String)> = sqlx::query_as(
        "SELECT state, organization_id, client_id, idempotency_key FROM scans WHERE id = $1 FOR UPDATE",
    )
    .bind(scan_id)
    .fetch_optional(&mut *conn)
    .await?;
    let Some((state, organization_id, client_id, idempotency_key)) = scan else {
        return Ok(CancelOutcome::NotFound);
    };
    if !ScanState::parse(&state).is_some_and(|state| ScanState::ACTIVE.contains(&state)) {
        return Ok(CancelOutcome::AlreadyTerminal { scan_id, state });
    }

    // Attempts leased after the first lock (by an acquire we then waited for) are live too.
    sqlx::query(
        r#"
        UPDATE worker_task_attempts a
        SET status = $3, finished_at = now(), updated_at = now(),
            error_code = 'cancel_requested', error_message = $2
        FROM worker_tasks t
        WHERE t.id = a.task_id AND t.scan_id = $1 AND a.status = ANY($4)
        "#,
    )
    .bind(scan_id)
    .bind(reason)
    .bind(AttemptStatus::Cancelled.as_str())
    .bind(AttemptStatus::LIVE.map(AttemptStatus::as_str))
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        r#"
        UPDATE worker_tasks
        SET state = $3, cancel_requested_at = now(), completed_at = now(), updated_at = now(),
            last_error_code = $4, last_error = $2
        WHERE scan_id = $1 AND state <> ALL($5)
        "#,
    )
    .bind(scan_id)
    .bind(reason)
    .bind(TaskState::Cancelled.as_str())
    .bind(CANCELLED)
    .bind(TaskState::TERMINAL.map(TaskState::as_str))
    .execute(&mut *conn)
    .await?;
    sqlx::query(
        r#"
        UPDATE scan_jobs SET state = $3, finished_at = now(), updated_at = now(),
               error_code = $4, error_message = $2
        WHERE scan_id = $1 AND state = ANY($5)
        "#,
    )
    .bind(scan_id)
    .bind(reason)
    .bind(ScanJobState::Cancelled.as_str())
    .bind(CANCELLED)
    .bind([
        ScanJobState::Pending.as_str(),
        ScanJobState::Running.as_str(),
    ])
    .execute(&mut *conn)
    .await?;
    let cancelled_at_unix_ms: i64 = sqlx::query_scalar(
        r#"
        UPDATE scans SET state = $3, failure_code = $4, failure_reason = $2,
               finished_at = now(), updated_at = now()
        WHERE id = $1
        RETURNING (extract(epoch FROM finished_at) * 1000)::bigint
        "#,
    )
    .bind(scan_id)
    .bind(reason)
    .bind(ScanState::Cancelled.as_str())
    .bind(CANCELLED)
    .fetch_one(&mut *conn)
    .await?;
    let event = v1::ScanCancelled {
        scan_id: scan_id.to_string(),
        organization_id: organization_id.to_string(),
        client_id,
        idempotency_key,
        reason: reason.to_owned(),
        cancelled_at_unix_ms,
    };
    outbox::enqueue(
        conn,
        &[OutboxEvent::new(
            subjects,
            EventKind::ScanCancelled,
            event.encode_to_vec(),
        )],
    )
    .await?;
    Ok(CancelOutcome::Cancelled { scan_id })
}
