//! Enrichment jobs (SPEC §4.4): one per completed scan, claimed under a fenced lease, in
//! batches: one statement claims many, one reads their scans' CVE ids, one completes them.
//! This step claims, renews nothing yet, and completes; CVE lookups arrive with the
//! enrichment issue.

use std::collections::HashMap;
use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::sql;
use crate::states::EnrichmentJobState;

/// A claimed job: `fencing_token` must accompany every write.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct ClaimedJob {
    pub id: Uuid,
    pub scan_id: Uuid,
    pub fencing_token: i64,
    /// W3C `traceparent` of the scan's trace; `None` when admission ran without `telemetry::init`.
    pub trace_context: Option<String>,
}

/// Claims up to `limit` of the oldest due jobs (pending, or running with an expired lease) in
/// one statement, `SKIP LOCKED`, each with a fresh fencing token.
pub async fn claim(
    pool: &PgPool,
    owner: &str,
    lease_ttl: Duration,
    limit: i64,
) -> Result<Vec<ClaimedJob>, StoreError> {
    Ok(
        sql::query_as::<ClaimedJob>(sql::enrichment_jobs::CLAIM_MANY)
            .bind(owner)
            .bind(crate::seconds(lease_ttl))
            .bind(limit)
            .bind(EnrichmentJobState::Pending.as_str())
            .bind(EnrichmentJobState::Running.as_str())
            .fetch_all(pool)
            .await?,
    )
}

/// The CVE ids of each scan's findings, in one statement; a scan without any is absent.
pub async fn scan_cve_ids(
    pool: &PgPool,
    scan_ids: &[Uuid],
) -> Result<HashMap<Uuid, Vec<String>>, StoreError> {
    let rows: Vec<(Uuid, Vec<String>)> = sql::query_as(sql::findings::CVE_IDS_OF_SCANS)
        .bind(scan_ids)
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().collect())
}

/// Completes, in one statement, each job that still holds its lease, with its checkpoint;
/// returns the ids completed (a job missing was fenced out by a newer claim).
pub async fn complete(
    pool: &PgPool,
    jobs: &[(&ClaimedJob, serde_json::Value)],
) -> Result<Vec<Uuid>, StoreError> {
    if jobs.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = jobs.iter().map(|(job, _)| job.id).collect();
    let tokens: Vec<i64> = jobs.iter().map(|(job, _)| job.fencing_token).collect();
    let checkpoints: Vec<serde_json::Value> = jobs
        .iter()
        .map(|(_, checkpoint)| checkpoint.clone())
        .collect();
    Ok(sql::query_scalar(sql::enrichment_jobs::COMPLETE_MANY)
        .bind(&ids)
        .bind(&tokens)
        .bind(&checkpoints)
        .bind(EnrichmentJobState::Completed.as_str())
        .bind(EnrichmentJobState::Running.as_str())
        .fetch_all(pool)
        .await?)
}
