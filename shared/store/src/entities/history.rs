//! History written set-wise in SQL: N completed one-plugin scans as a completed scan leaves
//! them (targets, scans, scan jobs, tasks, attempts, result batches, findings, assets and
//! their scan links, completed enrichment jobs; published events leave no outbox row), so that a
//! benchmark (`palisade bench --history N`) and the flat-cost system test
//! (`tests/tests/system/flat.rs`) run against full tables as well as empty ones. Not called
//! by any service.

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::sql;
use crate::states::{
    AttemptStatus, EnrichmentJobState, EvaluationStatus, ResultBatchStatus, ScanJobState,
    ScanState, Severity, TaskState,
};

/// Scans written per statement: one statement's work stays a few seconds.
pub const CHUNK_SCANS: usize = 50_000;

/// Writes `scans` completed scans of history for `organization_id`, their attempts held by
/// `worker_id`, then analyzes the database (a table never analyzed is planned as if it were
/// small). `progress` is told the scans written so far after each chunk.
pub async fn seed(
    pool: &PgPool,
    organization_id: Uuid,
    worker_id: Uuid,
    scans: usize,
    mut progress: impl FnMut(usize),
) -> Result<(), StoreError> {
    let mut written = 0;
    while written < scans {
        let chunk = CHUNK_SCANS.min(scans - written);
        sql::scans::SeedHistory {
            organization_id,
            first_number: written as i64,
            last_number: (written + chunk) as i64 - 1,
            worker_id,
            completed_scan_state: ScanState::Completed.as_str(),
            completed_job_state: ScanJobState::Completed.as_str(),
            completed_state: TaskState::Completed.as_str(),
            succeeded_status: AttemptStatus::Succeeded.as_str(),
            persisted_status: ResultBatchStatus::Persisted.as_str(),
            completed_enrichment_state: EnrichmentJobState::Completed.as_str(),
            low_severity: Severity::Low.as_str(),
            fail_status: EvaluationStatus::Fail.as_str(),
        }
        .query()
        .execute(pool)
        .await?;
        written += chunk;
        progress(written);
    }
    sql::query(sql::database::ANALYZE).execute(pool).await?;
    Ok(())
}
