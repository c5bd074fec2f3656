//! Enrollment tokens (issue 44): an operator issues one for one worker id, bound to
//! organizations and capabilities, expiring; dispatch uses it once to register the worker,
//! assign it and record its key. PostgreSQL keeps the SHA-256 of a token's secret, never the
//! secret, and every issue, revocation and use is in `admin_changes`. Everything here uses the
//! database's clock.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::audit::Change;
use crate::bus_identities::{Holder, record_credential_in};
use crate::sql;
use crate::states::AdminAction;

/// A token to issue.
#[derive(Debug, Clone)]
pub struct NewToken<'a> {
    pub token_id: Uuid,
    pub worker_id: Uuid,
    pub worker_name: &'a str,
    pub capacity: i32,
    pub secret_sha256: &'a [u8],
    pub organization_ids: &'a [Uuid],
    pub capabilities: &'a [String],
    /// The worker's own NATS account (`A…`).
    pub account_public_key: &'a str,
    pub ttl: std::time::Duration,
}

/// What issuing a token did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CreateOutcome {
    Created {
        expires_at: DateTime<Utc>,
    },
    /// These organizations do not exist; nothing was written.
    UnknownOrganizations(Vec<Uuid>),
}

/// Issues a token, recording who issued it and why.
pub async fn create_token(
    pool: &PgPool,
    token: &NewToken<'_>,
    change: &Change<'_>,
) -> Result<CreateOutcome, StoreError> {
    let (unknown, expires_at): (Vec<Uuid>, Option<DateTime<Utc>>) =
        sql::enrollment_tokens::Create {
            token_id: token.token_id,
            worker_id: token.worker_id,
            worker_name: token.worker_name,
            capacity: token.capacity,
            secret_sha256: token.secret_sha256,
            organization_ids: token.organization_ids,
            capabilities: token.capabilities,
            account_public_key: token.account_public_key,
            ttl_seconds: token.ttl.as_secs_f64(),
            change_id: change.id(),
            who: change.by,
            why: change.reason,
            token_created_action: AdminAction::EnrollmentTokenCreated.as_str(),
        }
        .query_as()
        .fetch_one(pool)
        .await?;
    Ok(match expires_at {
        Some(expires_at) if unknown.is_empty() => CreateOutcome::Created { expires_at },
        _ => CreateOutcome::UnknownOrganizations(unknown),
    })
}

/// Revokes a token not used yet; false when there is none such.
pub async fn revoke_token(
    pool: &PgPool,
    token_id: Uuid,
    change: &Change<'_>,
) -> Result<bool, StoreError> {
    let revoked: Option<Uuid> = sql::enrollment_tokens::Revoke {
        token_id,
        change_id: change.id(),
        who: change.by,
        why: change.reason,
        token_revoked_action: AdminAction::EnrollmentTokenRevoked.as_str(),
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(revoked.is_some())
}

/// A token as `palisade worker token list` shows it (never its secret).
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct TokenView {
    pub id: Uuid,
    pub worker_id: Uuid,
    pub worker_name: String,
    pub organization_ids: Vec<Uuid>,
    pub capabilities: Vec<String>,
    pub issued_by: String,
    pub created_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    pub used_at: Option<DateTime<Utc>>,
    pub used_by_key: Option<String>,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revoked_by: Option<String>,
}

/// The newest `limit` tokens; with `include_spent` false only those still usable.
pub async fn list_tokens(
    pool: &PgPool,
    include_spent: bool,
    limit: i64,
) -> Result<Vec<TokenView>, StoreError> {
    Ok(sql::enrollment_tokens::List {
        include_spent,
        limit,
    }
    .query_as()
    .fetch_all(pool)
    .await?)
}

/// An enrollment as the worker asks for it.
#[derive(Debug, Clone)]
pub struct EnrollClaim<'a> {
    /// The worker id of the subject it was sent on.
    pub worker_id: Uuid,
    pub token_id: Uuid,
    /// SHA-256 of the secret the worker sent.
    pub secret_sha256: &'a [u8],
    /// The worker's NATS user key.
    pub public_key: &'a str,
    /// What it asks for; empty: all of the token's.
    pub organization_ids: &'a [Uuid],
    pub capabilities: &'a [String],
}

/// What an enrollment decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnrollOutcome {
    Enrolled {
        account_public_key: String,
        organization_ids: Vec<Uuid>,
        capabilities: Vec<String>,
    },
    /// Nothing was written; the reason is safe to tell the worker.
    Refused(String),
}

/// The token as an enrollment reads it.
#[derive(Debug, sqlx::FromRow)]
struct LockedToken {
    worker_id: Uuid,
    worker_name: String,
    capacity: i32,
    secret_sha256: Vec<u8>,
    organization_ids: Vec<Uuid>,
    capabilities: Vec<String>,
    account_public_key: String,
    issued_by: String,
    used: bool,
    used_by_key: Option<String>,
    revoked: bool,
    expired: bool,
}

/// Enrolls a worker with a token, once: in one transaction the token is locked and checked
/// (its worker, secret, use, revocation, expiry, and that the claim asks no more than it
/// carries), marked used, the worker registered (limited to the token's capabilities),
/// assigned its organizations and its key recorded, each change in `admin_changes` with the
/// token and who issued it as the actor.
///
/// The same enrollment sent again (same token, secret and key: its answer was lost) is
/// answered again without writing, while the worker may serve and the key is its current
/// one: the answer is only of use to the holder of that key's seed.
pub async fn enroll(pool: &PgPool, claim: &EnrollClaim<'_>) -> Result<EnrollOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let token: Option<LockedToken> = sql::enrollment_tokens::Lock {
        token_id: claim.token_id,
    }
    .query_as()
    .fetch_optional(&mut *tx)
    .await?;
    let Some(token) = token else {
        return Ok(refused("no such token"));
    };
    let (organization_ids, capabilities) = match check(&token, claim) {
        Err(reason) => return Ok(EnrollOutcome::Refused(reason)),
        Ok(Checked::Again(granted)) => {
            drop(tx);
            return Ok(
                match renewal(pool, token.worker_id, claim.public_key).await? {
                    RenewalOutcome::Renew { account_public_key } => EnrollOutcome::Enrolled {
                        account_public_key,
                        organization_ids: granted.0,
                        capabilities: granted.1,
                    },
                    RenewalOutcome::Refused(reason) => EnrollOutcome::Refused(reason),
                },
            );
        }
        Ok(Checked::First(granted)) => granted,
    };
    if let Some(refusal) =
        write_enrollment(&mut tx, &token, claim, &organization_ids, &capabilities).await?
    {
        return Ok(refusal);
    }
    tx.commit().await?;
    Ok(EnrollOutcome::Enrolled {
        account_public_key: token.account_public_key,
        organization_ids,
        capabilities,
    })
}

/// A token's first use, in the enrollment's transaction: the worker registered (or refused
/// when revoked), the token marked used, the organizations assigned, the key recorded.
async fn write_enrollment(
    conn: &mut sqlx::PgConnection,
    token: &LockedToken,
    claim: &EnrollClaim<'_>,
    organization_ids: &[Uuid],
    capabilities: &[String],
) -> Result<Option<EnrollOutcome>, StoreError> {
    let serves: bool = sql::workers::Enroll {
        worker_id: token.worker_id,
        name: &token.worker_name,
        capacity: token.capacity,
        allowed_capabilities: capabilities,
        nats_account: &token.account_public_key,
    }
    .query_scalar()
    .fetch_one(&mut *conn)
    .await?;
    if !serves {
        return Ok(Some(refused(
            "the worker is revoked: an operator must re-enable it (`palisade worker enable`) and issue a new token",
        )));
    }
    let used: Option<Uuid> = sql::enrollment_tokens::Use {
        token_id: claim.token_id,
        public_key: claim.public_key,
        change_id: Uuid::now_v7(),
        organization_ids,
        capabilities,
        worker_enrolled_action: AdminAction::WorkerEnrolled.as_str(),
    }
    .query_scalar()
    .fetch_optional(&mut *conn)
    .await?;
    if used.is_none() {
        return Ok(Some(refused("the token was used or revoked")));
    }
    let actor = format!(
        "enrollment token {} issued by {}",
        claim.token_id, token.issued_by
    );
    let change = Change::new(&actor, "");
    for organization_id in organization_ids {
        sql::organization_workers::Assign {
            organization_id: *organization_id,
            worker_id: token.worker_id,
            change_id: change.id(),
            who: change.by,
            why: change.reason,
            assignment_added_action: AdminAction::AssignmentAdded.as_str(),
        }
        .query_scalar::<Uuid>()
        .fetch_one(&mut *conn)
        .await?;
    }
    record_credential_in(conn, &Holder::Worker(token.worker_id), claim.public_key).await?;
    Ok(None)
}

/// What a claim on a token is granted: its organizations and capabilities.
type Granted = (Vec<Uuid>, Vec<String>);

/// A claim that passed the token's checks.
enum Checked {
    /// The token's first use.
    First(Granted),
    /// The use that spent it, sent again with the same key.
    Again(Granted),
}

/// What the claim is granted, or why it is refused.
fn check(token: &LockedToken, claim: &EnrollClaim<'_>) -> Result<Checked, String> {
    // Every check a stranger could probe answers alike up to the secret: a wrong worker id or
    // secret says nothing of the token's state.
    let secret_matches = constant_time_eq(&token.secret_sha256, claim.secret_sha256);
    if token.worker_id != claim.worker_id || !secret_matches {
        return Err("no such token".into());
    }
    if token.revoked {
        return Err("the token was revoked".into());
    }
    let again = token.used && token.used_by_key.as_deref() == Some(claim.public_key);
    if token.used && !again {
        return Err("the token was used already: a token enrolls once".into());
    }
    if token.expired && !again {
        return Err("the token expired: ask for a new one".into());
    }
    let organization_ids = within(claim.organization_ids, &token.organization_ids, |extra| {
        format!("organization {extra} is not among the token's; ask only for its organizations")
    })?;
    let capabilities = within(claim.capabilities, &token.capabilities, |extra| {
        format!("capability {extra:?} is not among the token's; ask only for its capabilities")
    })?;
    let granted = (organization_ids, capabilities);
    Ok(if again {
        Checked::Again(granted)
    } else {
        Checked::First(granted)
    })
}

/// What a claim is granted of a list its token carries: all of it when it asks for nothing,
/// else what it asks (each once), refused naming the first item the token does not carry.
fn within<T: Ord + Clone>(
    asked: &[T],
    carried: &[T],
    refusal: impl Fn(&T) -> String,
) -> Result<Vec<T>, String> {
    if asked.is_empty() {
        return Ok(carried.to_vec());
    }
    if let Some(extra) = asked.iter().find(|item| !carried.contains(item)) {
        return Err(refusal(extra));
    }
    let mut granted = asked.to_vec();
    granted.sort();
    granted.dedup();
    Ok(granted)
}

fn constant_time_eq(left: &[u8], right: &[u8]) -> bool {
    left.len() == right.len()
        && left
            .iter()
            .zip(right)
            .fold(0_u8, |diff, (a, b)| diff | (a ^ b))
            == 0
}

fn refused(reason: &str) -> EnrollOutcome {
    EnrollOutcome::Refused(reason.to_owned())
}

/// What renewing a worker's credentials decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RenewalOutcome {
    /// Sign a new user JWT for the key in this account.
    Renew {
        account_public_key: String,
    },
    Refused(String),
}

/// Whether `worker_id` may have its credentials for `public_key` renewed: it enrolled, may
/// serve, and the key is its current one.
pub async fn renewal(
    pool: &PgPool,
    worker_id: Uuid,
    public_key: &str,
) -> Result<RenewalOutcome, StoreError> {
    let row: Option<(Option<String>, bool, bool)> = sql::workers::Credentials {
        worker_id,
        public_key,
    }
    .query_as()
    .fetch_optional(pool)
    .await?;
    Ok(match row {
        None => RenewalOutcome::Refused("no such worker".into()),
        Some((None, _, _)) => RenewalOutcome::Refused(
            "the worker did not enroll: its credentials come from `palisade worker add`".into(),
        ),
        Some((Some(_), false, _)) => RenewalOutcome::Refused(
            "the worker is revoked: an operator must re-enable it and issue a new token".into(),
        ),
        Some((Some(_), true, false)) => RenewalOutcome::Refused(
            "that key is not the worker's current one: renew with the key it enrolled".into(),
        ),
        Some((Some(account_public_key), true, true)) => {
            RenewalOutcome::Renew { account_public_key }
        }
    })
}
