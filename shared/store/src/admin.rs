//! Administration and inspection: organizations, workers and their assignments, and the
//! read models `palisade scan show` and the tests use.

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;

/// Creates an organization (idempotent by id).
pub async fn create_organization(
    pool: &PgPool,
    id: Uuid,
    name: &str,
    hourly_scan_quota: Option<i32>,
) -> Result<(), StoreError> {
    sqlx::query(
        r#"
        INSERT INTO organizations (id, name, hourly_scan_quota) VALUES ($1, $2, $3)
        ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, hourly_scan_quota = EXCLUDED.hourly_scan_quota,
                                       updated_at = now()
        "#,
    )
    .bind(id)
    .bind(name)
    .bind(hourly_scan_quota)
    .execute(pool)
    .await?;
    Ok(())
}

/// Registers a worker identity (idempotent by id).
pub async fn register_worker(
    pool: &PgPool,
    id: Uuid,
    name: &str,
    capacity: i32,
) -> Result<(), StoreError> {
    sqlx::query(
        r#"
        INSERT INTO workers (id, name, max_concurrent_tasks) VALUES ($1, $2, $3)
        ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, updated_at = now()
        "#,
    )
    .bind(id)
    .bind(name)
    .bind(capacity)
    .execute(pool)
    .await?;
    Ok(())
}

/// Assigns a worker to an organization, re-enabling a revoked assignment.
pub async fn assign_worker(
    pool: &PgPool,
    organization_id: Uuid,
    worker_id: Uuid,
) -> Result<(), StoreError> {
    sqlx::query(
        r#"
        INSERT INTO organization_workers (organization_id, worker_id) VALUES ($1, $2)
        ON CONFLICT (organization_id, worker_id) DO UPDATE
        SET enabled = true, revoked_at = NULL, revocation_reason = '', updated_at = now()
        "#,
    )
    .bind(organization_id)
    .bind(worker_id)
    .execute(pool)
    .await?;
    Ok(())
}

/// A scan as `palisade scan show` prints it.
#[derive(Debug, Clone, sqlx::FromRow)]
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
    pub finished_at: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Debug, Clone, sqlx::FromRow)]
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

pub async fn scan(pool: &PgPool, scan_id: Uuid) -> Result<Option<ScanView>, StoreError> {
    Ok(sqlx::query_as::<_, ScanView>(
        r#"
        SELECT s.id, s.organization_id, t.locator AS target, s.client_id, s.idempotency_key, s.plugins,
               s.state, s.failure_code, s.failure_reason, s.finding_count, s.created_at, s.finished_at
        FROM scans s JOIN targets t ON t.id = s.target_id WHERE s.id = $1
        "#,
    )
    .bind(scan_id)
    .fetch_optional(pool)
    .await?)
}

pub async fn scan_jobs(pool: &PgPool, scan_id: Uuid) -> Result<Vec<ScanJobView>, StoreError> {
    Ok(sqlx::query_as::<_, ScanJobView>(
        r#"
        SELECT t.id AS task_id, j.position, j.plugin, j.state, t.state AS task_state, t.attempt_count, j.finding_count,
               j.asset_count, j.error_code, j.error_message
        FROM scan_jobs j LEFT JOIN worker_tasks t ON t.scan_job_id = j.id
        WHERE j.scan_id = $1 ORDER BY j.position
        "#,
    )
    .bind(scan_id)
    .fetch_all(pool)
    .await?)
}

/// A finding as stored.
#[derive(Debug, Clone, sqlx::FromRow)]
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
    Ok(sqlx::query_as::<_, FindingView>(
        r#"
        SELECT finding_key, plugin, rule_id, resource, severity, title, evidence, status, attempt_id
        FROM findings WHERE scan_id = $1 ORDER BY plugin, rule_id, resource
        "#,
    )
    .bind(scan_id)
    .fetch_all(pool)
    .await?)
}

/// (scans, completed scans) in the whole database: the demo's cross-check.
pub async fn scan_counts(pool: &PgPool) -> Result<(i64, i64), StoreError> {
    Ok(
        sqlx::query_as("SELECT count(*), count(*) FILTER (WHERE state = $1) FROM scans")
            .bind(crate::states::ScanState::Completed.as_str())
            .fetch_one(pool)
            .await?,
    )
}
