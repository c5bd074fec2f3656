//! The one conformance suite every [`Store`] passes: [`run_all`] against a store, each case
//! on lease names of its own, with the clock passed explicitly (ADR-117 §1, invariant I9).
//!
//! ```ignore
//! #[tokio::test]
//! async fn my_store_conforms() {
//!     lease::conformance::run_all(&MyStore::connect().await).await;
//! }
//! ```

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::Barrier;

use crate::{LeaseError, Release, Renewal, Store, Term};

/// The lease length every case uses.
const TTL: Duration = Duration::from_secs(30);

/// Concurrent acquirers in the race cases; the PostgreSQL test keeps this many connections.
pub const ACQUIRERS_CONCURRENT: usize = 16;

/// Runs every case against `store`. Panics, naming the case, on the first behaviour that
/// differs from the contract. Cases use fresh lease names, so a store may hold other leases.
pub async fn run_all<S: Store + Clone + 'static>(store: &S) {
    acquire_takes_a_free_lease(store).await;
    acquire_is_refused_while_another_holds(store).await;
    competing_acquirers_of_a_free_lease_elect_one(store).await;
    competing_acquirers_of_an_expired_lease_elect_one(store).await;
    holder_reacquires_the_same_term(store).await;
    another_acquires_from_the_expiry_instant(store).await;
    own_expired_lease_starts_a_new_term(store).await;
    renew_by_owner_extends(store).await;
    late_requests_never_shorten_a_lease(store).await;
    renew_after_expiry_is_refused(store).await;
    renew_by_non_owner_is_refused_and_changes_nothing(store).await;
    renew_after_release_is_refused_and_creates_nothing(store).await;
    renew_of_a_never_held_lease_creates_nothing(store).await;
    release_by_owner_frees_the_lease_at_once(store).await;
    release_after_the_lease_moved_on_is_lost(store).await;
    release_after_expiry_is_lost(store).await;
    release_of_a_never_held_lease_is_lost(store).await;
    names_are_independent(store).await;
    time_is_kept_to_the_millisecond(store).await;
    out_of_range_ttl_is_an_error(store).await;
}

/// A fixed instant with sub-millisecond digits, which every store must truncate away.
fn t0() -> DateTime<Utc> {
    DateTime::parse_from_rfc3339("2026-11-29T12:00:00.250750Z")
        .expect("valid timestamp")
        .to_utc()
}

fn t0_ms() -> DateTime<Utc> {
    crate::truncate_to_millis(t0())
}

fn after(at: DateTime<Utc>, by: Duration) -> DateTime<Utc> {
    at + TimeDelta::from_std(by).expect("small duration")
}

fn ms(n: i64) -> TimeDelta {
    TimeDelta::milliseconds(n)
}

/// A lease name no other case (or earlier run on the same store) uses.
fn fresh_name(case: &str) -> String {
    format!("conformance-{case}-{}", uuid::Uuid::new_v4().simple())
}

async fn acquire<S: Store>(store: &S, name: &str, owner: &str, now: DateTime<Utc>) -> Option<Term> {
    store
        .acquire(name, owner, now, TTL)
        .await
        .unwrap_or_else(|error| panic!("acquire {name} by {owner} failed: {error}"))
}

async fn renew<S: Store>(store: &S, name: &str, owner: &str, now: DateTime<Utc>) -> Renewal {
    store
        .renew(name, owner, now, TTL)
        .await
        .unwrap_or_else(|error| panic!("renew {name} by {owner} failed: {error}"))
}

async fn release<S: Store>(store: &S, name: &str, owner: &str, now: DateTime<Utc>) -> Release {
    store
        .release(name, owner, now)
        .await
        .unwrap_or_else(|error| panic!("release {name} by {owner} failed: {error}"))
}

pub async fn acquire_takes_a_free_lease<S: Store>(store: &S) {
    let name = fresh_name("free");
    let term = acquire(store, &name, "a", t0()).await;
    assert_eq!(
        term,
        Some(Term {
            name: name.clone(),
            owner: "a".into(),
            started_at: t0_ms(),
            expires_at: after(t0_ms(), TTL),
        }),
        "acquire_takes_a_free_lease"
    );
}

pub async fn acquire_is_refused_while_another_holds<S: Store>(store: &S) {
    let name = fresh_name("held");
    acquire(store, &name, "a", t0()).await.expect("free lease");
    let just_before_expiry = after(t0_ms(), TTL) - ms(1);
    assert_eq!(
        acquire(store, &name, "b", just_before_expiry).await,
        None,
        "acquire_is_refused_while_another_holds"
    );
}

pub async fn competing_acquirers_of_a_free_lease_elect_one<S: Store + Clone + 'static>(store: &S) {
    let name = fresh_name("race-free");
    let winners = race(store, &name, t0()).await;
    assert_eq!(
        winners.len(),
        1,
        "competing_acquirers_of_a_free_lease_elect_one: winners {winners:?}"
    );
    assert_eq!(winners[0].started_at, t0_ms());
}

pub async fn competing_acquirers_of_an_expired_lease_elect_one<S: Store + Clone + 'static>(
    store: &S,
) {
    let name = fresh_name("race-expired");
    acquire(store, &name, "previous", t0())
        .await
        .expect("free lease");
    let expired = after(t0(), TTL);
    let winners = race(store, &name, expired).await;
    assert_eq!(
        winners.len(),
        1,
        "competing_acquirers_of_an_expired_lease_elect_one: winners {winners:?}"
    );
    assert_eq!(winners[0].started_at, crate::truncate_to_millis(expired));
}

/// [`ACQUIRERS_CONCURRENT`] owners acquire `name` at one instant, released by one barrier.
async fn race<S: Store + Clone + 'static>(store: &S, name: &str, now: DateTime<Utc>) -> Vec<Term> {
    let barrier = Arc::new(Barrier::new(ACQUIRERS_CONCURRENT));
    let mut acquirers = tokio::task::JoinSet::new();
    for index in 0..ACQUIRERS_CONCURRENT {
        let (store, barrier, name) = (store.clone(), barrier.clone(), name.to_owned());
        acquirers.spawn(async move {
            barrier.wait().await;
            acquire(&store, &name, &format!("racer-{index}"), now).await
        });
    }
    let mut winners = Vec::new();
    while let Some(joined) = acquirers.join_next().await {
        winners.extend(joined.expect("acquirer did not panic"));
    }
    winners
}

pub async fn holder_reacquires_the_same_term<S: Store>(store: &S) {
    let name = fresh_name("sticky");
    let first = acquire(store, &name, "a", t0()).await.expect("free lease");
    let later = after(t0(), TTL / 2);
    let second = acquire(store, &name, "a", later)
        .await
        .expect("holder_reacquires_the_same_term: own lease");
    assert_eq!(
        second.started_at, first.started_at,
        "holder_reacquires_the_same_term: term start kept"
    );
    assert_eq!(
        second.expires_at,
        after(crate::truncate_to_millis(later), TTL),
        "holder_reacquires_the_same_term: expiry extended"
    );
}

pub async fn another_acquires_from_the_expiry_instant<S: Store>(store: &S) {
    let name = fresh_name("expiry");
    let first = acquire(store, &name, "a", t0()).await.expect("free lease");
    let second = acquire(store, &name, "b", first.expires_at)
        .await
        .expect("another_acquires_from_the_expiry_instant: expired at expires_at");
    assert_eq!(second.owner, "b");
    assert_eq!(
        second.started_at, first.expires_at,
        "another_acquires_from_the_expiry_instant: a new term"
    );
    assert_eq!(
        acquire(store, &name, "a", first.expires_at).await,
        None,
        "another_acquires_from_the_expiry_instant: the old holder is out"
    );
}

pub async fn own_expired_lease_starts_a_new_term<S: Store>(store: &S) {
    let name = fresh_name("own-expired");
    let first = acquire(store, &name, "a", t0()).await.expect("free lease");
    let later = after(first.expires_at, Duration::from_secs(1));
    let second = acquire(store, &name, "a", later)
        .await
        .expect("own_expired_lease_starts_a_new_term: expired lease");
    assert_eq!(
        second.started_at, later,
        "own_expired_lease_starts_a_new_term: a holder that lapsed must start afresh"
    );
}

pub async fn renew_by_owner_extends<S: Store>(store: &S) {
    let name = fresh_name("renew");
    let first = acquire(store, &name, "a", t0()).await.expect("free lease");
    let later = after(t0_ms(), TTL / 3);
    let extended = after(later, TTL);
    assert_eq!(
        renew(store, &name, "a", later).await,
        Renewal::Renewed {
            expires_at: extended
        },
        "renew_by_owner_extends"
    );
    assert_eq!(
        acquire(store, &name, "b", first.expires_at).await,
        None,
        "renew_by_owner_extends: held past the old expiry"
    );
    let again = acquire(store, &name, "a", first.expires_at)
        .await
        .expect("renew_by_owner_extends: still the holder's");
    assert_eq!(
        again.started_at, first.started_at,
        "renew_by_owner_extends: the same term"
    );
}

pub async fn late_requests_never_shorten_a_lease<S: Store>(store: &S) {
    let name = fresh_name("late");
    acquire(store, &name, "a", t0()).await.expect("free lease");
    let renewed_at = after(t0_ms(), TTL / 2);
    let extended = after(renewed_at, TTL);
    assert_eq!(
        renew(store, &name, "a", renewed_at).await,
        Renewal::Renewed {
            expires_at: extended
        }
    );
    // Requests sent earlier, with an earlier `now`, that land only now.
    let sent_earlier = after(t0_ms(), TTL / 3);
    assert_eq!(
        renew(store, &name, "a", sent_earlier).await,
        Renewal::Renewed {
            expires_at: extended
        },
        "late_requests_never_shorten_a_lease: renew"
    );
    let sticky = acquire(store, &name, "a", sent_earlier)
        .await
        .expect("own lease");
    assert_eq!(
        sticky.expires_at, extended,
        "late_requests_never_shorten_a_lease: acquire"
    );
    assert_eq!(
        acquire(store, &name, "b", after(sent_earlier, TTL)).await,
        None,
        "late_requests_never_shorten_a_lease: another took a lease its holder renewed"
    );
}

pub async fn renew_after_expiry_is_refused<S: Store>(store: &S) {
    let name = fresh_name("renew-expired");
    let first = acquire(store, &name, "a", t0()).await.expect("free lease");
    assert_eq!(
        renew(store, &name, "a", first.expires_at).await,
        Renewal::Refused,
        "renew_after_expiry_is_refused: expired at expires_at"
    );
    acquire(store, &name, "b", first.expires_at)
        .await
        .expect("renew_after_expiry_is_refused: a refused renewal must not extend");
}

pub async fn renew_by_non_owner_is_refused_and_changes_nothing<S: Store>(store: &S) {
    let name = fresh_name("renew-foreign");
    let first = acquire(store, &name, "a", t0()).await.expect("free lease");
    let later = after(t0(), TTL / 2);
    assert_eq!(
        renew(store, &name, "b", later).await,
        Renewal::Refused,
        "renew_by_non_owner_is_refused_and_changes_nothing"
    );
    let taken = acquire(store, &name, "c", first.expires_at)
        .await
        .expect("renew_by_non_owner_is_refused_and_changes_nothing: expiry unchanged");
    assert_eq!(taken.owner, "c");
}

pub async fn renew_after_release_is_refused_and_creates_nothing<S: Store>(store: &S) {
    let name = fresh_name("renew-released");
    acquire(store, &name, "a", t0()).await.expect("free lease");
    assert_eq!(release(store, &name, "a", t0()).await, Release::Released);
    assert_eq!(
        renew(store, &name, "a", t0()).await,
        Renewal::Refused,
        "renew_after_release_is_refused_and_creates_nothing"
    );
    let taken = acquire(store, &name, "b", t0())
        .await
        .expect("renew_after_release_is_refused_and_creates_nothing: a renewal resurrected");
    assert_eq!(taken.started_at, t0_ms());
}

pub async fn renew_of_a_never_held_lease_creates_nothing<S: Store>(store: &S) {
    let name = fresh_name("renew-never");
    assert_eq!(
        renew(store, &name, "a", t0()).await,
        Renewal::Refused,
        "renew_of_a_never_held_lease_creates_nothing"
    );
    acquire(store, &name, "b", t0())
        .await
        .expect("renew_of_a_never_held_lease_creates_nothing: a renewal created a lease");
}

pub async fn release_by_owner_frees_the_lease_at_once<S: Store>(store: &S) {
    let name = fresh_name("release");
    acquire(store, &name, "a", t0()).await.expect("free lease");
    let later = after(t0(), TTL / 2);
    assert_eq!(
        release(store, &name, "a", later).await,
        Release::Released,
        "release_by_owner_frees_the_lease_at_once"
    );
    let taken = acquire(store, &name, "b", later)
        .await
        .expect("release_by_owner_frees_the_lease_at_once: free at the release instant");
    assert_eq!(taken.started_at, crate::truncate_to_millis(later));
    assert_eq!(
        release(store, &name, "a", later).await,
        Release::Lost,
        "release_by_owner_frees_the_lease_at_once: a second release"
    );
}

pub async fn release_after_the_lease_moved_on_is_lost<S: Store>(store: &S) {
    let name = fresh_name("release-moved");
    let first = acquire(store, &name, "a", t0()).await.expect("free lease");
    let second = acquire(store, &name, "b", first.expires_at)
        .await
        .expect("expired lease");
    assert_eq!(
        release(store, &name, "a", first.expires_at).await,
        Release::Lost,
        "release_after_the_lease_moved_on_is_lost"
    );
    assert_eq!(
        renew(store, &name, "b", first.expires_at).await,
        Renewal::Renewed {
            expires_at: second.expires_at
        },
        "release_after_the_lease_moved_on_is_lost: the new holder keeps it"
    );
}

pub async fn release_after_expiry_is_lost<S: Store>(store: &S) {
    let name = fresh_name("release-expired");
    let first = acquire(store, &name, "a", t0()).await.expect("free lease");
    assert_eq!(
        release(store, &name, "a", first.expires_at).await,
        Release::Lost,
        "release_after_expiry_is_lost"
    );
}

pub async fn release_of_a_never_held_lease_is_lost<S: Store>(store: &S) {
    let name = fresh_name("release-never");
    assert_eq!(
        release(store, &name, "a", t0()).await,
        Release::Lost,
        "release_of_a_never_held_lease_is_lost"
    );
}

pub async fn names_are_independent<S: Store>(store: &S) {
    let (one, two) = (fresh_name("names-one"), fresh_name("names-two"));
    acquire(store, &one, "a", t0()).await.expect("free lease");
    acquire(store, &two, "b", t0())
        .await
        .expect("names_are_independent: another name is free");
    assert_eq!(release(store, &one, "a", t0()).await, Release::Released);
    assert_eq!(
        acquire(store, &two, "c", t0()).await,
        None,
        "names_are_independent: releasing one name freed another"
    );
    assert_eq!(
        renew(store, &two, "a", t0()).await,
        Renewal::Refused,
        "names_are_independent: a holder of one name renewed another"
    );
}

pub async fn time_is_kept_to_the_millisecond<S: Store>(store: &S) {
    let name = fresh_name("millis");
    let first = acquire(store, &name, "a", t0()).await.expect("free lease");
    assert_eq!(first.expires_at, after(t0_ms(), TTL));
    // 0.9 ms before the expiry truncates to the millisecond before it: still held.
    let almost = first.expires_at - TimeDelta::microseconds(900);
    assert_eq!(
        acquire(store, &name, "b", almost).await,
        None,
        "time_is_kept_to_the_millisecond: held until expires_at"
    );
    // 0.9 ms after the expiry truncates to the expiry itself: expired.
    let just_after = first.expires_at + TimeDelta::microseconds(900);
    let second = acquire(store, &name, "b", just_after)
        .await
        .expect("time_is_kept_to_the_millisecond: expired at expires_at");
    assert_eq!(second.started_at, first.expires_at);
}

pub async fn out_of_range_ttl_is_an_error<S: Store>(store: &S) {
    let name = fresh_name("ttl");
    let acquired = store.acquire(&name, "a", t0(), Duration::ZERO).await;
    assert!(
        matches!(acquired, Err(LeaseError::InvalidTtl { .. })),
        "out_of_range_ttl_is_an_error: acquire gave {acquired:?}"
    );
    acquire(store, &name, "a", t0()).await.expect("free lease");
    let renewed = store.renew(&name, "a", t0(), crate::TTL_MAX * 2).await;
    assert!(
        matches!(renewed, Err(LeaseError::InvalidTtl { .. })),
        "out_of_range_ttl_is_an_error: renew gave {renewed:?}"
    );
}

#[cfg(test)]
mod tests {
    use crate::MemoryStore;

    #[tokio::test]
    async fn memory_store_conforms() {
        super::run_all(&MemoryStore::new()).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn memory_store_conforms_on_many_threads() {
        super::competing_acquirers_of_a_free_lease_elect_one(&MemoryStore::new()).await;
        super::competing_acquirers_of_an_expired_lease_elect_one(&MemoryStore::new()).await;
    }
}
