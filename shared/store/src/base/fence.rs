//! The fencing check (SPEC I1): a write from an attempt is allowed only when, under row locks
//! taken in the writing transaction, the attempt is the task's current one, its token and
//! number match, its lease is unexpired by the database clock, and the task is leased/running.

use messages::{ErrorCode, v1};
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;
use crate::sql;
use crate::states::{AttemptStatus, TaskState};

/// What a worker presents with every mutating message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseClaim {
    pub worker_id: Uuid,
    pub task_id: Uuid,
    pub attempt_id: Uuid,
    pub attempt_number: i32,
    pub lease_token: String,
}

impl LeaseClaim {
    /// Parses the lease a message carries, sent by `worker_id`.
    pub fn from_wire(
        worker_id: Uuid,
        lease: Option<&messages::v1::LeaseRef>,
    ) -> Result<Self, messages::v1::Error> {
        use messages::{ErrorCode, v1};
        let invalid = |message: &str| v1::Error::new(ErrorCode::InvalidField, message);
        let lease = lease.ok_or_else(|| invalid("lease is required"))?;
        let task_id =
            Uuid::parse_str(&lease.task_id).map_err(|_| invalid("lease.task_id is not a UUID"))?;
        let attempt_id = Uuid::parse_str(&lease.attempt_id)
            .map_err(|_| invalid("lease.attempt_id is not a UUID"))?;
        let attempt_number = i32::try_from(lease.attempt_number)
            .ok()
            .filter(|number| *number > 0)
            .ok_or_else(|| invalid("lease.attempt_number must be a positive 32-bit integer"))?;
        if lease.lease_token.is_empty()
            || lease.lease_token.len() > 128
            || lease.lease_token.contains('\0')
        {
            return Err(invalid(
                "lease.lease_token must be 1..=128 bytes without NUL",
            ));
        }
        Ok(Self {
            worker_id,
            task_id,
            attempt_id,
            attempt_number,
            lease_token: lease.lease_token.clone(),
        })
    }
}

/// The locked attempt and task, as read inside the writing transaction.
#[derive(Debug, Clone, sqlx::FromRow)]
pub(crate) struct LockedAttempt {
    pub attempt_number: i32,
    pub lease_token: String,
    pub attempt_status: String,
    pub worker_id: Uuid,
    pub lease_live: bool,
    pub task_state: String,
    pub current_attempt_id: Option<Uuid>,
    pub organization_id: Uuid,
    pub scan_id: Option<Uuid>,
    pub scan_job_id: Option<Uuid>,
    pub attempt_count: i32,
    pub max_attempts: i32,
    pub cancel_requested: bool,
    pub plugin: String,
}

impl LockedAttempt {
    pub fn attempt_status(&self) -> Result<AttemptStatus, StoreError> {
        AttemptStatus::parse(&self.attempt_status)
            .ok_or_else(|| StoreError::Corrupt(format!("attempt status {:?}", self.attempt_status)))
    }

    pub fn task_state(&self) -> Result<TaskState, StoreError> {
        TaskState::parse(&self.task_state)
            .ok_or_else(|| StoreError::Corrupt(format!("task state {:?}", self.task_state)))
    }

    /// The claim names this attempt, with its token, from its own worker.
    pub fn is_presented_by(&self, claim: &LeaseClaim) -> bool {
        self.worker_id == claim.worker_id
            && self.attempt_number == claim.attempt_number
            && constant_time_eq(self.lease_token.as_bytes(), claim.lease_token.as_bytes())
    }

    /// The attempt may still write: current, live, unexpired, task leased or running.
    pub fn holds_lease(&self, claim: &LeaseClaim) -> Result<bool, StoreError> {
        Ok(self.is_presented_by(claim)
            && self.current_attempt_id == Some(claim.attempt_id)
            && self.attempt_status()?.is_live()
            && self.lease_live
            && matches!(self.task_state()?, TaskState::Leased | TaskState::Running))
    }

    /// Why `claim` may not write, or `None` when it holds the lease: `cancel_requested` for the
    /// attempt's own worker once its task is being cancelled, `lease_lost` otherwise.
    pub fn refusal(&self, claim: &LeaseClaim) -> Result<Option<v1::Error>, StoreError> {
        if self.holds_lease(claim)? {
            return Ok(None);
        }
        if self.is_presented_by(claim) && self.cancel_requested {
            return Ok(Some(cancel_requested()));
        }
        Ok(Some(lease_lost(claim)))
    }
}

/// The refusal of a claim whose attempt is gone, or no longer holds its lease.
pub(crate) fn lease_lost(claim: &LeaseClaim) -> v1::Error {
    v1::Error::new(
        ErrorCode::LeaseLost,
        format!(
            "attempt {} (number {}) of task {} no longer holds the lease; stop and discard its work",
            claim.attempt_id, claim.attempt_number, claim.task_id
        ),
    )
}

/// The refusal of a claim whose task is being cancelled: its worker must stop.
pub(crate) fn cancel_requested() -> v1::Error {
    v1::Error::new(
        ErrorCode::CancelRequested,
        "the task was cancelled; stop working on it",
    )
}

/// Locks the attempt and its task (`FOR UPDATE`) and returns them; `None` when the attempt
/// does not exist or belongs to another task.
pub(crate) async fn lock(
    conn: &mut PgConnection,
    claim: &LeaseClaim,
) -> Result<Option<LockedAttempt>, StoreError> {
    let locked = sql::worker_task_attempts::LockFence {
        attempt_id: claim.attempt_id,
        task_id: claim.task_id,
    }
    .query_as::<LockedAttempt>()
    .fetch_optional(&mut *conn)
    .await?;
    Ok(locked)
}

/// Compares secrets in time independent of where they differ.
fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0_u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn constant_time_eq_compares_bytes() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
    }
}
