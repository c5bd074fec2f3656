//! Artifact upload sessions (RFC 003, `worker_artifact_uploads`): a worker holding a live
//! lease opens a session ([`prepare`]), sends its file on the bus (ingestion stores a chunk
//! only while [`open_for_chunks`] says the session takes them), and commits; ingestion
//! streams the file back into the store, and [`mark_uploaded`] / [`commit`] move the session on under the
//! fence, [`fail`] ends it when what arrived is not what the commit described. Ingestion
//! purges a committed session's chunks and records it ([`mark_removed`]). The reaper expires
//! sessions left open ([`crate::recover::expire_uploads`]) and removes what ended sessions left
//! on the bus ([`removable`], [`mark_removed`]): the chunks and any object of those that expired
//! or failed, the chunks of a committed one that ingestion did not purge.
//!
//! States: `prepared → uploaded → committed`, or `expired` / `failed` from either open state.
//! Only a committed session is an artifact of its scan.

use std::time::Duration;

use chrono::{DateTime, Utc};
use messages::{ErrorCode, v1};
use serde::Serialize;
use sqlx::PgPool;
use uuid::Uuid;

use crate::fence::{self, LeaseClaim};
use crate::sql;
use crate::states::UploadStatus;
use crate::{StoreError, seconds};

/// One upload session, as stored.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct Upload {
    pub id: Uuid,
    pub task_id: Uuid,
    pub attempt_id: Uuid,
    pub organization_id: Uuid,
    pub scan_id: Option<Uuid>,
    pub scan_job_id: Option<Uuid>,
    pub worker_id: Option<Uuid>,
    /// Where the file is (or would be) in the artifact store.
    pub object_key: String,
    pub original_name: String,
    pub content_type: String,
    /// Set once verified (`uploaded`).
    pub size_bytes: Option<i64>,
    /// Lowercase hex; empty until verified.
    pub sha256: String,
    pub chunks: Option<i32>,
    pub status: String,
    /// Why the session failed; empty otherwise.
    pub error: String,
    pub expires_at: DateTime<Utc>,
    pub uploaded_at: Option<DateTime<Utc>>,
    pub committed_at: Option<DateTime<Utc>>,
    /// When what the session left on the bus was removed: a committed session's chunks (its
    /// object is the artifact), an ended one's chunks and any object.
    pub removed_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
}

impl Upload {
    pub fn status(&self) -> Result<UploadStatus, StoreError> {
        UploadStatus::parse(&self.status)
            .ok_or_else(|| StoreError::Corrupt(format!("upload status {:?}", self.status)))
    }

    /// Whether `claim` names this session's attempt, from its worker.
    fn belongs_to(&self, claim: &LeaseClaim) -> bool {
        self.attempt_id == claim.attempt_id
            && self.task_id == claim.task_id
            && self.worker_id == Some(claim.worker_id)
    }
}

/// A prepare, as ingestion parsed it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare<'a> {
    pub claim: &'a LeaseClaim,
    pub upload_id: Uuid,
    pub name: &'a str,
    pub content_type: &'a str,
    /// How long the session stays open (`PALISADE_UPLOAD_TTL_MS`).
    pub ttl: Duration,
}

/// The object key of an upload: one per session, never reused.
pub fn object_key(upload_id: Uuid) -> String {
    upload_id.to_string()
}

/// Opens a session for `prepare.claim`'s attempt, which must hold its lease (checked under
/// the fence's locks), or returns the one a resent prepare with the same id opened. The same
/// id from another attempt, for another file, or of a session that already ended is an
/// `idempotency_conflict`.
pub async fn prepare(
    pool: &PgPool,
    prepare: &Prepare<'_>,
) -> Result<Result<Upload, v1::Error>, StoreError> {
    let claim = prepare.claim;
    let upload = match fenced(pool, claim, prepare.upload_id, async |conn| {
        Ok(Some(
            sql::worker_artifact_uploads::Prepare {
                upload_id: prepare.upload_id,
                task_id: claim.task_id,
                attempt_id: claim.attempt_id,
                worker_id: claim.worker_id,
                object_key: object_key(prepare.upload_id),
                name: prepare.name,
                content_type: prepare.content_type,
                ttl_seconds: seconds(prepare.ttl),
                prepared_status: UploadStatus::Prepared.as_str(),
            }
            .query_as::<Upload>()
            .fetch_one(conn)
            .await?,
        ))
    })
    .await?
    {
        Ok(upload) => upload,
        Err(refusal) => return Ok(Err(refusal)),
    };
    let conflict = |why: &str| {
        Ok(Err(v1::Error::new(
            ErrorCode::IdempotencyConflict,
            format!("upload {} {why}: prepare with a new upload_id", upload.id),
        )))
    };
    if !upload.belongs_to(claim)
        || upload.original_name != prepare.name
        || upload.content_type != prepare.content_type
    {
        return conflict("was prepared for another attempt or another file");
    }
    match upload.status()? {
        UploadStatus::Prepared | UploadStatus::Uploaded | UploadStatus::Committed => Ok(Ok(upload)),
        UploadStatus::Expired => conflict("expired"),
        UploadStatus::Failed => conflict("failed"),
    }
}

/// One session, in any state.
pub async fn get(pool: &PgPool, upload_id: Uuid) -> Result<Option<Upload>, StoreError> {
    Ok(sql::worker_artifact_uploads::Get { upload_id }
        .query_as::<Upload>()
        .fetch_optional(pool)
        .await?)
}

/// The session `claim` may commit: its own, whatever its state (a committed one answers a
/// resent commit), or `not_found` (another attempt's or nobody's: nothing tells them apart).
pub async fn of_claim(
    pool: &PgPool,
    claim: &LeaseClaim,
    upload_id: Uuid,
) -> Result<Result<Upload, v1::Error>, StoreError> {
    Ok(match get(pool, upload_id).await? {
        Some(upload) if upload.belongs_to(claim) => Ok(upload),
        _ => Err(v1::Error::new(
            ErrorCode::NotFound,
            format!("no upload session {upload_id} of this attempt: prepare one first"),
        )),
    })
}

/// Whether worker `worker_id` may still send chunks of session `upload_id`: the session is
/// its own, `prepared`, and not expired. Ingestion asks for every chunk before storing it.
pub async fn open_for_chunks(
    pool: &PgPool,
    worker_id: Uuid,
    upload_id: Uuid,
) -> Result<bool, StoreError> {
    Ok(sql::worker_artifact_uploads::OpenForChunks {
        upload_id,
        worker_id,
        prepared_status: UploadStatus::Prepared.as_str(),
    }
    .query_scalar::<Uuid>()
    .fetch_optional(pool)
    .await?
    .is_some())
}

/// What the commit describes, as ingestion records it `uploaded`: the chunk count and size
/// match what arrived; the sha256 is checked as the file streams into the store (a mismatch
/// then fails the session).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified<'a> {
    pub size_bytes: u64,
    pub sha256: &'a str,
    pub chunks: u32,
}

/// Runs `write` in a transaction after the fence (the claim must hold its lease); `None` from
/// `write` (no open session matched) is `not_found`, and nothing is committed.
async fn fenced<T>(
    pool: &PgPool,
    claim: &LeaseClaim,
    upload_id: Uuid,
    write: impl AsyncFnOnce(&mut sqlx::PgConnection) -> Result<Option<T>, StoreError>,
) -> Result<Result<T, v1::Error>, StoreError> {
    let mut tx = pool.begin().await?;
    let Some(locked) = fence::lock(&mut tx, claim).await? else {
        return Ok(Err(fence::lease_lost(claim)));
    };
    if let Some(refusal) = locked.refusal(claim)? {
        return Ok(Err(refusal));
    }
    let Some(written) = write(&mut tx).await? else {
        return Ok(Err(v1::Error::new(
            ErrorCode::NotFound,
            format!(
                "upload session {upload_id} is no longer open (expired, failed or committed meanwhile)"
            ),
        )));
    };
    tx.commit().await?;
    Ok(Ok(written))
}

/// An open, unexpired session's chunks were read back and match its commit's count and size:
/// `uploaded` (no chunk is stored for it any more), its file about to stream into the store.
/// Refused when the claim no longer holds its lease, or the session is not open.
pub async fn mark_uploaded(
    pool: &PgPool,
    claim: &LeaseClaim,
    upload_id: Uuid,
    verified: &Verified<'_>,
) -> Result<Result<(), v1::Error>, StoreError> {
    let size = i64::try_from(verified.size_bytes)
        .map_err(|_| StoreError::Corrupt(format!("size {}", verified.size_bytes)))?;
    let chunks = i32::try_from(verified.chunks)
        .map_err(|_| StoreError::Corrupt(format!("chunks {}", verified.chunks)))?;
    fenced(pool, claim, upload_id, async |conn| {
        Ok(sql::worker_artifact_uploads::MarkUploaded {
            upload_id,
            attempt_id: claim.attempt_id,
            size_bytes: size,
            sha256: verified.sha256,
            chunks,
            uploaded_status: UploadStatus::Uploaded.as_str(),
            open_statuses: UploadStatus::OPEN.map(UploadStatus::as_str),
        }
        .query_scalar::<Uuid>()
        .fetch_optional(conn)
        .await?)
    })
    .await
    .map(|written| written.map(|_: Uuid| ()))
}

/// A verified session whose file is in the artifact store: `committed`, an artifact of its
/// scan. Refused when the claim no longer holds its lease (the session then expires and the
/// reaper removes the file).
pub async fn commit(
    pool: &PgPool,
    claim: &LeaseClaim,
    upload_id: Uuid,
) -> Result<Result<(), v1::Error>, StoreError> {
    fenced(pool, claim, upload_id, async |conn| {
        Ok(sql::worker_artifact_uploads::Commit {
            upload_id,
            attempt_id: claim.attempt_id,
            committed_status: UploadStatus::Committed.as_str(),
            uploaded_status: UploadStatus::Uploaded.as_str(),
        }
        .query_scalar::<Uuid>()
        .fetch_optional(conn)
        .await?)
    })
    .await
    .map(|written| written.map(|_: Uuid| ()))
}

/// Ends an open session of `claim`'s attempt as `failed`, saying why (what arrived is not
/// what the commit described). Not fenced: the session's own attempt reported it, and a
/// failed session only loses what nobody could commit. Whether it moved.
pub async fn fail(
    pool: &PgPool,
    claim: &LeaseClaim,
    upload_id: Uuid,
    why: &str,
) -> Result<bool, StoreError> {
    Ok(sql::worker_artifact_uploads::Fail {
        upload_id,
        attempt_id: claim.attempt_id,
        why,
        failed_status: UploadStatus::Failed.as_str(),
        open_statuses: UploadStatus::OPEN.map(UploadStatus::as_str),
    }
    .query_scalar::<Uuid>()
    .fetch_optional(pool)
    .await?
    .is_some())
}

/// A scan's artifacts (committed sessions), in commit order.
pub async fn of_scan(pool: &PgPool, scan_id: Uuid) -> Result<Vec<Upload>, StoreError> {
    Ok(sql::worker_artifact_uploads::OfScan {
        scan_id,
        committed_status: UploadStatus::Committed.as_str(),
    }
    .query_as::<Upload>()
    .fetch_all(pool)
    .await?)
}

/// How long after a commit the reaper leaves a committed session's chunks to ingestion, which
/// purges them right after its commit and records it ([`mark_removed`]); past it, they are
/// what a crash between the two left, and the reaper purges them ([`removable`]).
pub const COMMITTED_CHUNKS_GRACE: Duration = Duration::from_secs(60);

/// What a session left on the bus: its chunks (under its worker's upload subject) and, unless
/// it was committed, maybe an object.
#[derive(Debug, Clone, PartialEq, Eq, sqlx::FromRow)]
pub struct Removable {
    pub id: Uuid,
    pub worker_id: Option<Uuid>,
    pub object_key: String,
    pub status: String,
}

impl Removable {
    /// Whether the session was committed: its object is its artifact, and only its chunks are
    /// left over.
    pub fn is_artifact(&self) -> bool {
        UploadStatus::parse(&self.status) == Some(UploadStatus::Committed)
    }
}

/// At most `limit` sessions whose leftovers are still to be removed: those that expired or
/// failed (chunks and any object), oldest first, then committed ones whose chunks were not
/// recorded purged within [`COMMITTED_CHUNKS_GRACE`] of their commit (chunks only).
pub async fn removable(pool: &PgPool, limit: i64) -> Result<Vec<Removable>, StoreError> {
    Ok(sql::worker_artifact_uploads::Removable {
        limit,
        removable_statuses: [
            UploadStatus::Expired.as_str(),
            UploadStatus::Failed.as_str(),
        ],
        committed_status: UploadStatus::Committed.as_str(),
        committed_chunks_grace_seconds: seconds(COMMITTED_CHUNKS_GRACE),
    }
    .query_as::<Removable>()
    .fetch_all(pool)
    .await?)
}

/// Records that what these sessions left on the bus is gone: a committed session's chunks
/// (ingestion after its own purge, or the reaper), an ended one's chunks and object (the
/// reaper).
pub async fn mark_removed(pool: &PgPool, ids: &[Uuid]) -> Result<u64, StoreError> {
    Ok(
        sql::worker_artifact_uploads::MarkRemoved { upload_ids: ids }
            .query()
            .execute(pool)
            .await?
            .rows_affected(),
    )
}
