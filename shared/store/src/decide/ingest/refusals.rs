//! The refusals of an ingestion decision that are not the fence's (`lease_lost`,
//! `cancel_requested`: [`crate::fence`]), each saying what happened and what the worker does.

use messages::{ErrorCode, v1};
use sqlx::PgConnection;
use uuid::Uuid;

use super::{BatchParams, IngestOutcome};
use crate::StoreError;
use crate::sql;

/// The refusal of a batch whose sequence number its attempt already used under another key.
pub(super) fn sequence_taken(params: &BatchParams<'_>) -> v1::Error {
    v1::Error::new(
        ErrorCode::BatchConflict,
        format!(
            "sequence number {} of attempt {} was already accepted under another idempotency key",
            params.sequence_number, params.claim.attempt_id
        ),
    )
}

/// A batch whose (attempt, idempotency key) was accepted before with `checksum`: a duplicate
/// when it carries the same payload, a conflict otherwise.
pub(super) fn same_checksum_or_conflict(checksum: &str, params: &BatchParams<'_>) -> IngestOutcome {
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

/// The refusal of a completion with batches below `batch_count` missing, naming up to 1,000.
pub(super) async fn missing_batches(
    conn: &mut PgConnection,
    attempt_id: Uuid,
    batch_count: i32,
) -> Result<v1::Error, StoreError> {
    let missing: Vec<i32> = sql::worker_result_batches::Missing {
        attempt_id,
        batch_count,
    }
    .query_scalar()
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
pub(super) fn beyond_batch_count(beyond: i64, batch_count: i32) -> v1::Error {
    v1::Error::new(
        ErrorCode::SequenceOutOfRange,
        format!(
            "{beyond} accepted batches have sequence numbers at or above batch_count {batch_count}"
        ),
    )
}

/// The refusal of a completion whose scan job published its evidence already.
pub(super) fn evidence_conflict(scan_job_id: Uuid) -> v1::Error {
    v1::Error::new(
        ErrorCode::EvidenceConflict,
        format!("scan job {scan_job_id} already published its evidence; it is never replaced"),
    )
}
