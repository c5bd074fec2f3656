//! Enrichment jobs (SPEC §4.4, I11): one per completed scan, claimed under a fenced lease,
//! renewed while worked on, checkpointed, retried with the one backoff policy up to exactly
//! `max_attempts` executions, then `failed`; the reaper returns lapsed claims to the queue
//! ([`recover_expired`]). Every write of a claimed job (renewal, checkpoint, completion,
//! failure) names its fencing token and changes nothing once a newer claim holds the job.

use std::collections::HashMap;
use std::time::Duration;

use messages::{EventKind, Subjects, v1};
use prost::Message as _;
use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::outbox::{self, OutboxEvent};
use crate::retry::RetryPolicy;
use crate::sql;
use crate::states::EnrichmentJobState;

/// A claimed job: `fencing_token` must accompany every write.
#[derive(Debug, Clone, PartialEq, sqlx::FromRow)]
pub struct ClaimedJob {
    pub id: Uuid,
    pub scan_id: Uuid,
    pub organization_id: Uuid,
    pub fencing_token: i64,
    /// Executions started, this claim's included.
    pub attempt_count: i32,
    pub max_attempts: i32,
    /// Progress recorded by earlier executions (`{}` for none): the work resumes from it.
    pub checkpoint: serde_json::Value,
    /// W3C `traceparent` of the scan's trace; `None` when admission ran without `telemetry::init`.
    pub trace_context: Option<String>,
}

impl ClaimedJob {
    /// Whether a failure of this execution may be retried: executions are left.
    pub fn has_executions_left(&self) -> bool {
        self.attempt_count < self.max_attempts
    }

    /// The claim this job's writes elsewhere (CVE rows, findings) name.
    pub fn fence(&self) -> crate::cves::JobFence {
        crate::cves::JobFence {
            job_id: self.id,
            fencing_token: self.fencing_token,
        }
    }
}

/// Claims up to `limit` of the oldest due pending jobs in one statement, `SKIP LOCKED`, each
/// with a fresh fencing token; the claim counts as one execution.
pub async fn claim(
    pool: &PgPool,
    owner: &str,
    lease_ttl: Duration,
    limit: i64,
) -> Result<Vec<ClaimedJob>, StoreError> {
    Ok(sql::enrichment_jobs::ClaimMany {
        owner,
        lease_ttl_seconds: crate::seconds(lease_ttl),
        limit,
        pending_state: EnrichmentJobState::Pending.as_str(),
        running_state: EnrichmentJobState::Running.as_str(),
    }
    .query_as::<ClaimedJob>()
    .fetch_all(pool)
    .await?)
}

/// The CVE ids of each scan's findings, in one statement; a scan without any is absent.
pub async fn scan_cve_ids(
    pool: &PgPool,
    scan_ids: &[Uuid],
) -> Result<HashMap<Uuid, Vec<String>>, StoreError> {
    let rows: Vec<(Uuid, Vec<String>)> = sql::findings::CveIdsOfScans { scan_ids }
        .query_as()
        .fetch_all(pool)
        .await?;
    Ok(rows.into_iter().collect())
}

/// Extends `job`'s lease by `lease_ttl`; false when the job was lost (fenced out or lapsed).
pub async fn renew(
    pool: &PgPool,
    job: &ClaimedJob,
    lease_ttl: Duration,
) -> Result<bool, StoreError> {
    let renewed: Option<Uuid> = sql::enrichment_jobs::Renew {
        job_id: job.id,
        fencing_token: job.fencing_token,
        lease_ttl_seconds: crate::seconds(lease_ttl),
        running_state: EnrichmentJobState::Running.as_str(),
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(renewed.is_some())
}

/// Records `job`'s progress; false when the job was lost and nothing was written.
pub async fn checkpoint(
    pool: &PgPool,
    job: &ClaimedJob,
    checkpoint: &serde_json::Value,
) -> Result<bool, StoreError> {
    let written: Option<Uuid> = sql::enrichment_jobs::Checkpoint {
        job_id: job.id,
        fencing_token: job.fencing_token,
        checkpoint,
        running_state: EnrichmentJobState::Running.as_str(),
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(written.is_some())
}

/// A job row an ending statement returned, for its event.
#[derive(Debug, sqlx::FromRow)]
struct Ended {
    id: Uuid,
    scan_id: Uuid,
    organization_id: Uuid,
    attempt_count: i32,
    finished_at_unix_ms: i64,
}

/// A job row a failing statement returned: where it went.
#[derive(Debug, sqlx::FromRow)]
struct FailedRow {
    id: Uuid,
    scan_id: Uuid,
    organization_id: Uuid,
    attempt_count: i32,
    state: String,
    finished_at_unix_ms: i64,
}

impl FailedRow {
    fn failed(&self) -> bool {
        self.state == EnrichmentJobState::Failed.as_str()
    }

    fn event(&self, subjects: &Subjects, error: &v1::Error) -> OutboxEvent {
        OutboxEvent::for_tenant(
            subjects,
            &self.organization_id,
            EventKind::EnrichmentFailed,
            v1::EnrichmentFailed {
                scan_id: self.scan_id.to_string(),
                organization_id: self.organization_id.to_string(),
                job_id: self.id.to_string(),
                attempts: self.attempt_count.max(0) as u32,
                error: Some(error.clone()),
                failed_at_unix_ms: self.finished_at_unix_ms,
            }
            .encode_to_vec(),
        )
        .in_trace_of(self.scan_id)
    }
}

/// Completes, in one transaction, each job that still holds its lease, with its final
/// checkpoint, and enqueues its `enrichment.completed`; returns the ids completed (a job
/// missing was fenced out by a newer claim, or its lease lapsed, and nothing of it changed).
pub async fn complete(
    pool: &PgPool,
    subjects: &Subjects,
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
    let mut tx = pool.begin().await?;
    let ended: Vec<Ended> = sql::enrichment_jobs::CompleteMany {
        ids: &ids,
        tokens: &tokens,
        checkpoints: &checkpoints,
        completed_state: EnrichmentJobState::Completed.as_str(),
        running_state: EnrichmentJobState::Running.as_str(),
    }
    .query_as()
    .fetch_all(&mut *tx)
    .await?;
    let events: Vec<OutboxEvent> = ended
        .iter()
        .map(|row| {
            OutboxEvent::for_tenant(
                subjects,
                &row.organization_id,
                EventKind::EnrichmentCompleted,
                v1::EnrichmentCompleted {
                    scan_id: row.scan_id.to_string(),
                    organization_id: row.organization_id.to_string(),
                    job_id: row.id.to_string(),
                    attempts: row.attempt_count.max(0) as u32,
                    completed_at_unix_ms: row.finished_at_unix_ms,
                }
                .encode_to_vec(),
            )
            .in_trace_of(row.scan_id)
        })
        .collect();
    outbox::enqueue(&mut tx, &events).await?;
    tx.commit().await?;
    Ok(ended.into_iter().map(|row| row.id).collect())
}

/// What [`fail`] did with a failed execution.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailOutcome {
    /// Back to pending, due after the backoff.
    Retrying { after: Duration },
    /// Failed for good (`enrichment.failed` enqueued): executions spent or not retryable.
    Failed,
    /// The job was lost meanwhile: nothing was written.
    Fenced,
}

/// Ends `job`'s execution with `error`: back to pending after the jittered backoff of its
/// executions so far when `retryable` and executions are left, else failed for good with its
/// `enrichment.failed` event. The error is kept in `last_error` either way.
pub async fn fail(
    pool: &PgPool,
    subjects: &Subjects,
    retry: RetryPolicy,
    job: &ClaimedJob,
    error: &v1::Error,
    retryable: bool,
) -> Result<FailOutcome, StoreError> {
    let retries = retryable && job.has_executions_left();
    let after = if retries {
        retry.jittered(job.attempt_count.max(1) as u32)
    } else {
        Duration::ZERO
    };
    let mut tx = pool.begin().await?;
    let row: Option<FailedRow> = sql::enrichment_jobs::Fail {
        job_id: job.id,
        fencing_token: job.fencing_token,
        error: last_error(error),
        retry: retries,
        delay_seconds: crate::seconds(after),
        pending_state: EnrichmentJobState::Pending.as_str(),
        failed_state: EnrichmentJobState::Failed.as_str(),
        running_state: EnrichmentJobState::Running.as_str(),
    }
    .query_as()
    .fetch_optional(&mut *tx)
    .await?;
    let outcome = match row {
        None => FailOutcome::Fenced,
        Some(row) if row.failed() => {
            outbox::enqueue(&mut tx, &[row.event(subjects, error)]).await?;
            FailOutcome::Failed
        }
        Some(_) => FailOutcome::Retrying { after },
    };
    tx.commit().await?;
    Ok(outcome)
}

/// What one [`recover_expired`] sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveredJobs {
    /// Back to pending, after their backoff.
    pub retried: Vec<Uuid>,
    /// Executions spent: failed for good.
    pub failed: Vec<Uuid>,
}

impl RecoveredJobs {
    pub fn is_empty(&self) -> bool {
        self.retried.is_empty() && self.failed.is_empty()
    }
}

/// A lapsed claim the reaper locked.
#[derive(Debug, sqlx::FromRow)]
struct Expired {
    id: Uuid,
    attempt_count: i32,
    max_attempts: i32,
}

/// The reaper's sweep of lapsed enrichment claims, in one transaction of three statements
/// whatever their number: up to `limit` running jobs whose lease lapsed are locked
/// (`SKIP LOCKED`), returned to pending after the backoff of their executions so far, or failed
/// for good once `max_attempts` executions were spent (with `enrichment.failed`).
pub async fn recover_expired(
    pool: &PgPool,
    subjects: &Subjects,
    retry: RetryPolicy,
    limit: i64,
) -> Result<RecoveredJobs, StoreError> {
    let mut tx = pool.begin().await?;
    let expired: Vec<Expired> = sql::enrichment_jobs::LockExpired {
        limit,
        running_state: EnrichmentJobState::Running.as_str(),
    }
    .query_as()
    .fetch_all(&mut *tx)
    .await?;
    if expired.is_empty() {
        tx.commit().await?;
        return Ok(RecoveredJobs::default());
    }
    let ids: Vec<Uuid> = expired.iter().map(|job| job.id).collect();
    let retries: Vec<bool> = expired
        .iter()
        .map(|job| job.attempt_count < job.max_attempts)
        .collect();
    let delays: Vec<f64> = expired
        .iter()
        .zip(&retries)
        .map(|(job, &retries)| {
            if retries {
                crate::seconds(retry.jittered(job.attempt_count.max(1) as u32))
            } else {
                0.0
            }
        })
        .collect();
    let error = lease_expired();
    let rows: Vec<FailedRow> = sql::enrichment_jobs::RecoverMany {
        ids: &ids,
        retries: &retries,
        delay_seconds: &delays,
        error: last_error(&error),
        pending_state: EnrichmentJobState::Pending.as_str(),
        failed_state: EnrichmentJobState::Failed.as_str(),
    }
    .query_as()
    .fetch_all(&mut *tx)
    .await?;
    let events: Vec<OutboxEvent> = rows
        .iter()
        .filter(|row| row.failed())
        .map(|row| row.event(subjects, &error))
        .collect();
    outbox::enqueue(&mut tx, &events).await?;
    tx.commit().await?;
    let (failed, retried): (Vec<&FailedRow>, Vec<&FailedRow>) =
        rows.iter().partition(|row| row.failed());
    Ok(RecoveredJobs {
        retried: retried.into_iter().map(|row| row.id).collect(),
        failed: failed.into_iter().map(|row| row.id).collect(),
    })
}

/// Why the reaper ended an execution.
fn lease_expired() -> v1::Error {
    v1::Error {
        code: "lease_expired".into(),
        message: "the enrichment job's lease expired before it finished (its process crashed or \
                  stalled)"
            .into(),
        ..Default::default()
    }
}

/// How an execution's error is kept in `last_error`.
fn last_error(error: &v1::Error) -> String {
    format!("{}: {}", error.code, error.message)
}

/// What requesting enrichment of a scan did (SPEC §4.4: four outcomes, one answer shape).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RequestOutcome {
    /// The scan had no job: one was created, pending (a finding names a CVE).
    Created { job_id: Uuid },
    /// Its job had failed: back to pending with a fresh budget of executions, keeping its
    /// checkpoint and last error.
    Requeued { job_id: Uuid },
    /// Its job is pending or running: nothing was changed (a live claim is never disturbed).
    Active {
        job_id: Uuid,
        state: EnrichmentJobState,
    },
    /// Its job completed (or, having no job and nothing to enrich, it was recorded as such).
    Completed { job_id: Uuid },
    /// No such scan in the organization.
    NotFound,
    /// The scan has not completed (or failed, or was cancelled): there is nothing to enrich yet.
    NotCompleted { scan_state: String },
}

impl RequestOutcome {
    /// The outcome's wire name.
    pub fn name(&self) -> &'static str {
        match self {
            RequestOutcome::Created { .. } => "created",
            RequestOutcome::Requeued { .. } => "requeued",
            RequestOutcome::Active { .. } => "active",
            RequestOutcome::Completed { .. } => "completed",
            RequestOutcome::NotFound => "not_found",
            RequestOutcome::NotCompleted { .. } => "not_completed",
        }
    }
}

#[derive(Debug, sqlx::FromRow)]
struct ForRequest {
    scan_state: String,
    job_id: Option<Uuid>,
    job_state: Option<String>,
}

/// Requests enrichment of `scan_id` (of `organization_id`, or any organization for the
/// operator's command). Concurrent requests converge: of many that find a failed job, exactly
/// one requeues it and the others answer `Active`.
pub async fn request(
    pool: &PgPool,
    organization_id: Option<Uuid>,
    scan_id: Uuid,
) -> Result<RequestOutcome, StoreError> {
    // At most three rounds: a row created or requeued by a concurrent request is read again.
    for _ in 0..3 {
        if let Some(outcome) = request_round(pool, organization_id, scan_id).await? {
            return Ok(outcome);
        }
    }
    // Three rounds each overtaken by another request: the job is being requested right now.
    let found: Option<(Uuid, String)> = sql::enrichment_jobs::ForRequest {
        scan_id,
        organization_id,
    }
    .query_as()
    .fetch_optional(pool)
    .await?
    .and_then(|row: ForRequest| row.job_id.zip(row.job_state));
    match found {
        Some((job_id, state)) => match job_state_of(&state)? {
            EnrichmentJobState::Completed => Ok(RequestOutcome::Completed { job_id }),
            state => Ok(RequestOutcome::Active { job_id, state }),
        },
        None => Ok(RequestOutcome::NotFound),
    }
}

/// One round of [`request`]: reads the scan and its job, then creates the job when there is
/// none or requeues it when it failed. `None` when a concurrent request overtook the write:
/// the caller reads again.
async fn request_round(
    pool: &PgPool,
    organization_id: Option<Uuid>,
    scan_id: Uuid,
) -> Result<Option<RequestOutcome>, StoreError> {
    let found: Option<ForRequest> = sql::enrichment_jobs::ForRequest {
        scan_id,
        organization_id,
    }
    .query_as()
    .fetch_optional(pool)
    .await?;
    let Some(found) = found else {
        return Ok(Some(RequestOutcome::NotFound));
    };
    if found.scan_state != crate::states::ScanState::Completed.as_str() {
        return Ok(Some(RequestOutcome::NotCompleted {
            scan_state: found.scan_state,
        }));
    }
    let (Some(job_id), Some(job_state)) = (found.job_id, found.job_state) else {
        return create_for_request(pool, scan_id).await;
    };
    let state = job_state_of(&job_state)?;
    Ok(match state {
        EnrichmentJobState::Completed => Some(RequestOutcome::Completed { job_id }),
        EnrichmentJobState::Pending | EnrichmentJobState::Running => {
            Some(RequestOutcome::Active { job_id, state })
        }
        EnrichmentJobState::Failed => {
            let requeued: Option<Uuid> = sql::enrichment_jobs::Requeue {
                job_id,
                pending_state: EnrichmentJobState::Pending.as_str(),
                failed_state: EnrichmentJobState::Failed.as_str(),
            }
            .query_scalar()
            .fetch_optional(pool)
            .await?;
            requeued.map(|_| RequestOutcome::Requeued { job_id })
        }
    })
}

/// Creates the completed scan's missing job: `Created`, or `Completed` when the scan has
/// nothing to enrich; `None` when a concurrent request created it first.
async fn create_for_request(
    pool: &PgPool,
    scan_id: Uuid,
) -> Result<Option<RequestOutcome>, StoreError> {
    let job_id = Uuid::now_v7();
    let created: Option<String> = sql::enrichment_jobs::CreateForRequest {
        job_id,
        scan_id,
        pending_state: EnrichmentJobState::Pending.as_str(),
        completed_state: EnrichmentJobState::Completed.as_str(),
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(match created.as_deref().map(EnrichmentJobState::parse) {
        Some(Some(EnrichmentJobState::Pending)) => Some(RequestOutcome::Created { job_id }),
        Some(_) => Some(RequestOutcome::Completed { job_id }),
        None => None,
    })
}

fn job_state_of(text: &str) -> Result<EnrichmentJobState, StoreError> {
    EnrichmentJobState::parse(text)
        .ok_or_else(|| StoreError::Corrupt(format!("enrichment job state {text:?}")))
}
