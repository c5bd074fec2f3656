//! Enrichment jobs (SPEC §4.4): one per completed scan, claimed under a fenced lease.
//! This first step claims, renews nothing yet, and completes; CVE lookups arrive with the
//! enrichment issue.

use std::time::Duration;

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
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

/// Claims the oldest due job (pending, or running with an expired lease), `SKIP LOCKED`.
pub async fn claim(
    pool: &PgPool,
    owner: &str,
    lease_ttl: Duration,
) -> Result<Option<ClaimedJob>, StoreError> {
    Ok(sqlx::query_as::<_, ClaimedJob>(
        r#"
        WITH due AS (
            SELECT id FROM enrichment_jobs
            WHERE (state = $3 AND available_at <= now())
               OR (state = $4 AND lease_expires_at <= now())
            ORDER BY available_at, created_at
            LIMIT 1
            FOR UPDATE SKIP LOCKED
        )
        UPDATE enrichment_jobs j
        SET state = $4, lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2),
            last_heartbeat_at = now(), fencing_token = j.fencing_token + 1, attempt_count = j.attempt_count + 1,
            updated_at = now()
        FROM due WHERE j.id = due.id
        RETURNING j.id, j.scan_id, j.fencing_token,
                  (SELECT s.trace_context FROM scans s WHERE s.id = j.scan_id) AS trace_context
        "#,
    )
    .bind(owner)
    .bind(crate::seconds(lease_ttl))
    .bind(EnrichmentJobState::Pending.as_str())
    .bind(EnrichmentJobState::Running.as_str())
    .fetch_optional(pool)
    .await?)
}

/// The CVE ids of a scan's findings.
pub async fn scan_cve_ids(pool: &PgPool, scan_id: Uuid) -> Result<Vec<String>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT DISTINCT unnest(cve_ids) FROM findings WHERE scan_id = $1 AND cardinality(cve_ids) > 0 ORDER BY 1",
    )
    .bind(scan_id)
    .fetch_all(pool)
    .await?)
}

/// Completes the job if `job` still holds its lease; false when a newer claim fenced it out.
pub async fn complete(
    pool: &PgPool,
    job: &ClaimedJob,
    checkpoint: serde_json::Value,
) -> Result<bool, StoreError> {
    let updated = sqlx::query(
        r#"
        UPDATE enrichment_jobs
        SET state = $4, checkpoint = $3, finished_at = now(), lease_owner = NULL,
            lease_expires_at = NULL, updated_at = now()
        WHERE id = $1 AND fencing_token = $2 AND state = $5 AND lease_expires_at > now()
        "#,
    )
    .bind(job.id)
    .bind(job.fencing_token)
    .bind(checkpoint)
    .bind(EnrichmentJobState::Completed.as_str())
    .bind(EnrichmentJobState::Running.as_str())
    .execute(pool)
    .await?;
    Ok(updated.rows_affected() == 1)
}
