//! palisade's leader lease (ADR-117, SPEC §4.5): elects one replica to run a periodic loop.
//!
//! A named lease is held by one owner until an expiry. [`Store::acquire`] takes it when it is
//! free, expired or already the caller's (sticky: the term keeps its start); [`Store::renew`]
//! only extends the caller's own unexpired lease and never creates one, so a renewal that lands
//! after a release cannot resurrect it; [`Store::release`] gives it up and reports
//! [`Release::Lost`] when it had moved on. [`PgStore`] and [`MemoryStore`] are twins that pass one
//! conformance suite. The clock is the caller's, passed as `now` and kept to the millisecond by
//! both twins, so a test decides what time it is.
//!
//! [`run`] serves terms: it campaigns every retry interval, runs the work while the lease is
//! held, renews every TTL/3 and steps down fail-closed, before the store could hand the lease
//! to a successor. A lease is for load, not exclusion: the work it elects must already be safe
//! to run twice, because a stalled holder overlaps its successor for the length of the stall.
//!
//! ```no_run
//! # async fn example(pool: sqlx::PgPool) -> Result<(), lease::LeaseError> {
//! let shutdown = lease::CancellationToken::new();
//! let election = lease::Election::new(
//!     lease::PgStore::new(pool),
//!     lease::SystemClock,
//!     lease::names::REAPER,
//!     lease::owner_id("reaper-0"),
//!     lease::RunConfig::new(
//!         std::time::Duration::from_secs(30),
//!         std::time::Duration::from_secs(5),
//!     )?,
//! );
//! let is_leader = election.watch();
//! election
//!     .run(|term| async move { term.ended().await }, shutdown)
//!     .await;
//! # drop(is_leader);
//! # Ok(())
//! # }
//! ```

mod clock;
mod memory;
pub mod names;
mod postgres;
mod run;

#[cfg(any(test, feature = "conformance"))]
pub mod conformance;

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use thiserror::Error;

pub use clock::{Clock, ManualClock, SystemClock};
pub use memory::MemoryStore;
pub use postgres::PgStore;
pub use run::{Election, RunConfig, TermGuard, run};
pub use tokio_util::sync::CancellationToken;

/// The longest lease a store grants. A longer one is a misconfiguration (seconds read as
/// milliseconds), and the bound keeps `now + ttl` far from chrono's range limits.
pub const TTL_MAX: Duration = Duration::from_secs(24 * 60 * 60);

/// The shortest lease a store grants: both twins keep time to the millisecond.
pub const STORE_TTL_MIN: Duration = Duration::from_millis(1);

/// One term of a lease as the store granted it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    pub name: String,
    pub owner: String,
    /// When this owner's unbroken holding began; a sticky re-acquire keeps it.
    pub started_at: DateTime<Utc>,
    /// The instant from which any other owner may take the lease.
    pub expires_at: DateTime<Utc>,
}

/// What a renewal achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The caller's lease now lasts until `expires_at`.
    Renewed { expires_at: DateTime<Utc> },
    /// Not the caller's, expired, or released: the caller must stop acting as the holder.
    Refused,
}

/// What a release achieved.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// The caller held the lease until now; anyone may take it at once.
    Released,
    /// The lease was not the caller's any more: expired, taken by another, or never held.
    Lost,
}

/// Failures of a lease operation. Refusals are not errors: they are [`Renewal::Refused`],
/// [`Release::Lost`] and `acquire` returning `None`.
#[derive(Debug, Error)]
pub enum LeaseError {
    #[error("lease ttl {ttl:?} is out of range: use {min:?} to {max:?}")]
    InvalidTtl {
        ttl: Duration,
        min: Duration,
        max: Duration,
    },
    #[error(
        "lease retry interval {retry:?} is out of range: use more than zero and at most {max:?}"
    )]
    InvalidRetry { retry: Duration, max: Duration },
    /// The store did not answer or failed; nobody is elected on it.
    #[error("lease store failed: {0}")]
    Store(#[source] Box<dyn std::error::Error + Send + Sync>),
}

impl From<sqlx::Error> for LeaseError {
    fn from(error: sqlx::Error) -> Self {
        LeaseError::Store(Box::new(error))
    }
}

/// Where leases live. Every operation is atomic on its own (one statement for PostgreSQL) and
/// decides with the caller's `now`, truncated to the millisecond; a lease is expired from the
/// instant `expires_at <= now`.
pub trait Store: Send + Sync {
    /// Takes `name` for `owner` until `now + ttl` when it is free, expired, or already
    /// `owner`'s. An unexpired lease of `owner`'s keeps its term start (sticky) and its expiry
    /// if that is later; any other take starts a new term at `now`. `None` when another owner
    /// holds it.
    fn acquire(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Option<Term>, LeaseError>> + Send;

    /// Extends `owner`'s unexpired lease to `now + ttl`, or keeps its expiry if that is later:
    /// a request that lands late carries an older `now` and must not shorten a lease its sender
    /// has since renewed. Never creates a lease, so a renewal that lands after a release or an
    /// expiry is refused.
    fn renew(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> impl Future<Output = Result<Renewal, LeaseError>> + Send;

    /// Gives up `owner`'s unexpired lease so another may take it at once.
    fn release(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
    ) -> impl Future<Output = Result<Release, LeaseError>> + Send;
}

/// An owner id for this process: `prefix` (the host name, say) and a random suffix, so two
/// processes on one host never share an owner, which would make both of them the holder.
pub fn owner_id(prefix: &str) -> String {
    let suffix = uuid::Uuid::new_v4().simple().to_string();
    format!("{prefix}-{}", &suffix[..OWNER_SUFFIX_LEN])
}

/// Hex digits of randomness in an owner id: 32 bits, plenty among a deployment's replicas.
const OWNER_SUFFIX_LEN: usize = 8;

/// `now` truncated to the millisecond, and the expiry `ttl` after it, as both twins store them.
pub(crate) fn term_bounds(
    now: DateTime<Utc>,
    ttl: Duration,
) -> Result<(DateTime<Utc>, DateTime<Utc>), LeaseError> {
    let invalid = || LeaseError::InvalidTtl {
        ttl,
        min: STORE_TTL_MIN,
        max: TTL_MAX,
    };
    if !(STORE_TTL_MIN..=TTL_MAX).contains(&ttl) {
        return Err(invalid());
    }
    let now = truncate_to_millis(now);
    let ttl_ms = i64::try_from(ttl.as_millis()).map_err(|_| invalid())?;
    let expires_at = now
        .checked_add_signed(TimeDelta::milliseconds(ttl_ms))
        .ok_or_else(invalid)?;
    Ok((now, expires_at))
}

/// `at` without its sub-millisecond part (towards the past, also before 1970).
pub(crate) fn truncate_to_millis(at: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(at.timestamp_millis())
        .expect("a timestamp truncated to milliseconds is in range")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn term_bounds_truncate_to_the_millisecond() {
        let now = DateTime::parse_from_rfc3339("2026-01-01T00:00:00.123987654Z")
            .unwrap()
            .to_utc();
        let (start, end) = term_bounds(now, Duration::from_micros(30_000_999)).unwrap();
        assert_eq!(start.to_rfc3339(), "2026-01-01T00:00:00.123+00:00");
        assert_eq!(end.to_rfc3339(), "2026-01-01T00:00:30.123+00:00");
    }

    #[test]
    fn truncation_goes_towards_the_past_before_1970() {
        let before_epoch = DateTime::from_timestamp(-1, 999_999_999).unwrap();
        assert_eq!(truncate_to_millis(before_epoch).timestamp_millis(), -1);
    }

    #[test]
    fn ttl_out_of_range_is_refused() {
        let now = Utc::now();
        for ttl in [Duration::ZERO, Duration::from_micros(999), TTL_MAX * 2] {
            assert!(matches!(
                term_bounds(now, ttl),
                Err(LeaseError::InvalidTtl { .. })
            ));
        }
        assert!(term_bounds(now, STORE_TTL_MIN).is_ok());
        assert!(term_bounds(now, TTL_MAX).is_ok());
    }

    #[test]
    fn owner_ids_differ_per_call() {
        let first = owner_id("host");
        assert!(first.starts_with("host-"));
        assert_eq!(first.len(), "host-".len() + OWNER_SUFFIX_LEN);
        assert_ne!(first, owner_id("host"));
    }
}
