//! Release: a live attempt given back without spending the attempt budget.

use messages::{EventKind, Subjects, v1};
use prost::Message as _;
use sqlx::PgPool;

use crate::StoreError;
use crate::fence::{self, LeaseClaim, lease_lost};
use crate::outbox::{self, OutboxEvent, Staged};
use crate::sql;
use crate::states::{AttemptStatus, TaskState};

#[derive(Debug, Clone, PartialEq)]
pub enum ReleaseOutcome {
    Released,
    Refused(v1::Error),
}

/// Gives a live attempt back without spending the attempt budget; the task is due at once.
pub async fn release(
    pool: &PgPool,
    staged: &mut Staged,
    subjects: &Subjects,
    claim: &LeaseClaim,
    reason: &str,
) -> Result<ReleaseOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let Some(locked) = fence::lock(&mut tx, claim).await? else {
        return Ok(ReleaseOutcome::Refused(lease_lost(claim)));
    };
    if locked.is_presented_by(claim) && locked.attempt_status()? == AttemptStatus::Released {
        return Ok(ReleaseOutcome::Released);
    }
    if !locked.holds_lease(claim)? {
        return Ok(ReleaseOutcome::Refused(lease_lost(claim)));
    }
    sql::worker_task_attempts::Release {
        attempt_id: claim.attempt_id,
        reason,
        released_status: AttemptStatus::Released.as_str(),
    }
    .query()
    .execute(&mut *tx)
    .await?;
    sql::worker_tasks::Release {
        task_id: claim.task_id,
        pending_state: TaskState::Pending.as_str(),
    }
    .query()
    .execute(&mut *tx)
    .await?;
    let ready = v1::TaskReady {
        task_id: claim.task_id.to_string(),
        scan_id: locked.scan_id.map(|id| id.to_string()).unwrap_or_default(),
        organization_id: locked.organization_id.to_string(),
        plugin: locked.plugin.clone(),
        required_capabilities: vec![locked.plugin.clone()],
    };
    let event = OutboxEvent::new(subjects, EventKind::TaskReady, ready.encode_to_vec());
    let event = event.in_trace_of(locked.scan_id);
    outbox::stage(&mut tx, staged, vec![event]).await?;
    tx.commit().await?;
    Ok(ReleaseOutcome::Released)
}
