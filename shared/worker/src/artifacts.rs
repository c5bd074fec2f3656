//! Uploading a file a plugin produced as an artifact of its task (`docs/protocol/worker.md`,
//! "Artifacts"): prepare a session with ingestion, publish the chunks on the subject it names
//! (JetStream publishes, every PubAck awaited: ingestion receives them, stores those of the
//! open session and answers in the PubAck's form, or with a JetStream error saying why not),
//! commit with the size and sha256. The worker needs no storage credentials: it only
//! publishes on its own upload subjects.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::future::BoxFuture;
use messages::{ErrorCode, WorkerVerb, v1};
use uuid::Uuid;

use crate::PluginError;
use crate::context::{Context, RequestError};

/// Chunks published before their PubAcks are awaited.
const CHUNKS_IN_FLIGHT: usize = 16;
/// Times a prepare or commit is sent before the upload fails (each is idempotent).
const SENDS_MAX: u32 = 3;
/// A commit reads the file back and stores it: it waits at least this long for its answer.
const COMMIT_TIMEOUT_MIN: Duration = Duration::from_secs(30);

/// An artifact ingestion verified and kept.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadedArtifact {
    /// The artifact's id (its upload session's).
    pub id: Uuid,
    pub size_bytes: u64,
    /// Lowercase hex.
    pub sha256: String,
}

/// Uploads files for one lease. The worker gives one to each lease's [`crate::ResultSink`];
/// a plugin test can give its own (e.g. one that keeps the files in memory).
pub trait ArtifactUploader: Send + Sync {
    fn upload<'a>(
        &'a self,
        name: &'a str,
        content_type: &'a str,
        bytes: Bytes,
    ) -> BoxFuture<'a, Result<UploadedArtifact, PluginError>>;
}

/// The uploader of one lease, over the bus.
pub(crate) struct LeaseUploader {
    pub ctx: Arc<Context>,
    pub lease: v1::LeaseRef,
}

impl ArtifactUploader for LeaseUploader {
    fn upload<'a>(
        &'a self,
        name: &'a str,
        content_type: &'a str,
        bytes: Bytes,
    ) -> BoxFuture<'a, Result<UploadedArtifact, PluginError>> {
        Box::pin(self.send(name, content_type, bytes))
    }
}

/// Why an upload failed, as the plugin sees it: lost leases and cancels stop the task anyway;
/// everything else may work on another attempt.
fn upload_failed(error: &v1::Error) -> PluginError {
    let message = format!("artifact upload refused: {}: {}", error.code, error.message);
    match error.error_code() {
        Some(ErrorCode::InvalidField | ErrorCode::TooLarge) => {
            PluginError::permanent("artifact_refused", message)
        }
        _ => PluginError::retryable("artifact_upload_failed", message),
    }
}

impl LeaseUploader {
    async fn send(
        &self,
        name: &str,
        content_type: &str,
        bytes: Bytes,
    ) -> Result<UploadedArtifact, PluginError> {
        let upload_id = Uuid::new_v4();
        let prepared = self
            .request(
                v1::artifact_request::Step::Prepare(v1::PrepareUpload {
                    upload_id: upload_id.to_string(),
                    name: name.to_owned(),
                    content_type: content_type.to_owned(),
                }),
                self.ctx.config.request_timeout,
            )
            .await?;
        if bytes.len() as u64 > prepared.size_bytes_max {
            return Err(PluginError::permanent(
                "artifact_refused",
                format!(
                    "{name:?} is {} bytes, over the {} bytes an artifact may have",
                    bytes.len(),
                    prepared.size_bytes_max
                ),
            ));
        }
        let count = self.send_chunks(upload_id, name, &bytes, &prepared).await?;
        let sha256 = messages::sha256_hex(&bytes);
        let size_bytes = bytes.len() as u64;
        let committed = self
            .request(
                v1::artifact_request::Step::Commit(v1::CommitUpload {
                    upload_id: upload_id.to_string(),
                    size_bytes,
                    sha256: sha256.clone(),
                    chunks: count,
                }),
                self.ctx.config.request_timeout.max(COMMIT_TIMEOUT_MIN),
            )
            .await?;
        tracing::info!(task_id = %self.lease.task_id, %upload_id, size_bytes, "artifact uploaded");
        Ok(UploadedArtifact {
            id: upload_id,
            size_bytes: committed.size_bytes,
            sha256: committed.sha256,
        })
    }

    /// Publishes the file's chunks (of the prepared session's chunk size) on its chunk subject,
    /// [`CHUNKS_IN_FLIGHT`] at a time, each awaiting its PubAck. Returns how many were sent.
    async fn send_chunks(
        &self,
        upload_id: Uuid,
        name: &str,
        bytes: &Bytes,
        prepared: &v1::ArtifactReply,
    ) -> Result<u32, PluginError> {
        let chunk_size = (prepared.chunk_bytes_max as usize).max(1);
        let chunks: Vec<Bytes> = (0..bytes.len())
            .step_by(chunk_size)
            .map(|start| bytes.slice(start..(start + chunk_size).min(bytes.len())))
            .collect();
        let count = u32::try_from(chunks.len()).map_err(|_| {
            PluginError::permanent("artifact_refused", format!("{name:?} has too many chunks"))
        })?;
        for (group_index, group) in chunks.chunks(CHUNKS_IN_FLIGHT).enumerate() {
            let messages = group
                .iter()
                .enumerate()
                .map(|(offset, data)| {
                    let index = group_index * CHUNKS_IN_FLIGHT + offset;
                    let chunk = v1::ArtifactChunk {
                        upload_id: upload_id.to_string(),
                        index: index as u32,
                        data: data.to_vec(),
                    };
                    bus::OutgoingMessage {
                        subject: prepared.chunk_subject.clone(),
                        msg_id: format!("{upload_id}:{index}"),
                        headers: bus::async_nats::HeaderMap::new(),
                        payload: prost::Message::encode_to_vec(&chunk).into(),
                    }
                })
                .collect();
            for sent in self.ctx.bus.publish_durable_all(messages).await {
                sent.map_err(|error| {
                    PluginError::retryable(
                        "artifact_upload_failed",
                        format!("sending {name:?}: {}", telemetry::chain(&error)),
                    )
                })?;
            }
        }
        Ok(count)
    }

    /// Sends one step, again (it is idempotent) when no answer comes.
    async fn request(
        &self,
        step: v1::artifact_request::Step,
        timeout: Duration,
    ) -> Result<v1::ArtifactReply, PluginError> {
        let request = v1::ArtifactRequest {
            schema_version: messages::SCHEMA_VERSION,
            worker_id: self.ctx.worker_id.clone(),
            lease: Some(self.lease.clone()),
            step: Some(step),
        };
        let mut last = String::new();
        for _ in 0..SENDS_MAX {
            match self
                .ctx
                .request::<v1::ArtifactReply>(WorkerVerb::Artifact, &request, timeout)
                .await
            {
                Ok(v1::ArtifactReply {
                    error: Some(error), ..
                }) => return Err(upload_failed(&error)),
                Ok(reply) => return Ok(reply),
                Err(RequestError::Decode(error)) => {
                    return Err(PluginError::retryable(
                        "artifact_upload_failed",
                        format!("undecodable artifact reply: {error}"),
                    ));
                }
                Err(RequestError::Bus(error)) => last = telemetry::chain(&error).to_string(),
            }
        }
        Err(PluginError::retryable(
            "artifact_upload_failed",
            format!("ingestion did not answer the artifact request: {last}"),
        ))
    }
}
