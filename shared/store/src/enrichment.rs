//! Enrichment jobs (SPEC §4.4): one per completed scan, claimed under a fenced lease, in
//! batches: one statement claims many, one reads their scans' CVE ids, one completes them.
//! This step claims, renews nothing yet, and completes; CVE lookups arrive with the
//! enrichment issue.

use std::collections::HashMap;
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

/// Claims up to `limit` of the oldest due jobs (pending, or running with an expired lease) in
/// one statement, `SKIP LOCKED`, each with a fresh fencing token.
pub async fn claim(
    pool: &PgPool,
    owner: &str,
    lease_ttl: Duration,
    limit: i64,
) -> Result<Vec<ClaimedJob>, StoreError> {
    Ok(sqlx::query_as::<_, ClaimedJob>(
        r#"
        WITH due AS (
            SELECT id FROM enrichment_jobs
            WHERE (state = $4 AND available_at <= now())
               OR (state = $5 AND lease_expires_at <= now())
            ORDER BY available_at, created_at
            LIMIT $3
            FOR UPDATE SKIP LOCKED
        )
        UPDATE enrichment_jobs j
        SET state = $5, lease_owner = $1, lease_expires_at = now() + make_interval(secs => $2),
            last_heartbeat_at = now(), fencing_token = j.fencing_token + 1, attempt_count = j.attempt_count + 1,
            updated_at = now()
        FROM due WHERE j.id = due.id
        RETURNING j.id, j.scan_id, j.fencing_token,
                  (SELECT s.trace_context FROM scans s WHERE s.id = j.scan_id) AS trace_context
        "#,
    )
    .bind(owner)
    .bind(crate::seconds(lease_ttl))
    .bind(limit)
    .bind(EnrichmentJobState::Pending.as_str())
    .bind(EnrichmentJobState::Running.as_str())
    .fetch_all(pool)
    .await?)
}

/// The CVE ids of each scan's findings, in one statement; a scan without any is absent.
pub async fn scan_cve_ids(
    pool: &PgPool,
    scan_ids: &[Uuid],
) -> Result<HashMap<Uuid, Vec<String>>, StoreError> {
    let rows: Vec<(Uuid, Vec<String>)> = sqlx::query_as(
        r#"
        SELECT f.scan_id, array_agg(DISTINCT cve.id ORDER BY cve.id)
        FROM findings f, unnest(f.cve_ids) AS cve(id)
        WHERE f.scan_id = ANY($1) AND cardinality(f.cve_ids) > 0
        GROUP BY f.scan_id
        "#,
    )
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
    Ok(sqlx::query_scalar(
        r#"
        UPDATE enrichment_jobs j
        SET state = $4, checkpoint = c.checkpoint, finished_at = now(), lease_owner = NULL,
            lease_expires_at = NULL, updated_at = now()
        FROM UNNEST($1::uuid[], $2::bigint[], $3::jsonb[]) AS c(id, fencing_token, checkpoint)
        WHERE j.id = c.id AND j.fencing_token = c.fencing_token AND j.state = $5
          AND j.lease_expires_at > now()
        RETURNING j.id
        "#,
    )
    .bind(&ids)
    .bind(&tokens)
    .bind(&checkpoints)
    .bind(EnrichmentJobState::Completed.as_str())
    .bind(EnrichmentJobState::Running.as_str())
    .fetch_all(pool)
    .await?)
}
