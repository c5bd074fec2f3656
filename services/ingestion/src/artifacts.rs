//! Artifact upload sessions (issue 12, item 4): `ArtifactRequest` on
//! `<prefix>.v1.worker.<worker_id>.artifact` (request/reply, queue group `ingestion`).
//!
//! - **prepare** opens a session for the worker's live lease (fenced) and tells it where to
//!   publish the chunks (`<prefix>.v1.upload.<worker_id>.<upload_id>`, which ingestion serves:
//!   [`crate::uploads`] stores the chunks of an open session on the uploads stream).
//! - **commit** reads those chunks back once without keeping them (`bus::Bus::index_upload`)
//!   and checks the chunk count and size the worker names, records the session `uploaded`
//!   (fenced), streams the file chunk by chunk into the artifact store
//!   (`bus::Bus::upload_pieces`, `ArtifactStore::put_stream`), checking its sha256 as it
//!   passes, records it `committed` (fenced), and purges the chunks, recording that it did
//!   (the reaper purges them when ingestion stopped before). A mismatch fails the session
//!   (`checksum_mismatch`), and an object stored before the digest was known is removed. A
//!   commit resent after any of these steps finishes the rest; one resent after the commit
//!   answers the committed session again. Ingestion holds a few chunks of a file at a time,
//!   never the file (`bus::artifacts::CHUNKS_FETCHED_AT_ONCE`; an S3 store buffers a few parts).
//!
//! A worker never gets storage credentials: the store is written here, after the checks.

use bus::Bus;
use bus::artifacts::{ArtifactStore, CHUNK_BYTES_MAX, UploadMismatch};
use messages::validate::{invalid, malformed, schema_version, worker_id};
use messages::{ErrorCode, v1};
use prost::Message as _;
use runtime::ArtifactLimits;
use store::artifacts::{Prepare, Upload, Verified};
use store::states::UploadStatus;
use store::{LeaseClaim, PgPool};
use uuid::Uuid;

/// Longest artifact name, in bytes.
pub const NAME_BYTES_MAX: usize = 255;
/// Longest media type, in bytes.
pub const CONTENT_TYPE_BYTES_MAX: usize = 127;
/// The media type of an upload that names none.
pub const CONTENT_TYPE_DEFAULT: &str = "application/octet-stream";

/// A request whose fields have their documented form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub claim: LeaseClaim,
    pub step: Step,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    Prepare {
        upload_id: Uuid,
        name: String,
        content_type: String,
    },
    Commit {
        upload_id: Uuid,
        size_bytes: u64,
        sha256: String,
        chunks: u32,
    },
}

fn upload_id(field: &str, text: &str) -> Result<Uuid, v1::Error> {
    Uuid::parse_str(text).map_err(|_| invalid(format!("{field} {text:?} is not a UUID")))
}

/// Decodes and validates a request sent by the worker of `subject_worker` (the subject's
/// worker token); the error is the answer. Names are redacted as every worker text is.
pub fn parse(
    subject_worker: Option<&str>,
    bytes: &[u8],
    limits: &ArtifactLimits,
) -> Result<Request, v1::Error> {
    use v1::artifact_request::Step as Wire;
    let request =
        v1::ArtifactRequest::decode(bytes).map_err(|error| malformed("ArtifactRequest", error))?;
    schema_version(request.schema_version)?;
    let worker = worker_id(subject_worker, &request.worker_id)?;
    let claim = LeaseClaim::from_wire(worker, request.lease.as_ref())?;
    let step = match request.step {
        None => return Err(invalid("step is required: prepare or commit")),
        Some(Wire::Prepare(prepare)) => {
            let name = &prepare.name;
            if name.is_empty()
                || name.len() > NAME_BYTES_MAX
                || name
                    .chars()
                    .any(|c| c.is_control() || c == '/' || c == '\\')
                || name == "."
                || name == ".."
            {
                return Err(invalid(format!(
                    "prepare.name must be a file name of 1..={NAME_BYTES_MAX} bytes without '/', '\\' or control characters"
                )));
            }
            let content_type = if prepare.content_type.is_empty() {
                CONTENT_TYPE_DEFAULT.to_owned()
            } else {
                prepare.content_type.clone()
            };
            let media_type = content_type.len() <= CONTENT_TYPE_BYTES_MAX
                && content_type.contains('/')
                && content_type
                    .bytes()
                    .all(|b| b.is_ascii_graphic() || b == b' ');
            if !media_type {
                return Err(invalid(format!(
                    "prepare.content_type must be a media type (type/subtype) of at most {CONTENT_TYPE_BYTES_MAX} printable ASCII bytes"
                )));
            }
            Step::Prepare {
                upload_id: upload_id("prepare.upload_id", &prepare.upload_id)?,
                name: store::evidence::redact(name),
                content_type: store::evidence::redact(&content_type),
            }
        }
        Some(Wire::Commit(commit)) => {
            if commit.size_bytes > limits.bytes_max {
                return Err(v1::Error::new(
                    ErrorCode::TooLarge,
                    format!(
                        "commit.size_bytes {} is over the {} bytes an artifact may have (PALISADE_ARTIFACT_BYTES_MAX)",
                        commit.size_bytes, limits.bytes_max
                    ),
                ));
            }
            let hex = commit.sha256.len() == 64
                && commit
                    .sha256
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            if !hex {
                return Err(invalid("commit.sha256 must be 64 lowercase hex digits"));
            }
            Step::Commit {
                upload_id: upload_id("commit.upload_id", &commit.upload_id)?,
                size_bytes: commit.size_bytes,
                sha256: commit.sha256,
                chunks: commit.chunks,
            }
        }
    };
    Ok(Request { claim, step })
}

/// What ingestion needs to answer artifact requests.
pub struct Artifacts<S> {
    pub pool: PgPool,
    pub bus: Bus,
    pub store: S,
    pub limits: ArtifactLimits,
}

impl<S: ArtifactStore> Artifacts<S> {
    /// The answer to one request on `subject`.
    pub async fn reply(&self, subject: &str, payload: &[u8]) -> v1::ArtifactReply {
        let subject_worker = self.bus.subjects().worker_id_of(subject);
        let answer = match parse(subject_worker, payload, &self.limits) {
            Ok(request) => self.decide(&request).await,
            Err(error) => Err(error),
        };
        answer.unwrap_or_else(|error| {
            if error.error_code() != Some(ErrorCode::LeaseLost) {
                tracing::info!(code = %error.code, message = %error.message, "artifact request refused");
            }
            bus::metrics::record_refusal(REQUEST_SERVER, &error.code);
            v1::ArtifactReply {
                error: Some(error),
                ..Default::default()
            }
        })
    }

    async fn decide(&self, request: &Request) -> Result<v1::ArtifactReply, v1::Error> {
        let internal = |error: store::StoreError| {
            runtime::internal_error("the artifact request", &telemetry::chain(&error), "retry")
        };
        match &request.step {
            Step::Prepare {
                upload_id,
                name,
                content_type,
            } => {
                let prepare = Prepare {
                    claim: &request.claim,
                    upload_id: *upload_id,
                    name,
                    content_type,
                    ttl: self.limits.upload_ttl,
                };
                let upload = store::artifacts::prepare(&self.pool, &prepare)
                    .await
                    .map_err(internal)??;
                Ok(self.prepared(&request.claim, &upload))
            }
            Step::Commit {
                upload_id,
                size_bytes,
                sha256,
                chunks,
            } => {
                let upload = store::artifacts::of_claim(&self.pool, &request.claim, *upload_id)
                    .await
                    .map_err(internal)??;
                self.commit(&request.claim, upload, *size_bytes, sha256, *chunks)
                    .await
            }
        }
    }

    fn prepared(&self, claim: &LeaseClaim, upload: &Upload) -> v1::ArtifactReply {
        let expires_in = (upload.expires_at - chrono::Utc::now())
            .num_milliseconds()
            .clamp(0, i64::from(u32::MAX));
        v1::ArtifactReply {
            upload_id: upload.id.to_string(),
            status: upload.status.clone(),
            chunk_subject: self
                .bus
                .subjects()
                .upload(&claim.worker_id.to_string(), &upload.id.to_string()),
            chunk_bytes_max: CHUNK_BYTES_MAX,
            size_bytes_max: self.limits.bytes_max,
            expires_in_ms: u32::try_from(expires_in).unwrap_or(u32::MAX),
            ..Default::default()
        }
    }

    async fn commit(
        &self,
        claim: &LeaseClaim,
        upload: Upload,
        size_bytes: u64,
        sha256: &str,
        chunks: u32,
    ) -> Result<v1::ArtifactReply, v1::Error> {
        // The answer to a commit, whichever request of it made the session committed.
        let committed = |upload_id: Uuid| v1::ArtifactReply {
            upload_id: upload_id.to_string(),
            status: UploadStatus::Committed.as_str().to_owned(),
            size_bytes,
            sha256: sha256.to_owned(),
            ..Default::default()
        };
        let internal = |what: &str, cause: &dyn std::fmt::Display| {
            runtime::internal_error(what, cause, "commit again")
        };
        let status = upload
            .status()
            .map_err(|error| internal("the commit", &error))?;
        match status {
            UploadStatus::Committed => {
                if upload.sha256 != sha256 || upload.size_bytes != Some(size_bytes as i64) {
                    return Err(v1::Error::new(
                        ErrorCode::IdempotencyConflict,
                        format!(
                            "upload {} was committed with another size or digest",
                            upload.id
                        ),
                    ));
                }
                return Ok(committed(upload.id));
            }
            UploadStatus::Expired | UploadStatus::Failed => {
                return Err(v1::Error::new(
                    ErrorCode::NotFound,
                    format!(
                        "upload session {} {}{}: prepare a new upload",
                        upload.id,
                        upload.status,
                        if upload.error.is_empty() {
                            String::new()
                        } else {
                            format!(" ({})", upload.error)
                        }
                    ),
                ));
            }
            UploadStatus::Prepared | UploadStatus::Uploaded => {}
        }
        let verified = Verified {
            size_bytes,
            sha256,
            chunks,
        };
        self.stream_into_store(claim, &upload, &verified).await?;
        store::artifacts::commit(&self.pool, claim, upload.id)
            .await
            .map_err(|error| internal("committing the artifact", &error))??;
        self.purge_chunks(&claim.worker_id.to_string(), upload.id)
            .await;
        tracing::info!(upload_id = %upload.id, task_id = %claim.task_id, size_bytes, "artifact committed");
        Ok(committed(upload.id))
    }
}

impl<S: ArtifactStore> Artifacts<S> {
    /// Streams an open session's file into the artifact store, never holding the whole of it:
    /// its chunks are indexed and checked against the commit's chunk count and size, the
    /// session is recorded `uploaded` (fenced; no chunk is stored for it after that), and the
    /// file is put chunk by chunk in index order, its sha256 checked as it passes. A mismatch
    /// fails the session, and an object already stored is removed: the answer is
    /// `checksum_mismatch`.
    async fn stream_into_store(
        &self,
        claim: &LeaseClaim,
        upload: &Upload,
        verified: &Verified<'_>,
    ) -> Result<(), v1::Error> {
        let internal = |what: &str, cause: &dyn std::fmt::Display| {
            runtime::internal_error(what, cause, "commit again")
        };
        let worker = claim.worker_id.to_string();
        let id = upload.id.to_string();
        let index = self
            .bus
            .index_upload(&worker, &id, self.limits.bytes_max)
            .await
            .map_err(|error| internal("reading the upload", &error))?;
        let index = match index.and_then(|index| {
            index
                .check(verified.chunks, verified.size_bytes)
                .map(|()| index)
        }) {
            Ok(index) => index,
            Err(mismatch) => return Err(self.refuse(claim, upload.id, &mismatch).await),
        };
        store::artifacts::mark_uploaded(&self.pool, claim, upload.id, verified)
            .await
            .map_err(|error| internal("recording the upload", &error))??;
        let mut pieces = self
            .bus
            .upload_pieces(index)
            .await
            .map_err(|error| internal("reading the upload", &error))?;
        self.store
            .put_stream(&upload.object_key, &mut pieces)
            .await
            .map_err(|error| internal("storing the artifact", &error))?;
        if let Err(mismatch) = pieces.check(verified.size_bytes, verified.sha256) {
            let refusal = self.refuse(claim, upload.id, &mismatch).await;
            // Not the file the worker described: not kept. Should this fail, the reaper
            // removes it with the failed session's chunks.
            if let Err(error) = self.store.delete(&upload.object_key).await {
                tracing::warn!(upload_id = %id, error = %telemetry::chain(&error), "mismatched upload's object not removed; the reaper removes it");
            }
            return Err(refusal);
        }
        Ok(())
    }

    /// Fails the session (what arrived is not what the commit described); the answer to the
    /// commit.
    async fn refuse(
        &self,
        claim: &LeaseClaim,
        upload_id: Uuid,
        mismatch: &UploadMismatch,
    ) -> v1::Error {
        let why = mismatch.to_string();
        if let Err(error) = store::artifacts::fail(&self.pool, claim, upload_id, &why).await {
            return runtime::internal_error("failing the upload", &error, "commit again");
        }
        v1::Error::new(
            ErrorCode::ChecksumMismatch,
            format!("upload {upload_id} failed: {why}; prepare a new upload and send it again"),
        )
    }

    /// Purges a committed session's chunks and records it. Best effort: chunks a failure or a
    /// crash leaves here are purged by the reaper once `store::artifacts::COMMITTED_CHUNKS_GRACE`
    /// has passed since the commit.
    async fn purge_chunks(&self, worker: &str, upload_id: Uuid) {
        let id = upload_id.to_string();
        if let Err(error) = self.bus.purge_upload(worker, &id).await {
            tracing::warn!(upload_id = %id, error = %telemetry::chain(&error), "committed upload's chunks not purged; the reaper purges them");
            return;
        }
        if let Err(error) = store::artifacts::mark_removed(&self.pool, &[upload_id]).await {
            tracing::warn!(upload_id = %id, error = %telemetry::chain(&error), "committed upload's chunks purged but not recorded; the reaper purges them again");
        }
    }
}

/// The artifact request server's name in `palisade_requests_total` and refusals.
pub const REQUEST_SERVER: &str = "ingestion.artifact";

#[cfg(test)]
mod tests {
    use super::*;
    use crate::parse::tests::lease;

    fn request(worker: Uuid, step: v1::artifact_request::Step) -> Vec<u8> {
        v1::ArtifactRequest {
            schema_version: messages::SCHEMA_VERSION,
            worker_id: worker.to_string(),
            lease: Some(lease()),
            step: Some(step),
        }
        .encode_to_vec()
    }

    fn prepare(name: &str, content_type: &str) -> v1::artifact_request::Step {
        v1::artifact_request::Step::Prepare(v1::PrepareUpload {
            upload_id: Uuid::now_v7().to_string(),
            name: name.into(),
            content_type: content_type.into(),
        })
    }

    fn code(result: Result<Request, v1::Error>) -> String {
        result.expect_err("refused").code
    }

    #[test]
    fn prepare_and_commit_fields_have_their_documented_form() {
        let worker = Uuid::now_v7();
        let subject_worker = worker.to_string();
        let limits = ArtifactLimits::default();
        let parse = |bytes: &[u8]| parse(Some(subject_worker.as_str()), bytes, &limits);
        let parsed = parse(&request(worker, prepare("sbom.json", ""))).unwrap();
        assert!(matches!(
            parsed.step,
            Step::Prepare { ref content_type, .. } if content_type == CONTENT_TYPE_DEFAULT
        ));
        for name in ["", "a/b", "a\\b", "..", "a\nb", &"x".repeat(256)] {
            assert_eq!(
                code(parse(&request(worker, prepare(name, "")))),
                "invalid_field",
                "{name:?}"
            );
        }
        for content_type in ["json", "a/b\n", &format!("a/{}", "b".repeat(200))] {
            assert_eq!(
                code(parse(&request(worker, prepare("f", content_type)))),
                "invalid_field",
                "{content_type:?}"
            );
        }
        let commit = |size_bytes: u64, sha256: &str| {
            request(
                worker,
                v1::artifact_request::Step::Commit(v1::CommitUpload {
                    upload_id: Uuid::now_v7().to_string(),
                    size_bytes,
                    sha256: sha256.into(),
                    chunks: 1,
                }),
            )
        };
        let digest = messages::sha256_hex(b"x");
        assert!(parse(&commit(1, &digest)).is_ok());
        assert_eq!(
            code(parse(&commit(1, &digest.to_uppercase()))),
            "invalid_field"
        );
        assert_eq!(
            code(parse(&commit(limits.bytes_max + 1, &digest))),
            "too_large"
        );
        // Another worker's subject, and garbage.
        assert_eq!(
            code(super::parse(Some("other"), &commit(1, &digest), &limits)),
            "invalid_field"
        );
        assert_eq!(code(parse(b"\xff\xff")), "malformed_message");
    }

    #[test]
    fn names_are_redacted_before_anything_is_stored() {
        let worker = Uuid::now_v7();
        let secret = "report-ghp_aBcDeFgHiJkLmNoPqRsTuVwXyZ0123456789.json";
        let parsed = super::parse(
            Some(&worker.to_string()),
            &request(worker, prepare(secret, "")),
            &ArtifactLimits::default(),
        )
        .unwrap();
        let Step::Prepare { name, .. } = parsed.step else {
            panic!("a prepare")
        };
        assert!(!name.contains("ghp_aBcDeF"), "{name}");
    }
}
