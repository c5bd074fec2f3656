//! Administration and inspection: organizations, workers and their assignments, the pages
//! `palisade worker list`, `org list` and `client list` print, and the read models
//! `palisade scan show` and the tests use.

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::audit::Change;
use crate::sql;
use crate::states::{AdminAction, ScanJobState, ScanState, TaskState};

/// Creates an organization (idempotent by id).
pub async fn create_organization(
    pool: &PgPool,
    id: Uuid,
    name: &str,
    hourly_scan_quota: Option<i32>,
) -> Result<(), StoreError> {
    sql::organizations::Create {
        id,
        name,
        hourly_scan_quota,
    }
    .query()
    .execute(pool)
    .await?;
    Ok(())
}

/// Sets a live organization's hourly scan quota (`None`: none). The quota it replaced, or
/// `Err(())` inside `Ok` when there is no such organization.
pub async fn set_hourly_quota(
    pool: &PgPool,
    id: Uuid,
    hourly_scan_quota: Option<i32>,
    change: &Change<'_>,
) -> Result<Result<Option<i32>, ()>, StoreError> {
    let previous: Option<Option<i32>> = sql::organizations::SetQuota {
        id,
        hourly_scan_quota,
        change_id: change.id(),
        who: change.by,
        why: change.reason,
        organization_limits_set_action: AdminAction::OrganizationLimitsSet.as_str(),
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(previous.ok_or(()))
}

/// Sets a live organization's cap on tasks in flight (`None`: none). The cap it replaced, or
/// `Err(())` inside `Ok` when there is no such organization.
pub async fn set_max_running_tasks(
    pool: &PgPool,
    id: Uuid,
    max_running_tasks: Option<i32>,
    change: &Change<'_>,
) -> Result<Result<Option<i32>, ()>, StoreError> {
    let previous: Option<Option<i32>> = sql::organizations::SetMaxRunning {
        id,
        max_running_tasks,
        change_id: change.id(),
        who: change.by,
        why: change.reason,
        organization_limits_set_action: AdminAction::OrganizationLimitsSet.as_str(),
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(previous.ok_or(()))
}

/// Registers a worker identity (idempotent by id).
pub async fn register_worker(
    pool: &PgPool,
    id: Uuid,
    name: &str,
    capacity: i32,
) -> Result<(), StoreError> {
    sql::workers::Register { id, name, capacity }
        .query()
        .execute(pool)
        .await?;
    Ok(())
}

/// Assigns a worker to an organization, re-enabling a revoked assignment.
pub async fn assign_worker(
    pool: &PgPool,
    organization_id: Uuid,
    worker_id: Uuid,
    change: &Change<'_>,
) -> Result<(), StoreError> {
    sql::organization_workers::Assign {
        organization_id,
        worker_id,
        change_id: change.id(),
        who: change.by,
        why: change.reason,
        assignment_added_action: AdminAction::AssignmentAdded.as_str(),
    }
    .query_scalar::<Uuid>()
    .fetch_one(pool)
    .await?;
    Ok(())
}

/// A scan as `palisade scan show` prints it.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct ScanView {
    pub id: Uuid,
    pub organization_id: Uuid,
    pub target: String,
    pub client_id: String,
    pub idempotency_key: String,
    pub plugins: Vec<String>,
    pub state: String,
    pub failure_code: String,
    pub failure_reason: String,
    pub finding_count: i32,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// When its first task was leased; `None` before.
    pub started_at: Option<chrono::DateTime<chrono::Utc>>,
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
    /// The scan's trace (W3C trace id, 32 hex digits): paste it into the tracing UI.
    pub trace_id: Option<String>,
}

#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct ScanJobView {
    pub task_id: Option<Uuid>,
    pub position: i32,
    pub plugin: String,
    pub state: String,
    pub task_state: Option<String>,
    pub attempt_count: Option<i32>,
    pub finding_count: i32,
    pub asset_count: i32,
    pub error_code: String,
    pub error_message: String,
}

/// The scan, with its state as reported ([`ScanState::reported`]).
pub async fn scan(pool: &PgPool, scan_id: Uuid) -> Result<Option<ScanView>, StoreError> {
    let Some(mut scan) = sql::scans::Show { scan_id }
        .query_as::<ScanView>()
        .fetch_optional(pool)
        .await?
    else {
        return Ok(None);
    };
    let stored = ScanState::parse(&scan.state)
        .ok_or_else(|| StoreError::Corrupt(format!("scan state {:?}", scan.state)))?;
    scan.state = stored
        .reported(scan.started_at.is_some())
        .as_str()
        .to_owned();
    Ok(Some(scan))
}

/// Which scans `palisade scan list` shows (`None`: any), and the page.
#[derive(Debug, Clone, Default)]
pub struct ScanFilter {
    pub organization_id: Option<Uuid>,
    /// The target's locator, exactly.
    pub target: Option<String>,
    /// As reported ([`ScanState::reported`]).
    pub state: Option<ScanState>,
    pub plugin: Option<String>,
    pub admitted_from: Option<chrono::DateTime<chrono::Utc>>,
    pub admitted_before: Option<chrono::DateTime<chrono::Utc>>,
    /// Who requested it (the client id).
    pub client_id: Option<String>,
    /// The page after this scan (newest first).
    pub after: Option<Uuid>,
    pub limit: i64,
}

/// Scans newest first by admission, each with its state as reported, in one statement; `None`
/// when `filter.after` names no scan of `filter.organization_id` (none at all, or another
/// organization's: the two read alike), which an empty page alone could not tell apart from
/// the end (a second statement, on an empty page after a cursor only).
pub async fn scans(
    pool: &PgPool,
    filter: &ScanFilter,
) -> Result<Option<Vec<ScanView>>, StoreError> {
    let scans = sql::scans::List {
        organization_id: filter.organization_id,
        target: filter.target.as_deref(),
        state: filter.state.map(ScanState::as_str),
        plugin: filter.plugin.as_deref(),
        admitted_from: filter.admitted_from,
        admitted_before: filter.admitted_before,
        client_id: filter.client_id.as_deref(),
        after_scan_id: filter.after,
        limit: filter.limit,
        unfinished_scan_states: [ScanState::Pending.as_str(), ScanState::Running.as_str()],
        running_scan_state: ScanState::Running.as_str(),
        pending_scan_state: ScanState::Pending.as_str(),
    }
    .query_as::<ScanView>()
    .fetch_all(pool)
    .await?;
    if let (true, Some(after)) = (scans.is_empty(), filter.after) {
        let known: bool = sql::scans::CursorKnown {
            scan_id: after,
            organization_id: filter.organization_id,
        }
        .query_scalar()
        .fetch_one(pool)
        .await?;
        if !known {
            return Ok(None);
        }
    }
    Ok(Some(scans))
}

/// The scan's plugin jobs, each with its state as reported ([`ScanJobState::reported`]).
pub async fn scan_jobs(pool: &PgPool, scan_id: Uuid) -> Result<Vec<ScanJobView>, StoreError> {
    let mut jobs = sql::scan_jobs::ShowForScan { scan_id }
        .query_as::<ScanJobView>()
        .fetch_all(pool)
        .await?;
    for job in &mut jobs {
        let stored = ScanJobState::parse(&job.state)
            .ok_or_else(|| StoreError::Corrupt(format!("scan job state {:?}", job.state)))?;
        let task = job.task_state.as_deref().and_then(TaskState::parse);
        job.state = stored.reported(task).as_str().to_owned();
    }
    Ok(jobs)
}

/// A finding as stored.
#[derive(Debug, Clone, serde::Serialize, sqlx::FromRow)]
pub struct FindingView {
    pub finding_key: String,
    pub plugin: String,
    pub rule_id: String,
    pub resource: String,
    pub severity: String,
    pub title: String,
    pub evidence: String,
    pub status: String,
    pub attempt_id: Uuid,
}

pub async fn findings(pool: &PgPool, scan_id: Uuid) -> Result<Vec<FindingView>, StoreError> {
    Ok(sql::findings::ShowForScan { scan_id }
        .query_as::<FindingView>()
        .fetch_all(pool)
        .await?)
}

/// (scans, completed scans) in the whole database: the demo's cross-check.
pub async fn scan_counts(pool: &PgPool) -> Result<(i64, i64), StoreError> {
    Ok(sql::scans::Counts {
        completed_scan_state: crate::states::ScanState::Completed.as_str(),
    }
    .query_as()
    .fetch_one(pool)
    .await?)
}

/// A worker as `palisade worker list` prints it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct WorkerSummary {
    pub id: Uuid,
    pub name: String,
    /// False from `worker revoke` until `worker enable`.
    pub enabled: bool,
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Tasks it may hold at once.
    pub capacity: i32,
    /// What its last hello declared: plugin names and other capabilities.
    pub capabilities: Vec<String>,
    pub software_version: String,
    /// Its last hello; `None` until its first.
    pub last_seen_at: Option<chrono::DateTime<chrono::Utc>>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    pub live_leases: i64,
    /// The organizations it serves now (its enabled assignments).
    pub organization_ids: Vec<Uuid>,
}

/// A page of workers in id order, after `after`.
pub async fn workers(
    pool: &PgPool,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<WorkerSummary>, StoreError> {
    Ok(sql::workers::List {
        after_id: after,
        limit,
        live_statuses: crate::lease::LIVE_ATTEMPT_STATUSES,
    }
    .query_as()
    .fetch_all(pool)
    .await?)
}

/// An organization as `palisade org list` prints it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct OrganizationSummary {
    pub id: Uuid,
    pub name: String,
    /// Scans admitted per rolling hour; `None`: no quota.
    pub hourly_scan_quota: Option<i32>,
    /// Tasks in flight at once over every worker; `None`: no cap.
    pub max_running_tasks: Option<i32>,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// Workers serving it now (enabled assignments).
    pub workers: i64,
    /// Unrevoked clients acting for it.
    pub clients: i64,
    pub schedules: i64,
}

/// A page of organizations in id order, after `after`.
pub async fn organizations(
    pool: &PgPool,
    after: Option<Uuid>,
    limit: i64,
) -> Result<Vec<OrganizationSummary>, StoreError> {
    Ok(sql::organizations::List {
        after_id: after,
        limit,
    }
    .query_as()
    .fetch_all(pool)
    .await?)
}

/// A client as `palisade client list` prints it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct ClientSummary {
    pub id: String,
    pub name: String,
    /// The organizations it may submit, cancel and read events for.
    pub organization_ids: Vec<Uuid>,
    /// Set from `client revoke` until `client enable`.
    pub revoked_at: Option<chrono::DateTime<chrono::Utc>>,
    pub revocation_reason: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
}

/// A page of clients in id order, after `after`.
pub async fn clients(
    pool: &PgPool,
    after: Option<&str>,
    limit: i64,
) -> Result<Vec<ClientSummary>, StoreError> {
    Ok(sql::clients::List {
        after_id: after,
        limit,
    }
    .query_as()
    .fetch_all(pool)
    .await?)
}
