//! Dispatch (SPEC §4.2): worker hello, acquire (eligibility, capacity, fencing numbers, lease
//! tokens), renew and release. Every decision uses the database clock.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use messages::limits::RENEW_LEASES_MAX;
use messages::v1;
use messages::{ErrorCode, EventKind, Subjects};
use prost::Message as _;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;
use crate::fence::{self, LeaseClaim, lease_lost};
use crate::outbox::{self, OutboxEvent, Staged};
use crate::sql;
use crate::states::{AttemptStatus, TaskState};

/// Discovered assets handed to one lease, at most: bounds the reply size.
pub const LEASE_ASSETS_MAX: i64 = 1_000;

/// A worker's hello.
#[derive(Debug, Clone)]
pub struct HelloParams<'a> {
    pub worker_id: Uuid,
    pub software_version: &'a str,
    pub protocol_version: &'a str,
    pub capabilities: &'a [String],
    pub capacity: i32,
    /// The rules its plugins check (checked by the caller: reference 6.3).
    pub rules: &'a [v1::RuleDeclaration],
}

#[derive(Debug, Clone, PartialEq)]
pub enum HelloOutcome {
    Accepted { organization_ids: Vec<Uuid> },
    Refused(v1::Error),
}

/// Records the worker's advertised capabilities and capacity; refuses unknown or disabled
/// workers. Registration itself is an administrative act (`palisade worker add`).
pub async fn hello(pool: &PgPool, params: &HelloParams<'_>) -> Result<HelloOutcome, StoreError> {
    let mut tx = pool.begin().await?;
    let accepted: Option<(bool, bool)> = sql::workers::Hello {
        worker_id: params.worker_id,
        capabilities: params.capabilities,
        capacity: params.capacity,
        software_version: params.software_version,
        protocol_version: params.protocol_version,
        declared_rules: sqlx::types::Json(crate::coverage::declared_rules(params.rules)),
    }
    .query_as()
    .fetch_optional(&mut *tx)
    .await?;
    let outcome = match accepted {
        None => HelloOutcome::Refused(unknown_worker(params.worker_id)),
        Some((false, false)) => HelloOutcome::Refused(v1::Error::new(
            ErrorCode::InvalidField,
            format!(
                "capabilities: worker {} declares capabilities its enrollment token did not carry; declare only those (`palisade worker show`), or enroll it again with a token that carries them",
                params.worker_id
            ),
        )),
        Some((false, true)) => HelloOutcome::Refused(worker_disabled(params.worker_id)),
        Some((true, _)) => HelloOutcome::Accepted {
            organization_ids: assigned_organizations(&mut tx, params.worker_id, false).await?,
        },
    };
    tx.commit().await?;
    Ok(outcome)
}

/// An acquire request.
#[derive(Debug, Clone)]
pub struct AcquireParams {
    pub worker_id: Uuid,
    pub request_id: Uuid,
    pub max_tasks: i64,
    pub lease_ttl: Duration,
}

/// One granted lease with everything the worker needs to run it.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct GrantedLease {
    pub task_id: Uuid,
    pub attempt_id: Uuid,
    pub attempt_number: i32,
    pub lease_token: String,
    pub scan_id: Option<Uuid>,
    pub scan_job_id: Option<Uuid>,
    pub organization_id: Uuid,
    pub plugin: String,
    pub target: String,
    pub position: i32,
    pub lease_expires_in_ms: i64,
    pub execution_deadline_seconds: Option<i32>,
    /// W3C `traceparent` of the scan's trace; `None` when admission ran without `telemetry::init`.
    pub trace_context: Option<String>,
    pub worker_id: Uuid,
    /// The request it was granted under: an acquire's request id, or the id of the completed
    /// attempt whose acknowledgement carried it ([`lease_next`]).
    pub request_id: Option<Uuid>,
    #[sqlx(skip)]
    pub discovered_assets: Vec<(String, String)>,
    /// Granted before, to the same request, and answered again (a resent acquire, a
    /// redelivered completion): its `lease` span was opened the first time.
    #[sqlx(skip)]
    pub replayed: bool,
}

impl GrantedLease {
    pub fn to_wire(&self) -> v1::Lease {
        v1::Lease {
            lease: Some(v1::LeaseRef {
                task_id: self.task_id.to_string(),
                attempt_id: self.attempt_id.to_string(),
                attempt_number: self.attempt_number as u32,
                lease_token: self.lease_token.clone(),
            }),
            scan_id: self.scan_id.map(|id| id.to_string()).unwrap_or_default(),
            scan_job_id: self
                .scan_job_id
                .map(|id| id.to_string())
                .unwrap_or_default(),
            organization_id: self.organization_id.to_string(),
            plugin: self.plugin.clone(),
            target: self.target.clone(),
            lease_expires_in_ms: self.lease_expires_in_ms.clamp(0, i64::from(u32::MAX)) as u32,
            execution_deadline_in_ms: self
                .execution_deadline_seconds
                .map_or(0, |seconds| seconds as u64 * 1_000),
            discovered_assets: self
                .discovered_assets
                .iter()
                .map(|(kind, value)| v1::Asset {
                    kind: kind.clone(),
                    value: value.clone(),
                })
                .collect(),
            position: self.position as u32,
            traceparent: self.trace_context.clone().unwrap_or_default(),
        }
    }
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

/// The leases granted before to each (worker, request) pair, marked replayed.
async fn replayed_leases(
    conn: &mut PgConnection,
    worker_ids: Vec<Uuid>,
    request_ids: Vec<Uuid>,
) -> Result<Vec<GrantedLease>, StoreError> {
    let mut leases: Vec<GrantedLease> = sql::worker_task_attempts::ReplayedLeases {
        worker_ids,
        request_ids,
    }
    .query_as()
    .fetch_all(conn)
    .await?;
    for lease in &mut leases {
        lease.replayed = true;
    }
    Ok(leases)
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

/// `task.leased` of each granted lease, in its scan's trace.
fn leased_events(subjects: &Subjects, granted: &[GrantedLease]) -> Vec<OutboxEvent> {
    granted
        .iter()
        .map(|lease| {
            let leased = v1::TaskLeased {
                task_id: lease.task_id.to_string(),
                attempt_id: lease.attempt_id.to_string(),
                attempt_number: lease.attempt_number as u32,
                worker_id: lease.worker_id.to_string(),
                scan_id: lease.scan_id.map(|id| id.to_string()).unwrap_or_default(),
            };
            OutboxEvent::new(subjects, EventKind::TaskLeased, leased.encode_to_vec())
                .in_trace_of(lease.scan_id)
        })
        .collect()
}

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

/// The attempt statuses that hold a lease.
pub(crate) const LIVE_ATTEMPT_STATUSES: [&str; 2] = [
    AttemptStatus::Leased.as_str(),
    AttemptStatus::Running.as_str(),
];

/// Attaches the assets earlier plugins of each lease's scan discovered.
async fn with_assets(
    conn: &mut PgConnection,
    mut leases: Vec<GrantedLease>,
) -> Result<Vec<GrantedLease>, StoreError> {
    let needs_assets: Vec<Uuid> = leases
        .iter()
        .filter(|lease| lease.position > 0)
        .filter_map(|lease| lease.scan_id)
        .collect();
    if needs_assets.is_empty() {
        return Ok(leases);
    }
    let rows: Vec<(Uuid, String, String)> = sql::scan_assets::ForLeases {
        needs_assets: &needs_assets,
        lease_assets_max: LEASE_ASSETS_MAX,
    }
    .query_as()
    .fetch_all(conn)
    .await?;
    for lease in &mut leases {
        lease.discovered_assets = rows
            .iter()
            .filter(|(scan_id, _, _)| Some(*scan_id) == lease.scan_id)
            .map(|(_, kind, value)| (kind.clone(), value.clone()))
            .collect();
    }
    Ok(leases)
}

async fn assigned_organizations(
    conn: &mut PgConnection,
    worker_id: Uuid,
    lock: bool,
) -> Result<Vec<Uuid>, StoreError> {
    let query = if lock {
        sql::organization_workers::AssignedForShare { worker_id }.query_scalar()
    } else {
        sql::organization_workers::Assigned { worker_id }.query_scalar()
    };
    Ok(query.fetch_all(conn).await?)
}

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

fn unknown_worker(worker_id: Uuid) -> v1::Error {
    v1::Error::new(
        ErrorCode::UnknownWorker,
        format!("worker {worker_id} is not registered; register it with `palisade worker add`"),
    )
}

fn worker_disabled(worker_id: Uuid) -> v1::Error {
    v1::Error::new(
        ErrorCode::WorkerDisabled,
        format!("worker {worker_id} is disabled or revoked"),
    )
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
