//! Acquire: leases granted within each worker's capacity and its organizations' caps on tasks
//! in flight, fair between the organizations it serves (`worker_tasks/grant.sql`); a replayed
//! request is answered with what it was granted.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use messages::{ErrorCode, Subjects, v1};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{
    GrantedLease, LIVE_ATTEMPT_STATUSES, leased_events, replayed_leases, unknown_worker,
    with_assets, worker_disabled,
};
use crate::StoreError;
use crate::outbox::{self, Staged};
use crate::sql;
use crate::states::{AttemptStatus, TaskState};

/// An acquire request.
#[derive(Debug, Clone)]
pub struct AcquireParams {
    pub worker_id: Uuid,
    pub request_id: Uuid,
    pub max_tasks: i64,
    pub lease_ttl: Duration,
}

#[derive(Debug, Clone, PartialEq)]
pub enum AcquireOutcome {
    /// Zero or more leases; zero means nothing is due for this worker now.
    Leases(Vec<GrantedLease>),
    Refused(v1::Error),
}

/// What a worker may be leased: for the dispatcher's queue of waiting acquires, so that a
/// `task.ready` wakes a waiter that can take the task.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Eligibility {
    pub organization_ids: Vec<Uuid>,
    pub capabilities: Vec<String>,
}

impl Eligibility {
    /// The worker may be leased a task of `organization_id` that needs `required`.
    pub fn admits(&self, organization_id: Uuid, required: &[String]) -> bool {
        self.organization_ids.contains(&organization_id)
            && required
                .iter()
                .all(|capability| self.capabilities.contains(capability))
    }
}

#[derive(sqlx::FromRow)]
struct AcquiringWorker {
    id: Uuid,
    enabled: bool,
    revoked: bool,
    capabilities: Vec<String>,
    capacity: i32,
    live: i64,
    replayed: bool,
    organization_ids: Vec<Uuid>,
    /// One of its organizations caps its tasks in flight.
    serves_capped: bool,
}

/// What one acquire decided, and what the worker may be leased (for the queue of waiting
/// acquires).
pub type Acquired = (AcquireOutcome, Eligibility);

/// Grants up to `max_tasks` leases in one transaction of three statements (the worker, the
/// grant, its events). A replayed `request_id` returns the leases that request was granted,
/// so a lost reply never strands a lease. [`acquire_many`] run on one acquire.
pub async fn acquire(
    pool: &PgPool,
    staged: &mut Staged,
    subjects: &Subjects,
    params: &AcquireParams,
) -> Result<Acquired, StoreError> {
    let mut decided = acquire_many(pool, staged, subjects, std::slice::from_ref(params)).await?;
    Ok(decided.pop().expect("one decision per acquire"))
}

/// Decides acquires of distinct workers in one transaction (issue 24: dispatch decides the
/// acquires that queued together, as admission decides submissions): one statement locks
/// every worker in id order (`lock_workers`), one locks the organizations among theirs that
/// cap their tasks in flight (only when there are any, `lock_capped_organizations`), each
/// acquire is checked against its worker in Rust (`check_acquires`), one statement answers
/// every replayed request (`replayed_leases`), one grant per worker with room (each sees the
/// tasks the grants before it leased, `grant`), one stages every `task.leased`.
/// The answers are in the order of `acquires`. The caller keeps two acquires of one worker
/// out of one call: both would count the same free slots.
pub async fn acquire_many(
    pool: &PgPool,
    staged: &mut Staged,
    subjects: &Subjects,
    acquires: &[AcquireParams],
) -> Result<Vec<Acquired>, StoreError> {
    debug_assert!(
        acquires
            .iter()
            .map(|params| params.worker_id)
            .collect::<HashSet<_>>()
            .len()
            == acquires.len(),
        "one acquire per worker in a decision"
    );
    let mut tx = pool.begin().await?;
    let workers = lock_workers(&mut tx, acquires).await?;
    lock_capped_organizations(&mut tx, &workers).await?;
    let checked = check_acquires(acquires, workers);

    let mut leases: Vec<GrantedLease> = if checked.replays.is_empty() {
        Vec::new()
    } else {
        replayed_leases(
            &mut tx,
            checked
                .replays
                .iter()
                .map(|&index| acquires[index].worker_id)
                .collect(),
            checked
                .replays
                .iter()
                .map(|&index| acquires[index].request_id)
                .collect(),
        )
        .await?
    };
    let granted = grant(&mut tx, acquires, &checked).await?;
    if !granted.is_empty() {
        outbox::stage(&mut tx, staged, leased_events(subjects, &granted)).await?;
    }
    leases.extend(granted);
    let leases = with_assets(&mut tx, leases).await?;
    tx.commit().await?;
    Ok(hand_out(acquires, checked.decided, leases))
}

/// Locks every acquiring worker, in id order, and reads what deciding its acquire needs.
///
/// FOR NO KEY UPDATE: a revocation (an UPDATE of this row) waits for us, and we wait for
/// it, so no lease is granted after a revocation commits; two acquires of one worker (the
/// same request asked again while its first ask is granted) take turns, and the grant
/// refuses to grant a request id twice. The assignments are read here to answer
/// `worker_not_assigned`, and locked by the grant itself.
async fn lock_workers(
    conn: &mut PgConnection,
    acquires: &[AcquireParams],
) -> Result<HashMap<Uuid, AcquiringWorker>, StoreError> {
    Ok(sql::workers::ForAcquire {
        worker_ids: acquires
            .iter()
            .map(|params| params.worker_id)
            .collect::<Vec<_>>(),
        request_ids: acquires
            .iter()
            .map(|params| params.request_id)
            .collect::<Vec<_>>(),
        live_statuses: LIVE_ATTEMPT_STATUSES,
    }
    .query_as::<AcquiringWorker>()
    .fetch_all(conn)
    .await?
    .into_iter()
    .map(|worker| (worker.id, worker))
    .collect())
}

/// Locks the organizations that cap their tasks in flight among the workers', before any
/// grant (in id order, after the workers, as every acquire does), so each grant counts the
/// leases of the acquire before it. One statement, only when such an organization is served.
async fn lock_capped_organizations(
    conn: &mut PgConnection,
    workers: &HashMap<Uuid, AcquiringWorker>,
) -> Result<(), StoreError> {
    let capped: Vec<Uuid> = workers
        .values()
        .filter(|worker| worker.serves_capped)
        .flat_map(|worker| worker.organization_ids.iter().copied())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .collect();
    if !capped.is_empty() {
        sql::organizations::LockCapped {
            organization_ids: &capped,
        }
        .query()
        .execute(conn)
        .await?;
    }
    Ok(())
}

/// The acquires checked against their workers, before any lease is read or granted.
struct CheckedAcquires {
    /// Per acquire, in order: its outcome so far (granted leases are added to it) and what
    /// its worker may be leased.
    decided: Vec<Acquired>,
    /// The acquires whose request was granted before (indices into the acquires).
    replays: Vec<usize>,
    /// The acquires to grant, each with its worker's free slots.
    grants: Vec<(usize, i64)>,
}

/// Checks each acquire against its locked worker ([`check_acquire`]); an acquire whose worker
/// is not registered is refused.
fn check_acquires(
    acquires: &[AcquireParams],
    mut workers: HashMap<Uuid, AcquiringWorker>,
) -> CheckedAcquires {
    let mut checked = CheckedAcquires {
        decided: Vec::with_capacity(acquires.len()),
        replays: Vec::new(),
        grants: Vec::new(),
    };
    for (index, params) in acquires.iter().enumerate() {
        let Some(worker) = workers.remove(&params.worker_id) else {
            checked.decided.push((
                AcquireOutcome::Refused(unknown_worker(params.worker_id)),
                Eligibility::default(),
            ));
            continue;
        };
        let (outcome, step) = check_acquire(params, &worker);
        match step {
            AcquireStep::Answered => {}
            AcquireStep::Replay => checked.replays.push(index),
            AcquireStep::Grant { free } => checked.grants.push((index, free)),
        }
        checked.decided.push((
            outcome,
            Eligibility {
                organization_ids: worker.organization_ids,
                capabilities: worker.capabilities,
            },
        ));
    }
    checked
}

/// Grants each acquire to grant, one statement per worker: lock its assignments (FOR SHARE),
/// pick due tasks (SKIP LOCKED), lease them, create their attempts and mark the worker seen.
async fn grant(
    conn: &mut PgConnection,
    acquires: &[AcquireParams],
    checked: &CheckedAcquires,
) -> Result<Vec<GrantedLease>, StoreError> {
    let mut granted: Vec<GrantedLease> = Vec::new();
    for &(index, free) in &checked.grants {
        let params = &acquires[index];
        let eligibility = &checked.decided[index].1;
        granted.extend(
            sql::worker_tasks::Grant {
                worker_id: params.worker_id,
                capabilities: &eligibility.capabilities,
                free,
                request_id: params.request_id,
                lease_ttl_seconds: crate::seconds(params.lease_ttl),
                grantable_states: [TaskState::Pending.as_str(), TaskState::RetryWait.as_str()],
                leased_state: TaskState::Leased.as_str(),
                leased_status: AttemptStatus::Leased.as_str(),
                live_statuses: LIVE_ATTEMPT_STATUSES,
                leased_states: TaskState::LEASED.map(TaskState::as_str),
            }
            .query_as::<GrantedLease>()
            .fetch_all(&mut *conn)
            .await?,
        );
    }
    Ok(granted)
}

/// Hands each lease (replayed or granted) to its worker's acquire.
fn hand_out(
    acquires: &[AcquireParams],
    mut decided: Vec<Acquired>,
    leases: Vec<GrantedLease>,
) -> Vec<Acquired> {
    let positions: HashMap<Uuid, usize> = acquires
        .iter()
        .enumerate()
        .map(|(index, params)| (params.worker_id, index))
        .collect();
    for lease in leases {
        if let Some((AcquireOutcome::Leases(granted), _)) = positions
            .get(&lease.worker_id)
            .and_then(|&index| decided.get_mut(index))
        {
            granted.push(lease);
        }
    }
    decided
}

/// What an acquire's worker row leaves to do.
enum AcquireStep {
    /// The outcome is the answer.
    Answered,
    /// The request was granted before: answer what it was granted.
    Replay,
    /// Grant up to `free` leases.
    Grant { free: i64 },
}

/// Checks an acquire against its worker (disabled or revoked, a replay, no capabilities, no
/// room, no organization), in that order.
fn check_acquire(
    params: &AcquireParams,
    worker: &AcquiringWorker,
) -> (AcquireOutcome, AcquireStep) {
    let leases = AcquireOutcome::Leases(Vec::new());
    if !worker.enabled || worker.revoked {
        let refused = AcquireOutcome::Refused(worker_disabled(params.worker_id));
        return (refused, AcquireStep::Answered);
    }
    if worker.replayed {
        return (leases, AcquireStep::Replay);
    }
    if worker.capabilities.is_empty() {
        let refused = AcquireOutcome::Refused(v1::Error::new(
            ErrorCode::InvalidField,
            format!(
                "worker {} has no capabilities: send hello (with its plugins) before acquire",
                params.worker_id
            ),
        ));
        return (refused, AcquireStep::Answered);
    }
    let free = (i64::from(worker.capacity) - worker.live).min(params.max_tasks);
    if free <= 0 {
        return (leases, AcquireStep::Answered);
    }
    if worker.organization_ids.is_empty() {
        let refused = AcquireOutcome::Refused(v1::Error::new(
            ErrorCode::WorkerNotAssigned,
            format!(
                "worker {} serves no organization; assign it with `palisade worker assign`",
                params.worker_id
            ),
        ));
        return (refused, AcquireStep::Answered);
    }
    (leases, AcquireStep::Grant { free })
}
