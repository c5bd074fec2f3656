//! Revocation (SPEC §4.2, I12): revoking a worker, or one of its assignments, stops new
//! leases from the moment it commits (acquire holds `FOR SHARE` on both rows, so the revoking
//! `UPDATE` and an acquire serialize). Active leases are voided by default (security
//! revocation: the tasks go back to the queue with their attempt refunded, and the worker's
//! next message is refused `lease_lost`) or allowed to finish (routine reassignment).

use messages::{EventKind, Subjects, v1};
use prost::Message as _;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;
use crate::audit::Change;
use crate::outbox::{self, OutboxEvent};
use crate::sql;
use crate::states::{AdminAction, AttemptStatus, TaskState};

/// What happens to the leases the worker holds when it is revoked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ActiveLeases {
    /// Void them now; their tasks are offered to other workers (the default).
    Cancel,
    /// Let them run to completion; only new leases stop.
    LetFinish,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RevokeOutcome {
    Revoked { leases_cancelled: usize },
    NotFound,
}

/// Revokes the worker itself: no new lease for any organization.
pub async fn revoke_worker(
    pool: &PgPool,
    subjects: &Subjects,
    worker_id: Uuid,
    change: &Change<'_>,
    active: ActiveLeases,
) -> Result<RevokeOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let found: Option<Uuid> = sql::workers::Revoke {
        worker_id,
        reason: change.reason,
        change_id: change.id(),
        who: change.by,
        worker_revoked_action: AdminAction::WorkerRevoked.as_str(),
    }
    .query_scalar()
    .fetch_optional(&mut *tx)
    .await?;
    if found.is_none() {
        return Ok(RevokeOutcome::NotFound);
    }
    let leases_cancelled = match active {
        ActiveLeases::Cancel => void_leases(&mut tx, subjects, worker_id, None).await?,
        ActiveLeases::LetFinish => 0,
    };
    tx.commit().await?;
    Ok(RevokeOutcome::Revoked { leases_cancelled })
}

/// Revokes one assignment: no new lease for that organization's tasks.
pub async fn revoke_assignment(
    pool: &PgPool,
    subjects: &Subjects,
    organization_id: Uuid,
    worker_id: Uuid,
    change: &Change<'_>,
    active: ActiveLeases,
) -> Result<RevokeOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let found: Option<Uuid> = sql::organization_workers::Revoke {
        organization_id,
        worker_id,
        reason: change.reason,
        change_id: change.id(),
        who: change.by,
        assignment_revoked_action: AdminAction::AssignmentRevoked.as_str(),
    }
    .query_scalar()
    .fetch_optional(&mut *tx)
    .await?;
    if found.is_none() {
        return Ok(RevokeOutcome::NotFound);
    }
    let leases_cancelled = match active {
        ActiveLeases::Cancel => {
            void_leases(&mut tx, subjects, worker_id, Some(organization_id)).await?
        }
        ActiveLeases::LetFinish => 0,
    };
    tx.commit().await?;
    Ok(RevokeOutcome::Revoked { leases_cancelled })
}

/// Re-enables a revoked worker (its assignments are managed separately); false when there is
/// none. Every credential of its account issued at or before `credentials_issued_after` is
/// refused from then on (once its account is pushed): it needs fresh ones.
pub async fn enable_worker(
    pool: &PgPool,
    worker_id: Uuid,
    change: &Change<'_>,
    credentials_issued_after: chrono::DateTime<chrono::Utc>,
) -> Result<bool, StoreError> {
    let enabled: Option<Uuid> = sql::workers::Enable {
        worker_id,
        change_id: change.id(),
        who: change.by,
        why: change.reason,
        worker_enabled_action: AdminAction::WorkerEnabled.as_str(),
        credentials_issued_after,
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(enabled.is_some())
}

/// Voids the worker's live attempts (optionally only on one organization's tasks) and puts
/// their tasks back in the queue, refunding the attempt. Locks attempt → task.
async fn void_leases(
    conn: &mut PgConnection,
    subjects: &Subjects,
    worker_id: Uuid,
    organization_id: Option<Uuid>,
) -> Result<usize, StoreError> {
    let voided: Vec<(Uuid, Option<Uuid>, Uuid, String)> = sql::worker_task_attempts::VoidLeases {
        worker_id,
        organization_id,
        live_statuses: AttemptStatus::LIVE.map(AttemptStatus::as_str),
        cancelled_status: AttemptStatus::Cancelled.as_str(),
        pending_state: TaskState::Pending.as_str(),
        leased_states: TaskState::LEASED.map(TaskState::as_str),
    }
    .query_as()
    .fetch_all(&mut *conn)
    .await?;
    if voided.is_empty() {
        return Ok(0);
    }
    let events: Vec<OutboxEvent> = voided
        .iter()
        .map(|(task_id, scan_id, organization_id, plugin)| {
            let ready = v1::TaskReady {
                task_id: task_id.to_string(),
                scan_id: scan_id.map(|id| id.to_string()).unwrap_or_default(),
                organization_id: organization_id.to_string(),
                plugin: plugin.clone(),
                required_capabilities: vec![plugin.clone()],
            };
            let event = OutboxEvent::new(subjects, EventKind::TaskReady, ready.encode_to_vec());
            event.in_trace_of(*scan_id)
        })
        .collect();
    outbox::enqueue(conn, &events).await?;
    Ok(voided.len())
}
