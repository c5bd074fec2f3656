//! The hand-on: a scan's next plugin leased with a completion's acknowledgement, in
//! ingestion's transaction.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use messages::Subjects;
use sqlx::PgConnection;
use uuid::Uuid;

use super::{GrantedLease, LIVE_ATTEMPT_STATUSES, leased_events, replayed_leases, with_assets};
use crate::StoreError;
use crate::outbox::{self, Staged};
use crate::sql;
use crate::states::{AttemptStatus, TaskState};

/// A completion that asked for its scan's next plugin with its acknowledgement
/// (`TaskComplete.lease_next`), accepted now or earlier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NextAsk {
    pub worker_id: Uuid,
    /// The completed attempt: the request id the next lease is granted under.
    pub attempt_id: Uuid,
    /// The completion was accepted before (a resent one): what it was handed then, if
    /// anything, is answered again.
    pub repeated: bool,
}

/// Leases handed with completions (issues 24 and 46): each asking worker gets its scan's next
/// plugin when it offers the plugin, serves the scan's organization and has room, exactly as an
/// acquire would grant it, under the completed attempt's id as request id. A completion asked
/// again (its worker resent it) gets what the first ask granted.
///
/// It runs in ingestion's transaction, after the completions created the next tasks, so no
/// acquire can take a next task between two commits. The workers are share-locked, which keeps
/// their acquires out until this commits, and so is each assignment; room is counted under
/// those locks (`worker_tasks/grant_next.sql`). Each completion frees the slot the next lease
/// takes, so two ingestion transactions handing on to one worker at once never exceed its
/// capacity. The transaction already holds attempts, tasks and scans, and a revocation locks
/// the worker (or its assignment) before the attempts it voids, so the wait for a worker's row
/// is bounded by [`HAND_ON_LOCK_TIMEOUT`]: past it, this fails with `lock_not_available` and
/// the caller undoes the hand-off alone (the worker acquires its next plugin as usual, and the
/// revocation goes on). An acquire never waits for a lock ingestion holds, so the wait is
/// normally one acquire's commit.
/// Four statements for any number of asks (the lock timeout set and set back, the grant, the
/// assets), five when one was accepted before (what it was handed then).
/// Returns the leases per completed attempt; asks that got nothing are absent.
pub(crate) async fn hand_on(
    conn: &mut PgConnection,
    staged: &mut Staged,
    subjects: &Subjects,
    asks: &[NextAsk],
    lease_ttl: Duration,
) -> Result<HashMap<Uuid, Vec<GrantedLease>>, StoreError> {
    if asks.is_empty() {
        return Ok(HashMap::new());
    }
    // Only a completion accepted before can have been handed a lease already.
    let repeated: Vec<&NextAsk> = asks.iter().filter(|ask| ask.repeated).collect();
    let replayed = if repeated.is_empty() {
        Vec::new()
    } else {
        replayed_leases(
            conn,
            repeated.iter().map(|ask| ask.worker_id).collect(),
            repeated.iter().map(|ask| ask.attempt_id).collect(),
        )
        .await?
    };
    let asked_before: HashSet<Uuid> = replayed
        .iter()
        .filter_map(|lease| lease.request_id)
        .collect();
    // A completion repeated within the batch asks once.
    let mut asking = HashSet::new();
    let (grant_workers, grant_requests): (Vec<Uuid>, Vec<Uuid>) = asks
        .iter()
        .filter(|ask| !asked_before.contains(&ask.attempt_id) && asking.insert(ask.attempt_id))
        .map(|ask| (ask.worker_id, ask.attempt_id))
        .unzip();
    let granted = if grant_workers.is_empty() {
        Vec::new()
    } else {
        grant_next(conn, &grant_workers, &grant_requests, lease_ttl).await?
    };
    outbox::stage(conn, staged, leased_events(subjects, &granted)).await?;
    let leases = with_assets(conn, replayed.into_iter().chain(granted).collect()).await?;
    let mut by_completion: HashMap<Uuid, Vec<GrantedLease>> = HashMap::new();
    for lease in leases {
        if let Some(request_id) = lease.request_id {
            by_completion.entry(request_id).or_default().push(lease);
        }
    }
    Ok(by_completion)
}

/// The grant of [`hand_on`], its wait for locks bounded by [`HAND_ON_LOCK_TIMEOUT`] (set for the
/// statement, then set back to what it was).
async fn grant_next(
    conn: &mut PgConnection,
    worker_ids: &[Uuid],
    request_ids: &[Uuid],
    lease_ttl: Duration,
) -> Result<Vec<GrantedLease>, StoreError> {
    let (previous_timeout, _): (String, String) = sql::database::SetLockTimeout {
        lock_timeout: HAND_ON_LOCK_TIMEOUT,
    }
    .query_as()
    .fetch_one(&mut *conn)
    .await?;
    let granted = sql::worker_tasks::GrantNext {
        worker_ids,
        request_ids,
        lease_ttl_seconds: crate::seconds(lease_ttl),
        pending_state: TaskState::Pending.as_str(),
        leased_state: TaskState::Leased.as_str(),
        leased_status: AttemptStatus::Leased.as_str(),
        live_statuses: LIVE_ATTEMPT_STATUSES,
    }
    .query_as()
    .fetch_all(&mut *conn)
    .await?;
    let _: (String, String) = sql::database::SetLockTimeout {
        lock_timeout: &previous_timeout,
    }
    .query_as()
    .fetch_one(&mut *conn)
    .await?;
    Ok(granted)
}

/// How long a hand-off waits for a worker's row (or assignment) another transaction holds: about
/// one acquire's commit. The value of `lock_timeout` while it locks them.
pub const HAND_ON_LOCK_TIMEOUT: &str = "100ms";
