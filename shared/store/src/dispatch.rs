//! Dispatch (SPEC §4.2): worker hello, acquire (eligibility, capacity, fencing numbers, lease
//! tokens), renew and release. Every decision uses the database clock.

use std::time::Duration;

use messages::v1;
use messages::{ErrorCode, EventKind, Subjects};
use prost::Message as _;
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;
use crate::fence::{self, LeaseClaim, lease_lost};
use crate::outbox::{self, OutboxEvent, Staged};
use crate::states::{AttemptStatus, ScanJobState, ScanState, TaskState};

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
    let worker: Option<(bool, bool)> = sqlx::query_as(
        r#"
        UPDATE workers
        SET capabilities = $2, max_concurrent_tasks = $3, software_version = $4,
            protocol_version = $5, last_seen_at = now(), updated_at = now()
        WHERE id = $1
        RETURNING enabled, revoked_at IS NOT NULL
        "#,
    )
    .bind(params.worker_id)
    .bind(params.capabilities)
    .bind(params.capacity)
    .bind(params.software_version)
    .bind(params.protocol_version)
    .fetch_optional(&mut *tx)
    .await?;
    let outcome = match worker {
        None => HelloOutcome::Refused(unknown_worker(params.worker_id)),
        Some((enabled, revoked)) if !enabled || revoked => {
            HelloOutcome::Refused(worker_disabled(params.worker_id))
        }
        Some(_) => HelloOutcome::Accepted {
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
    #[sqlx(skip)]
    pub discovered_assets: Vec<(String, String)>,
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

/// The columns of a `GrantedLease`, over attempt `a` and task `t`.
macro_rules! lease_columns {
    () => {
        r#"
    a.task_id, a.id AS attempt_id, a.attempt_number, a.lease_token, t.scan_id, t.scan_job_id,
    t.organization_id, coalesce(t.payload->>'plugin', '') AS plugin,
    coalesce(t.payload->>'target', '') AS target,
    coalesce((t.payload->>'position')::int, 0) AS position,
    greatest(0, (extract(epoch FROM a.lease_expires_at - now()) * 1000)::bigint) AS lease_expires_in_ms,
    t.execution_deadline_seconds,
    (SELECT s.trace_context FROM scans s WHERE s.id = t.scan_id) AS trace_context
"#
    };
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
    enabled: bool,
    revoked: bool,
    capabilities: Vec<String>,
    capacity: i32,
    live: i64,
    replayed: bool,
    organization_ids: Vec<Uuid>,
}

/// Grants up to `max_tasks` leases in one transaction of three statements (the worker, the
/// grant, its events). A replayed `request_id` returns the leases that request was granted,
/// so a lost reply never strands a lease.
pub async fn acquire(
    pool: &PgPool,
    staged: &mut Staged,
    subjects: &Subjects,
    params: &AcquireParams,
) -> Result<(AcquireOutcome, Eligibility), StoreError> {
    let mut tx = pool.begin().await?;

    // FOR SHARE: a revocation (an UPDATE of this row) waits for us, and we wait for it, so no
    // lease is granted after a revocation commits. The assignments are read here to answer
    // `worker_not_assigned`, and locked by the grant itself.
    let worker = sqlx::query_as::<_, AcquiringWorker>(
        r#"
        SELECT w.enabled, w.revoked_at IS NOT NULL AS revoked, w.capabilities,
               w.max_concurrent_tasks AS capacity,
               (SELECT count(*) FROM worker_task_attempts a
                WHERE a.worker_id = w.id AND a.status = ANY($3) AND a.lease_expires_at > now()) AS live,
               EXISTS (SELECT 1 FROM worker_task_attempts a
                       WHERE a.worker_id = w.id AND a.acquire_request_id = $2) AS replayed,
               ARRAY(SELECT o.organization_id FROM organization_workers o
                     WHERE o.worker_id = w.id AND o.enabled AND o.revoked_at IS NULL
                     ORDER BY o.organization_id) AS organization_ids
        FROM workers w WHERE w.id = $1
        FOR SHARE OF w
        "#,
    )
    .bind(params.worker_id)
    .bind(params.request_id)
    .bind(LIVE_ATTEMPT_STATUSES)
    .fetch_optional(&mut *tx)
    .await?;
    let Some(worker) = worker else {
        return Ok((
            AcquireOutcome::Refused(unknown_worker(params.worker_id)),
            Eligibility::default(),
        ));
    };
    let eligibility = Eligibility {
        organization_ids: worker.organization_ids,
        capabilities: worker.capabilities,
    };
    if !worker.enabled || worker.revoked {
        return Ok((
            AcquireOutcome::Refused(worker_disabled(params.worker_id)),
            eligibility,
        ));
    }
    if worker.replayed {
        let replayed = sqlx::query_as::<_, GrantedLease>(concat!(
            "SELECT ",
            lease_columns!(),
            " FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
             WHERE a.worker_id = $1 AND a.acquire_request_id = $2 ORDER BY a.created_at"
        ))
        .bind(params.worker_id)
        .bind(params.request_id)
        .fetch_all(&mut *tx)
        .await?;
        let leases = with_assets(&mut tx, replayed).await?;
        tx.commit().await?;
        return Ok((AcquireOutcome::Leases(leases), eligibility));
    }

    if eligibility.capabilities.is_empty() {
        return Ok((
            AcquireOutcome::Refused(v1::Error::new(
                ErrorCode::InvalidField,
                format!(
                    "worker {} has no capabilities: send hello (with its plugins) before acquire",
                    params.worker_id
                ),
            )),
            eligibility,
        ));
    }
    let free = (i64::from(worker.capacity) - worker.live).min(params.max_tasks);
    if free <= 0 {
        return Ok((AcquireOutcome::Leases(Vec::new()), eligibility));
    }
    if eligibility.organization_ids.is_empty() {
        return Ok((
            AcquireOutcome::Refused(v1::Error::new(
                ErrorCode::WorkerNotAssigned,
                format!(
                    "worker {} serves no organization; assign it with `palisade worker assign`",
                    params.worker_id
                ),
            )),
            eligibility,
        ));
    }

    // One statement: lock the assignments (FOR SHARE, as the worker row above), pick due
    // tasks (SKIP LOCKED), lease them, create their attempts, mark the worker seen, and move
    // their scan jobs and scans to running.
    let granted = sqlx::query_as::<_, GrantedLease>(concat!(
        r#"
        WITH assigned AS (
            SELECT organization_id FROM organization_workers
            WHERE worker_id = $1 AND enabled AND revoked_at IS NULL
            ORDER BY organization_id
            FOR SHARE
        ),
        picked AS (
            SELECT t.id FROM worker_tasks t
            WHERE t.state = ANY($6)
              AND t.available_at <= now()
              AND t.cancel_requested_at IS NULL
              AND t.organization_id IN (SELECT organization_id FROM assigned)
              AND t.required_capabilities <@ $2
            ORDER BY t.priority DESC, t.available_at, t.created_at
            LIMIT $3
            FOR UPDATE SKIP LOCKED
        ),
        leased AS (
            UPDATE worker_tasks t
            SET state = $7, attempt_count = t.attempt_count + 1,
                last_attempt_number = t.last_attempt_number + 1,
                current_attempt_id = gen_random_uuid(), updated_at = now()
            FROM picked WHERE t.id = picked.id
            RETURNING t.*
        ),
        a AS (
            INSERT INTO worker_task_attempts
                (id, task_id, worker_id, attempt_number, lease_token, acquire_request_id, status, lease_expires_at)
            SELECT l.current_attempt_id, l.id, $1, l.last_attempt_number,
                   replace(gen_random_uuid()::text || gen_random_uuid()::text, '-', ''),
                   $4, $8, now() + make_interval(secs => $5)
            FROM leased l
            RETURNING *
        ),
        seen AS (
            UPDATE workers SET last_seen_at = now() WHERE id = $1
        ),
        started_jobs AS (
            UPDATE scan_jobs j SET state = $9, started_at = coalesce(j.started_at, now()), updated_at = now()
            FROM leased WHERE j.id = leased.scan_job_id AND j.state = $10
        ),
        started_scans AS (
            UPDATE scans s SET state = $11, started_at = coalesce(s.started_at, now()), updated_at = now()
            WHERE s.id IN (SELECT scan_id FROM leased) AND s.state = $12
        )
        SELECT "#,
        lease_columns!(),
        r#" FROM a JOIN leased t ON t.id = a.task_id
        ORDER BY t.priority DESC, t.created_at
        "#
    ))
    .bind(params.worker_id)
    .bind(&eligibility.capabilities)
    .bind(free)
    .bind(params.request_id)
    .bind(crate::seconds(params.lease_ttl))
    .bind([TaskState::Pending.as_str(), TaskState::RetryWait.as_str()])
    .bind(TaskState::Leased.as_str())
    .bind(AttemptStatus::Leased.as_str())
    .bind(ScanJobState::Running.as_str())
    .bind(ScanJobState::Pending.as_str())
    .bind(ScanState::Running.as_str())
    .bind(ScanState::Pending.as_str())
    .fetch_all(&mut *tx)
    .await?;

    if granted.is_empty() {
        tx.commit().await?;
        return Ok((AcquireOutcome::Leases(granted), eligibility));
    }

    let events: Vec<OutboxEvent> = granted
        .iter()
        .map(|lease| {
            let leased = v1::TaskLeased {
                task_id: lease.task_id.to_string(),
                attempt_id: lease.attempt_id.to_string(),
                attempt_number: lease.attempt_number as u32,
                worker_id: params.worker_id.to_string(),
                scan_id: lease.scan_id.map(|id| id.to_string()).unwrap_or_default(),
            };
            let event = OutboxEvent::new(subjects, EventKind::TaskLeased, leased.encode_to_vec());
            match lease.scan_id {
                Some(scan_id) => event.in_trace_of(scan_id),
                None => event,
            }
        })
        .collect();
    outbox::stage(&mut tx, staged, events).await?;

    let leases = with_assets(&mut tx, granted).await?;
    tx.commit().await?;
    Ok((AcquireOutcome::Leases(leases), eligibility))
}

/// The attempt statuses that hold a lease.
const LIVE_ATTEMPT_STATUSES: [&str; 2] = [
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
    let rows: Vec<(Uuid, String, String)> = sqlx::query_as(
        r#"
        SELECT s.scan_id, s.kind, s.value FROM unnest($1::uuid[]) AS wanted(scan_id)
        CROSS JOIN LATERAL (
            SELECT sa.scan_id, a.kind, a.value FROM scan_assets sa JOIN assets a ON a.id = sa.asset_id
            WHERE sa.scan_id = wanted.scan_id ORDER BY a.kind, a.value LIMIT $2
        ) s
        "#,
    )
    .bind(&needs_assets)
    .bind(LEASE_ASSETS_MAX)
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
    let sql = if lock {
        "SELECT organization_id FROM organization_workers
         WHERE worker_id = $1 AND enabled AND revoked_at IS NULL FOR SHARE"
    } else {
        "SELECT organization_id FROM organization_workers
         WHERE worker_id = $1 AND enabled AND revoked_at IS NULL"
    };
    Ok(sqlx::query_scalar(sql)
        .bind(worker_id)
        .fetch_all(conn)
        .await?)
}

#[derive(Debug, Clone, PartialEq)]
pub enum RenewOutcome {
    Renewed { lease_expires_in_ms: i64 },
    Refused(v1::Error),
}

/// Extends the caller's own live attempt; never revives an expired, superseded or cancelled one.
pub async fn renew(
    pool: &PgPool,
    claim: &LeaseClaim,
    lease_ttl: Duration,
) -> Result<RenewOutcome, StoreError> {
    let renewed: Option<i64> = sqlx::query_scalar(
        r#"
        WITH renewed AS (
            UPDATE worker_task_attempts a
            SET lease_expires_at = now() + make_interval(secs => $6), last_renewed_at = now(),
                status = 'running', updated_at = now()
            FROM worker_tasks t
            WHERE a.id = $1 AND a.task_id = $2 AND a.worker_id = $3 AND a.attempt_number = $4
              AND a.lease_token = $5 AND a.status IN ('leased', 'running') AND a.lease_expires_at > now()
              AND t.id = a.task_id AND t.current_attempt_id = a.id
              AND t.state IN ('leased', 'running') AND t.cancel_requested_at IS NULL
            RETURNING a.task_id, a.lease_expires_at
        ),
        task AS (
            UPDATE worker_tasks t SET state = 'running', updated_at = now()
            FROM renewed WHERE t.id = renewed.task_id AND t.state = 'leased'
        )
        SELECT (extract(epoch FROM lease_expires_at - now()) * 1000)::bigint FROM renewed
        "#,
    )
    .bind(claim.attempt_id)
    .bind(claim.task_id)
    .bind(claim.worker_id)
    .bind(claim.attempt_number)
    .bind(&claim.lease_token)
    .bind(crate::seconds(lease_ttl))
    .fetch_optional(pool)
    .await?;
    if let Some(lease_expires_in_ms) = renewed {
        return Ok(RenewOutcome::Renewed {
            lease_expires_in_ms,
        });
    }
    // Nothing was written; say why, so the worker knows whether it was cancelled.
    let cancelled: Option<bool> = sqlx::query_scalar(
        "SELECT cancel_requested_at IS NOT NULL OR state IN ('cancelling', 'cancelled') FROM worker_tasks WHERE id = $1",
    )
    .bind(claim.task_id)
    .fetch_optional(pool)
    .await?;
    Ok(RenewOutcome::Refused(if cancelled == Some(true) {
        v1::Error::new(
            ErrorCode::CancelRequested,
            "the task was cancelled; stop working on it",
        )
    } else {
        lease_lost(claim)
    }))
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
    sqlx::query(
        "UPDATE worker_task_attempts SET status = $3, finished_at = now(), updated_at = now(),
         error_message = $2 WHERE id = $1",
    )
    .bind(claim.attempt_id)
    .bind(reason)
    .bind(AttemptStatus::Released.as_str())
    .execute(&mut *tx)
    .await?;
    sqlx::query(
        "UPDATE worker_tasks SET state = $2, attempt_count = attempt_count - 1, available_at = now(),
         updated_at = now() WHERE id = $1",
    )
    .bind(claim.task_id)
    .bind(TaskState::Pending.as_str())
    .execute(&mut *tx)
    .await?;
    if let Some(scan_job_id) = locked.scan_job_id {
        sqlx::query(
            "UPDATE scan_jobs SET state = $2, updated_at = now() WHERE id = $1 AND state = $3",
        )
        .bind(scan_job_id)
        .bind(ScanJobState::Pending.as_str())
        .bind(ScanJobState::Running.as_str())
        .execute(&mut *tx)
        .await?;
    }
    let ready = v1::TaskReady {
        task_id: claim.task_id.to_string(),
        scan_id: locked.scan_id.map(|id| id.to_string()).unwrap_or_default(),
        organization_id: locked.organization_id.to_string(),
        plugin: locked.plugin.clone(),
        required_capabilities: vec![locked.plugin.clone()],
    };
    outbox::stage(
        &mut tx,
        staged,
        vec![OutboxEvent::new(
            subjects,
            EventKind::TaskReady,
            ready.encode_to_vec(),
        )],
    )
    .await?;
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
