//! Ingestion one message at a time (SPEC §4.3): fenced, idempotent acceptance of result
//! batches, completions and failures, for what the set-wise script leaves to it (failures, a
//! repeat after an attempt's completion) and for `decide_each`.
//!
//! Every function runs inside the caller's transaction and returns a decision. A `Refused`
//! outcome has written nothing, and callers roll back their savepoint on it anyway, so that a
//! refusal can never commit a partial change.

use messages::v1;
use messages::{ErrorCode, EventKind, Subjects};
use prost::Message as _;
use sqlx::PgConnection;
use uuid::Uuid;

use crate::StoreError;
use crate::fence::lease_lost;
use crate::fence::{self, LeaseClaim, LockedAttempt};
use crate::outbox::{self, OutboxEvent, Staged};
use crate::progress::{self, CompletedJob, FailedTask, Failure};
use crate::retry::RetryPolicy;
use crate::sql;
use crate::states::{AttemptStatus, ResultBatchStatus, ScanJobState, TaskState};

/// What ingestion decided about one message.
#[derive(Debug, Clone, PartialEq)]
pub enum IngestOutcome {
    /// Written now.
    Accepted,
    /// Accepted earlier; nothing was written again.
    Duplicate,
    /// Refused; nothing was written.
    Refused(v1::Error),
}

/// One result batch, its checksum already verified against its payload.
#[derive(Debug, Clone)]
pub struct BatchParams<'a> {
    pub claim: &'a LeaseClaim,
    pub sequence_number: i32,
    pub idempotency_key: &'a str,
    pub payload_sha256: &'a str,
    pub findings: &'a [v1::Finding],
    pub assets: &'a [v1::Asset],
}

/// Accepts a batch once per (task, idempotency key) and persists its evidence.
pub async fn accept_batch(
    conn: &mut PgConnection,
    params: &BatchParams<'_>,
) -> Result<IngestOutcome, StoreError> {
    let claim = params.claim;
    // A replay is answered from the batch row alone, even after the task has ended.
    let existing: Option<String> = sql::query_scalar(sql::worker_result_batches::CHECKSUM_BY_KEY)
        .bind(claim.task_id)
        .bind(params.idempotency_key)
        .fetch_optional(&mut *conn)
        .await?;
    if let Some(checksum) = existing {
        return Ok(same_checksum_or_conflict(&checksum, params));
    }

    let locked = match lock_live(conn, claim).await? {
        Ok(locked) => locked,
        Err(refusal) => return Ok(IngestOutcome::Refused(refusal)),
    };
    let (Some(scan_id), Some(scan_job_id)) = (locked.scan_id, locked.scan_job_id) else {
        return Err(StoreError::Corrupt(format!(
            "task {} has no scan job",
            claim.task_id
        )));
    };

    let inserted: Option<Uuid> = sql::query_scalar(sql::worker_result_batches::INSERT)
        .bind(Uuid::now_v7())
        .bind(claim.task_id)
        .bind(claim.attempt_id)
        .bind(params.sequence_number)
        .bind(params.idempotency_key)
        .bind(params.payload_sha256)
        .bind(params.findings.len() as i32)
        .bind(params.assets.len() as i32)
        .bind(ResultBatchStatus::Persisted.as_str())
        .fetch_optional(&mut *conn)
        .await?;
    if inserted.is_none() {
        // We hold the task lock, so no concurrent insert of this key: the sequence number
        // was already used by this attempt under another key.
        return Ok(IngestOutcome::Refused(sequence_taken(params)));
    }

    crate::ingest::write_evidence(
        conn,
        &[crate::ingest::Evidence {
            params,
            plugin: &locked.plugin,
            organization_id: locked.organization_id,
            scan_id,
            scan_job_id,
        }],
    )
    .await?;

    sql::query(sql::worker_task_attempts::START)
        .bind(claim.attempt_id)
        .bind(AttemptStatus::Running.as_str())
        .bind(AttemptStatus::Leased.as_str())
        .execute(&mut *conn)
        .await?;
    sql::query(sql::worker_tasks::START)
        .bind(claim.task_id)
        .bind(TaskState::Running.as_str())
        .bind(TaskState::Leased.as_str())
        .execute(&mut *conn)
        .await?;
    Ok(IngestOutcome::Accepted)
}

/// The refusal of a batch whose sequence number its attempt already used under another key.
pub(crate) fn sequence_taken(params: &BatchParams<'_>) -> v1::Error {
    v1::Error::new(
        ErrorCode::BatchConflict,
        format!(
            "sequence number {} of attempt {} was already accepted under another idempotency key",
            params.sequence_number, params.claim.attempt_id
        ),
    )
}

pub(crate) fn same_checksum_or_conflict(checksum: &str, params: &BatchParams<'_>) -> IngestOutcome {
    if checksum == params.payload_sha256 {
        IngestOutcome::Duplicate
    } else {
        IngestOutcome::Refused(v1::Error::new(
            ErrorCode::BatchConflict,
            format!(
                "idempotency key {:?} was accepted with checksum {checksum}, not {}; a key must always carry the same payload",
                params.idempotency_key, params.payload_sha256
            ),
        ))
    }
}

/// Locks the attempt and task and checks the claim still holds the lease.
async fn lock_live(
    conn: &mut PgConnection,
    claim: &LeaseClaim,
) -> Result<Result<LockedAttempt, v1::Error>, StoreError> {
    let Some(locked) = fence::lock(conn, claim).await? else {
        return Ok(Err(lease_lost(claim)));
    };
    match locked.refusal(claim)? {
        None => Ok(Ok(locked)),
        Some(refusal) => Ok(Err(refusal)),
    }
}

/// Completes an attempt: every batch below `batch_count` must be persisted. Publishes the
/// scan job's evidence once, then creates the next plugin's task or completes the scan (and
/// creates its one enrichment job).
pub async fn complete(
    conn: &mut PgConnection,
    staged: &mut Staged,
    subjects: &Subjects,
    claim: &LeaseClaim,
    batch_count: i32,
    summary: &str,
) -> Result<IngestOutcome, StoreError> {
    let Some(locked) = fence::lock(conn, claim).await? else {
        return Ok(IngestOutcome::Refused(lease_lost(claim)));
    };
    if locked.is_presented_by(claim) && locked.attempt_status()? == AttemptStatus::Succeeded {
        return Ok(IngestOutcome::Duplicate);
    }
    let locked = match lock_live(conn, claim).await? {
        Ok(locked) => locked,
        Err(refusal) => return Ok(IngestOutcome::Refused(refusal)),
    };
    let (Some(scan_id), Some(scan_job_id)) = (locked.scan_id, locked.scan_job_id) else {
        return Err(StoreError::Corrupt(format!(
            "task {} has no scan job",
            claim.task_id
        )));
    };

    let below: i64 = sql::query_scalar(sql::worker_result_batches::COUNT_BELOW)
        .bind(claim.attempt_id)
        .bind(batch_count)
        .fetch_one(&mut *conn)
        .await?;
    if below < i64::from(batch_count) {
        return Ok(IngestOutcome::Refused(
            missing_batches(conn, claim.attempt_id, batch_count).await?,
        ));
    }
    let beyond: i64 = sql::query_scalar(sql::worker_result_batches::COUNT_FROM)
        .bind(claim.attempt_id)
        .bind(batch_count)
        .fetch_one(&mut *conn)
        .await?;
    if beyond > 0 {
        return Ok(IngestOutcome::Refused(beyond_batch_count(
            beyond,
            batch_count,
        )));
    }

    let (already_published, position): (bool, i32) =
        sql::query_as(sql::scan_jobs::LOCK_FOR_COMPLETION)
            .bind(scan_job_id)
            .fetch_one(&mut *conn)
            .await?;
    if already_published {
        return Ok(IngestOutcome::Refused(evidence_conflict(scan_job_id)));
    }

    // What superseded attempts of this job left behind is not this job's evidence.
    sql::query(sql::findings::DELETE_SUPERSEDED)
        .bind(scan_job_id)
        .bind(claim.attempt_id)
        .execute(&mut *conn)
        .await?;
    sql::query(sql::scan_assets::DELETE_SUPERSEDED)
        .bind(scan_job_id)
        .bind(claim.attempt_id)
        .execute(&mut *conn)
        .await?;
    let (finding_count, asset_count): (i64, i64) = sql::query_as(sql::findings::COUNT_FOR_JOB)
        .bind(scan_job_id)
        .fetch_one(&mut *conn)
        .await?;

    sql::query(sql::worker_task_attempts::COMPLETE)
        .bind(claim.attempt_id)
        .bind(AttemptStatus::Succeeded.as_str())
        .execute(&mut *conn)
        .await?;
    sql::query(sql::worker_tasks::COMPLETE)
        .bind(claim.task_id)
        .bind(TaskState::Completed.as_str())
        .execute(&mut *conn)
        .await?;
    sql::query(sql::scan_jobs::PUBLISH_EVIDENCE)
        .bind(scan_job_id)
        .bind(finding_count as i32)
        .bind(asset_count as i32)
        .bind(summary)
        .bind(ScanJobState::Completed.as_str())
        .execute(&mut *conn)
        .await?;

    let mut events = vec![OutboxEvent::new(
        subjects,
        EventKind::TaskCompleted,
        v1::TaskCompleted {
            task_id: claim.task_id.to_string(),
            attempt_id: claim.attempt_id.to_string(),
            scan_id: scan_id.to_string(),
            plugin: locked.plugin.clone(),
            finding_count: finding_count as u32,
            asset_count: asset_count as u32,
        }
        .encode_to_vec(),
    )];

    events.extend(
        progress::advance(
            conn,
            subjects,
            &[CompletedJob {
                organization_id: locked.organization_id,
                scan_id,
                position,
                max_attempts: locked.max_attempts,
            }],
        )
        .await?,
    );
    outbox::stage(conn, staged, events).await?;
    Ok(IngestOutcome::Accepted)
}

/// The refusal of a completion with batches below `batch_count` missing, naming up to 1,000.
pub(crate) async fn missing_batches(
    conn: &mut PgConnection,
    attempt_id: Uuid,
    batch_count: i32,
) -> Result<v1::Error, StoreError> {
    let missing: Vec<i32> = sql::query_scalar(sql::worker_result_batches::MISSING)
        .bind(attempt_id)
        .bind(batch_count)
        .fetch_all(conn)
        .await?;
    let mut error = v1::Error::new(
        ErrorCode::BatchMissing,
        format!(
            "{} of {batch_count} batches were never persisted; resend them, then complete again",
            missing.len()
        ),
    );
    error.missing_sequence_numbers = missing.into_iter().map(|s| s as u32).collect();
    Ok(error)
}

/// The refusal of a completion whose attempt has batches at or above its `batch_count`.
pub(crate) fn beyond_batch_count(beyond: i64, batch_count: i32) -> v1::Error {
    v1::Error::new(
        ErrorCode::SequenceOutOfRange,
        format!(
            "{beyond} accepted batches have sequence numbers at or above batch_count {batch_count}"
        ),
    )
}

/// The refusal of a completion whose scan job published its evidence already.
pub(crate) fn evidence_conflict(scan_job_id: Uuid) -> v1::Error {
    v1::Error::new(
        ErrorCode::EvidenceConflict,
        format!("scan job {scan_job_id} already published its evidence; it is never replaced"),
    )
}

/// A worker-reported failure.
#[derive(Debug, Clone)]
pub struct FailParams<'a> {
    pub claim: &'a LeaseClaim,
    pub error_code: &'a str,
    pub error_message: &'a str,
    pub retryable: bool,
    pub retry: RetryPolicy,
}

/// Fails an attempt: the task waits for a retry while budget remains and the failure is
/// retryable; otherwise it fails terminally and so does its scan ([`progress::fail_tasks`]
/// with one task, the failure logic the reaper's sweeps share).
pub async fn fail(
    conn: &mut PgConnection,
    staged: &mut Staged,
    subjects: &Subjects,
    params: &FailParams<'_>,
) -> Result<IngestOutcome, StoreError> {
    let claim = params.claim;
    let Some(locked) = fence::lock(conn, claim).await? else {
        return Ok(IngestOutcome::Refused(lease_lost(claim)));
    };
    if locked.is_presented_by(claim) && locked.attempt_status()? == AttemptStatus::Failed {
        return Ok(IngestOutcome::Duplicate);
    }
    let locked = match lock_live(conn, claim).await? {
        Ok(locked) => locked,
        Err(refusal) => return Ok(IngestOutcome::Refused(refusal)),
    };
    sql::query(sql::worker_task_attempts::FAIL)
        .bind(claim.attempt_id)
        .bind(params.error_code)
        .bind(params.error_message)
        .bind(AttemptStatus::Failed.as_str())
        .execute(&mut *conn)
        .await?;
    let error = v1::Error {
        code: params.error_code.to_owned(),
        message: params.error_message.to_owned(),
        ..Default::default()
    };
    let failed = progress::fail_tasks(
        conn,
        subjects,
        params.retry,
        &Failure {
            error: &error,
            task_message: &error.message,
            retryable: params.retryable,
            scan_reason: &format!("failed: {}", error.message),
            from: &TaskState::LEASED,
        },
        &[FailedTask {
            task_id: claim.task_id,
            attempt_id: Some(claim.attempt_id),
            organization_id: locked.organization_id,
            scan_id: locked.scan_id,
            scan_job_id: locked.scan_job_id,
            plugin: &locked.plugin,
            attempt_count: locked.attempt_count,
            max_attempts: locked.max_attempts,
        }],
    )
    .await?;
    outbox::stage(conn, staged, failed.events).await?;
    Ok(IngestOutcome::Accepted)
}
