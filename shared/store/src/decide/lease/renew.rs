//! Renew: a worker's leases extended, all of one request in one statement.

use std::collections::HashSet;
use std::time::Duration;

use messages::limits::RENEW_LEASES_MAX;
use messages::{ErrorCode, v1};
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::fence::{self, LeaseClaim, lease_lost};
use crate::sql;
use crate::states::{AttemptStatus, TaskState};

#[derive(Debug, Clone, PartialEq)]
pub enum RenewOutcome {
    Renewed { lease_expires_in_ms: i64 },
    Refused(v1::Error),
}

/// The leases one renew request names, parsed once (checks 4 to 7 of reference 6.5): at
/// least one, at most [`RENEW_LEASES_MAX`], each a valid `LeaseRef`, no attempt named twice.
/// Distinct attempts are what lets [`renew_many`] answer each lease by itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenewClaims {
    claims: Vec<LeaseClaim>,
}

impl RenewClaims {
    /// Parses a `RenewRequest`'s `lease` and `more_leases`, sent by `worker_id`, checking in
    /// this order: `lease` (as `LeaseClaim::from_wire`), the number of leases (`too_large`),
    /// each of `more_leases` in turn, then that no attempt is named twice (`invalid_field`).
    pub fn from_wire(
        worker_id: Uuid,
        lease: Option<&v1::LeaseRef>,
        more_leases: &[v1::LeaseRef],
    ) -> Result<Self, v1::Error> {
        let first = LeaseClaim::from_wire(worker_id, lease)?;
        if more_leases.len() >= RENEW_LEASES_MAX {
            return Err(v1::Error::new(
                ErrorCode::TooLarge,
                format!(
                    "{} leases in one renew; at most {RENEW_LEASES_MAX} (lease and more_leases together)",
                    more_leases.len() + 1
                ),
            ));
        }
        let mut claims = Vec::with_capacity(1 + more_leases.len());
        claims.push(first);
        for (index, lease) in more_leases.iter().enumerate() {
            let claim = LeaseClaim::from_wire(worker_id, Some(lease)).map_err(|error| {
                v1::Error::new(
                    ErrorCode::InvalidField,
                    format!("more_leases[{index}]: {}", error.message),
                )
            })?;
            claims.push(claim);
        }
        let mut named = HashSet::with_capacity(claims.len());
        if let Some(twice) = claims.iter().find(|claim| !named.insert(claim.attempt_id)) {
            return Err(v1::Error::new(
                ErrorCode::InvalidField,
                format!("attempt {} is named twice in one renew", twice.attempt_id),
            ));
        }
        Ok(Self { claims })
    }

    /// One lease: the single renew every version of the protocol sends.
    pub fn one(claim: LeaseClaim) -> Self {
        Self {
            claims: vec![claim],
        }
    }

    /// The leases, in the request's order (`lease` first).
    pub fn claims(&self) -> &[LeaseClaim] {
        &self.claims
    }
}

/// Extends the caller's own live attempt; never revives an expired, superseded or cancelled one.
pub async fn renew(
    pool: &PgPool,
    claim: &LeaseClaim,
    lease_ttl: Duration,
) -> Result<RenewOutcome, StoreError> {
    let mut outcomes = renew_many(pool, &RenewClaims::one(claim.clone()), lease_ttl).await?;
    Ok(outcomes.pop().expect("one outcome per claim"))
}

/// Renews every lease of `claims` that its claimant holds, in one statement whatever their
/// number, and answers each, in order: renewed with the lease's new expiry, or refused with
/// `cancel_requested` when the task the claim names has a cancel requested (whatever the rest
/// of the claim), else `lease_lost`. Never revives an expired, superseded or cancelled attempt.
pub async fn renew_many(
    pool: &PgPool,
    claims: &RenewClaims,
    lease_ttl: Duration,
) -> Result<Vec<RenewOutcome>, StoreError> {
    let claims = claims.claims();
    let column = |field: fn(&LeaseClaim) -> Uuid| claims.iter().map(field).collect::<Vec<_>>();
    let attempt_numbers: Vec<i32> = claims.iter().map(|claim| claim.attempt_number).collect();
    let lease_tokens: Vec<&str> = claims
        .iter()
        .map(|claim| claim.lease_token.as_str())
        .collect();
    let rows: Vec<(i64, Option<i64>, bool)> = sql::worker_task_attempts::RenewMany {
        attempt_ids: column(|claim| claim.attempt_id),
        task_ids: column(|claim| claim.task_id),
        worker_ids: column(|claim| claim.worker_id),
        attempt_numbers: &attempt_numbers,
        lease_tokens: &lease_tokens,
        lease_ttl_seconds: crate::seconds(lease_ttl),
        live_statuses: AttemptStatus::LIVE.map(AttemptStatus::as_str),
        leased_states: TaskState::LEASED.map(TaskState::as_str),
        cancel_states: [
            TaskState::Cancelling.as_str(),
            TaskState::Cancelled.as_str(),
        ],
        running_status: AttemptStatus::Running.as_str(),
        running_state: TaskState::Running.as_str(),
        leased_state: TaskState::Leased.as_str(),
    }
    .query_as()
    .fetch_all(pool)
    .await?;
    assert_eq!(rows.len(), claims.len(), "one answer per claim");
    Ok(rows
        .into_iter()
        .zip(claims)
        .enumerate()
        .map(|(index, ((ordinal, renewed, cancel_requested), claim))| {
            assert_eq!(ordinal, index as i64 + 1, "answers in the claims' order");
            match renewed {
                Some(lease_expires_in_ms) => RenewOutcome::Renewed {
                    lease_expires_in_ms,
                },
                None if cancel_requested => RenewOutcome::Refused(fence::cancel_requested()),
                None => RenewOutcome::Refused(lease_lost(claim)),
            }
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease_ref() -> v1::LeaseRef {
        v1::LeaseRef {
            task_id: Uuid::new_v4().to_string(),
            attempt_id: Uuid::new_v4().to_string(),
            attempt_number: 1,
            lease_token: "token".into(),
        }
    }

    fn code(result: Result<RenewClaims, v1::Error>) -> Option<ErrorCode> {
        result.expect_err("refused").error_code()
    }

    #[test]
    fn renew_claims_keep_the_request_order() {
        let worker_id = Uuid::new_v4();
        let refs: Vec<v1::LeaseRef> = (0..5).map(|_| lease_ref()).collect();
        let claims = RenewClaims::from_wire(worker_id, Some(&refs[0]), &refs[1..]).unwrap();
        let named: Vec<String> = claims
            .claims()
            .iter()
            .map(|claim| claim.attempt_id.to_string())
            .collect();
        let sent: Vec<String> = refs.iter().map(|r| r.attempt_id.clone()).collect();
        assert_eq!(named, sent);
        assert!(
            claims
                .claims()
                .iter()
                .all(|claim| claim.worker_id == worker_id)
        );
    }

    #[test]
    fn renew_claims_are_checked_in_the_documented_order() {
        let worker_id = Uuid::new_v4();
        let good = lease_ref();
        let bad = v1::LeaseRef {
            task_id: "nope".into(),
            ..lease_ref()
        };
        // `lease` is required, and checked first, even when more_leases are too many.
        let too_many: Vec<v1::LeaseRef> = (0..RENEW_LEASES_MAX).map(|_| lease_ref()).collect();
        assert_eq!(
            code(RenewClaims::from_wire(worker_id, None, &too_many)),
            Some(ErrorCode::InvalidField)
        );
        // 1 + RENEW_LEASES_MAX leases: too many, before any of more_leases is parsed.
        let mut over = too_many.clone();
        over[0] = bad.clone();
        assert_eq!(
            code(RenewClaims::from_wire(worker_id, Some(&good), &over)),
            Some(ErrorCode::TooLarge)
        );
        // Exactly the maximum is fine.
        assert!(
            RenewClaims::from_wire(worker_id, Some(&good), &too_many[1..]).is_ok(),
            "{RENEW_LEASES_MAX} leases in all are allowed"
        );
        let refused = RenewClaims::from_wire(worker_id, Some(&good), &[lease_ref(), bad])
            .expect_err("a bad LeaseRef in more_leases");
        assert_eq!(refused.error_code(), Some(ErrorCode::InvalidField));
        assert!(
            refused.message.starts_with("more_leases[1]: "),
            "{refused:?}"
        );
        // The same attempt twice, wherever it is named.
        let twice = RenewClaims::from_wire(worker_id, Some(&good), &[lease_ref(), good.clone()])
            .expect_err("an attempt named twice");
        assert_eq!(twice.error_code(), Some(ErrorCode::InvalidField));
        assert!(twice.message.contains(&good.attempt_id), "{twice:?}");
    }
}
