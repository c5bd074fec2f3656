//! Who changed a tenant's access or limits, and why (issue 27, item 5). Each change of a
//! worker's assignments or enablement, of a client's registration or enablement, and of an
//! organization's limits writes one `admin_changes` row in the very statement that makes the
//! change, so a change is never without its record nor a record without its change.

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::sql;

/// Who makes a change, and why.
#[derive(Debug, Clone, Copy)]
pub struct Change<'a> {
    /// The operator (`--by`, else `$USER`).
    pub by: &'a str,
    /// `--reason`; may be empty where the command does not ask for one.
    pub reason: &'a str,
}

impl<'a> Change<'a> {
    pub fn new(by: &'a str, reason: &'a str) -> Self {
        Self { by, reason }
    }

    /// The id of the record this change writes.
    pub(crate) fn id(&self) -> Uuid {
        Uuid::now_v7()
    }
}

/// A recorded change.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct Recorded {
    pub id: Uuid,
    pub at: DateTime<Utc>,
    pub actor: String,
    pub reason: String,
    pub action: String,
    pub worker_id: Option<Uuid>,
    pub organization_id: Option<Uuid>,
    pub client_id: Option<String>,
    pub detail: serde_json::Value,
}

/// The latest `limit` changes of a worker, of an organization, or of some clients, newest first.
pub async fn recent(
    pool: &PgPool,
    worker_id: Option<Uuid>,
    organization_id: Option<Uuid>,
    client_ids: &[String],
    limit: i64,
) -> Result<Vec<Recorded>, StoreError> {
    Ok(sql::admin_changes::Recent {
        worker_id,
        organization_id,
        client_ids,
        limit,
    }
    .query_as()
    .fetch_all(pool)
    .await?)
}

/// A worker as `palisade worker show` prints it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct WorkerView {
    pub id: Uuid,
    pub name: String,
    pub enabled: bool,
    pub revoked_at: Option<DateTime<Utc>>,
    pub revocation_reason: String,
    pub capabilities: Vec<String>,
    /// An enrolled worker's: what its hellos may declare (its token's); `None`: anything.
    pub allowed_capabilities: Option<Vec<String>>,
    /// It joined with an enrollment token (and renews its credentials with dispatch).
    pub enrolled: bool,
    pub capacity: i32,
    pub software_version: String,
    pub last_seen_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub live_leases: i64,
    /// Each assignment: organization, enabled, assigned, revoked and why.
    pub organizations: serde_json::Value,
}

/// A worker with its assignments; `None` when there is no such worker.
pub async fn worker(pool: &PgPool, id: Uuid) -> Result<Option<WorkerView>, StoreError> {
    Ok(sql::workers::Show {
        worker_id: id,
        live_statuses: crate::lease::LIVE_ATTEMPT_STATUSES,
    }
    .query_as()
    .fetch_optional(pool)
    .await?)
}

/// An organization as `palisade org show` prints it.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct OrganizationView {
    pub id: Uuid,
    pub name: String,
    pub hourly_scan_quota: Option<i32>,
    pub max_running_tasks: Option<i32>,
    pub created_at: DateTime<Utc>,
    /// Its tasks leased or running now, over every worker.
    pub tasks_in_flight: i64,
    pub schedules: i64,
    /// Each assignment: worker, enabled, assigned, revoked and why.
    pub workers: serde_json::Value,
    #[serde(skip)]
    pub client_ids: Vec<String>,
    /// The clients acting for it: id, name, revoked and why.
    pub clients: serde_json::Value,
}

/// An organization with its workers and clients; `None` when there is no such organization.
pub async fn organization(pool: &PgPool, id: Uuid) -> Result<Option<OrganizationView>, StoreError> {
    Ok(sql::organizations::Show {
        id,
        leased_states: crate::states::TaskState::LEASED.map(crate::states::TaskState::as_str),
    }
    .query_as()
    .fetch_optional(pool)
    .await?)
}
