//! Dispatch (SPEC §4.2): worker hello, acquire (eligibility, capacity, fencing numbers, lease
//! tokens), renew and release. Every decision uses the database clock.
//!
//! One module each: `hello`, `acquire` (capacity, organizations' caps, the grant), `hand_on`
//! (the next plugin leased in ingestion's transaction), `renew`, `release`. Here: the granted
//! lease and what acquire and the hand-on share (replays, assets, `task.leased` events).

mod acquire;
mod hand_on;
mod hello;
mod release;
mod renew;

use messages::{ErrorCode, EventKind, Subjects, v1};
use prost::Message as _;
use sqlx::PgConnection;
use uuid::Uuid;

pub use acquire::{AcquireOutcome, AcquireParams, Acquired, Eligibility, acquire, acquire_many};
pub(crate) use hand_on::hand_on;
pub use hand_on::{HAND_ON_LOCK_TIMEOUT, NextAsk};
pub use hello::{HelloOutcome, HelloParams, hello};
pub use release::{ReleaseOutcome, release};
pub use renew::{RenewClaims, RenewOutcome, renew, renew_many};

use crate::StoreError;
use crate::outbox::OutboxEvent;
use crate::sql;
use crate::states::AttemptStatus;

/// Discovered assets handed to one lease, at most: bounds the reply size.
pub const LEASE_ASSETS_MAX: i64 = 1_000;

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

/// The attempt statuses that hold a lease.
pub(crate) const LIVE_ATTEMPT_STATUSES: [&str; 2] = [
    AttemptStatus::Leased.as_str(),
    AttemptStatus::Running.as_str(),
];

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
