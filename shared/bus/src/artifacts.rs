//! Artifacts on the bus: the chunks a worker sends in an upload session (the uploads stream,
//! `<PREFIX>_UPLOADS`), read back whole when it commits, and the store that keeps a committed
//! artifact ([`ArtifactStore`]; the JetStream Object Store bucket `<PREFIX>_ARTIFACTS` here).
//!
//! A worker never touches the store nor the stream: it may only publish on its own upload
//! subjects (`<prefix>.v1.upload.<worker_id>.<upload_id>`), which ingestion serves. Ingestion
//! stores a chunk of an open session of that worker on the stream's own subject
//! (`<prefix>.v1.uploaded.<worker_id>.<upload_id>`, [`messages::Subjects::upload_stored`])
//! and, after checking size and digest at commit, writes the file into the store.

use std::collections::BTreeMap;

use async_nats::jetstream::{consumer, object_store, stream};
use bytes::Bytes;
use futures::StreamExt as _;
use messages::sha256_hex;
use messages::v1;
use prost::Message as _;

use crate::{Bus, BusError, StreamSettings};

/// Largest chunk a worker may send: well under NATS's default 1 MiB payload.
pub const CHUNK_BYTES_MAX: u32 = 256 * 1024;

/// The largest file a worker may commit unless `PALISADE_ARTIFACT_BYTES_MAX` says otherwise.
pub const ARTIFACT_BYTES_MAX_DEFAULT: u64 = 64 * 1024 * 1024;

/// The most chunks one upload session may have: a file of `bytes_max` bytes in chunks of
/// [`CHUNK_BYTES_MAX`].
pub fn chunks_max(bytes_max: u64) -> u64 {
    bytes_max.div_ceil(u64::from(CHUNK_BYTES_MAX))
}

/// How long the uploads stream keeps a chunk whatever happens to its session: a safety net
/// only; the reaper removes the chunks of every session that expired or failed, and
/// ingestion those of a committed one (the reaper, when ingestion stopped before).
pub const UPLOAD_MAX_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// Why what was sent in an upload session is not the file the worker described.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UploadMismatch {
    #[error("the upload is larger than the {max} bytes an artifact may have")]
    TooLarge { max: u64 },
    #[error("chunk {index} was sent twice with different contents")]
    ChunkConflict { index: u32 },
    #[error("chunk {index} is {len} bytes, over the {max}-byte chunk limit")]
    ChunkTooLarge { index: u32, len: usize, max: u32 },
    #[error("a message on the upload subject is not an ArtifactChunk of this upload")]
    NotAChunk,
    #[error("chunk {missing} never arrived, though a later one did")]
    Gap { missing: u32 },
    #[error("{received} chunks arrived, the commit names {claimed} (indexes 0..{claimed})")]
    Chunks { claimed: u32, received: u32 },
    #[error("{actual} bytes arrived, the commit names {claimed}")]
    Size { claimed: u64, actual: u64 },
    #[error("the bytes that arrived have sha256 {actual}, the commit names {claimed}")]
    Digest { claimed: String, actual: String },
}

/// What was sent in one upload session, in chunk order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadedFile {
    pub bytes: Bytes,
    /// How many distinct chunks it was sent in.
    pub chunks: u32,
    /// Lowercase hex sha256 of `bytes`.
    pub sha256: String,
}

impl UploadedFile {
    /// Checks the file against what the commit claims.
    pub fn check(&self, chunks: u32, size_bytes: u64, sha256: &str) -> Result<(), UploadMismatch> {
        if self.chunks != chunks {
            return Err(UploadMismatch::Chunks {
                claimed: chunks,
                received: self.chunks,
            });
        }
        let actual = self.bytes.len() as u64;
        if actual != size_bytes {
            return Err(UploadMismatch::Size {
                claimed: size_bytes,
                actual,
            });
        }
        if !self.sha256.eq_ignore_ascii_case(sha256) {
            return Err(UploadMismatch::Digest {
                claimed: sha256.to_owned(),
                actual: self.sha256.clone(),
            });
        }
        Ok(())
    }
}

/// Where committed artifacts are kept, by key. The JetStream Object Store is the one palisade
/// ships ([`ObjectStoreArtifacts`]); another store (S3-compatible) implements the same.
pub trait ArtifactStore: Send + Sync {
    /// Stores `bytes` under `key`, replacing what was there (a commit retried after a crash
    /// writes the same bytes again).
    fn put(&self, key: &str, bytes: Bytes) -> impl Future<Output = Result<(), BusError>> + Send;
    /// The bytes under `key`, or `None` when nothing is stored there.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Bytes>, BusError>> + Send;
    /// Removes what is under `key`; removing nothing is not an error.
    fn delete(&self, key: &str) -> impl Future<Output = Result<(), BusError>> + Send;
}

/// The JetStream Object Store bucket `<PREFIX>_ARTIFACTS`.
#[derive(Clone)]
pub struct ObjectStoreArtifacts {
    store: object_store::ObjectStore,
    bucket: String,
}

impl std::fmt::Debug for ObjectStoreArtifacts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStoreArtifacts")
            .field("bucket", &self.bucket)
            .finish()
    }
}

impl ArtifactStore for ObjectStoreArtifacts {
    async fn put(&self, key: &str, bytes: Bytes) -> Result<(), BusError> {
        let mut reader = std::io::Cursor::new(bytes);
        self.store
            .put(key, &mut reader)
            .await
            .map(|_| ())
            .map_err(|error| self.error("put", key, error))
    }

    async fn get(&self, key: &str) -> Result<Option<Bytes>, BusError> {
        use tokio::io::AsyncReadExt as _;
        let mut object = match self.store.get(key).await {
            Ok(object) => object,
            Err(error) if error.kind() == object_store::GetErrorKind::NotFound => return Ok(None),
            Err(error) => return Err(self.error("get", key, error)),
        };
        let mut bytes = Vec::new();
        object
            .read_to_end(&mut bytes)
            .await
            .map_err(|error| self.error("read", key, error))?;
        Ok(Some(bytes.into()))
    }

    async fn delete(&self, key: &str) -> Result<(), BusError> {
        match self.store.delete(key).await {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == object_store::DeleteErrorKind::NotFound => Ok(()),
            Err(error) => Err(self.error("delete", key, error)),
        }
    }
}

impl ObjectStoreArtifacts {
    fn error(&self, action: &str, key: &str, error: impl std::fmt::Display) -> BusError {
        BusError::Artifacts {
            message: format!(
                "{action} of {key:?} in object store {} failed: {error}",
                self.bucket
            ),
        }
    }
}

impl Bus {
    /// Creates the uploads stream and the artifacts bucket, or updates the stream to this
    /// build's configuration. Part of [`Bus::provision`].
    pub(crate) async fn provision_artifacts(
        &self,
        settings: &StreamSettings,
    ) -> Result<(), BusError> {
        let subjects = &self.subjects;
        let bucket = subjects.artifacts_bucket();
        if self.jetstream.get_object_store(&bucket).await.is_err() {
            self.jetstream
                .create_object_store(object_store::Config {
                    bucket: bucket.clone(),
                    description: Some("palisade: committed artifacts".into()),
                    storage: stream::StorageType::File,
                    num_replicas: settings.replicas,
                    ..Default::default()
                })
                .await
                .map_err(|error| BusError::Provision {
                    stream: subjects.artifacts_stream(),
                    message: error.to_string(),
                })?;
        }
        Ok(())
    }

    /// The store of committed artifacts.
    pub async fn artifacts(&self) -> Result<ObjectStoreArtifacts, BusError> {
        let bucket = self.subjects.artifacts_bucket();
        let store = self
            .jetstream
            .get_object_store(&bucket)
            .await
            .map_err(|error| BusError::Artifacts {
                message: format!(
                    "object store {bucket} is not available: {error}; a palisade service creates it at start-up"
                ),
            })?;
        Ok(ObjectStoreArtifacts { store, bucket })
    }

    /// Everything stored for one upload session (on its stored subject,
    /// [`messages::Subjects::upload_stored`]), assembled in chunk order: duplicates of a chunk
    /// (a resend whose PubAck was lost) are kept once, a chunk sent twice with other contents
    /// or a gap is a mismatch. Stops reading past `size_max` bytes.
    pub async fn read_upload(
        &self,
        worker_id: &str,
        upload_id: &str,
        size_max: u64,
    ) -> Result<Result<UploadedFile, UploadMismatch>, BusError> {
        let subject = self.subjects.upload_stored(worker_id, upload_id);
        let stream_name = self.subjects.uploads_stream();
        let failed = |message: String| BusError::Artifacts {
            message: format!("reading upload {upload_id} from {stream_name}: {message}"),
        };
        let stream = self.uploads().await.map_err(failed)?;
        let last = match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => message.sequence,
            Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                return Ok(Ok(UploadedFile {
                    bytes: Bytes::new(),
                    chunks: 0,
                    sha256: sha256_hex(&[]),
                }));
            }
            Err(error) => return Err(failed(error.to_string())),
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: subject.clone(),
                deliver_policy: consumer::DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|error| failed(error.to_string()))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|error| failed(error.to_string()))?;
        let mut chunks: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
        let mut total: u64 = 0;
        while let Some(message) = messages.next().await {
            let message = message.map_err(|error| failed(error.to_string()))?;
            let sequence = message
                .info()
                .map_err(|error| failed(error.to_string()))?
                .stream_sequence;
            let Ok(chunk) = v1::ArtifactChunk::decode(message.payload.clone()) else {
                return Ok(Err(UploadMismatch::NotAChunk));
            };
            if chunk.upload_id != upload_id {
                return Ok(Err(UploadMismatch::NotAChunk));
            }
            if chunk.data.len() > CHUNK_BYTES_MAX as usize {
                return Ok(Err(UploadMismatch::ChunkTooLarge {
                    index: chunk.index,
                    len: chunk.data.len(),
                    max: CHUNK_BYTES_MAX,
                }));
            }
            match chunks.get(&chunk.index) {
                Some(kept) if *kept != chunk.data => {
                    return Ok(Err(UploadMismatch::ChunkConflict { index: chunk.index }));
                }
                Some(_) => {}
                None => {
                    total += chunk.data.len() as u64;
                    if total > size_max {
                        return Ok(Err(UploadMismatch::TooLarge { max: size_max }));
                    }
                    chunks.insert(chunk.index, chunk.data);
                }
            }
            if sequence >= last {
                break;
            }
        }
        // Indexes are dense from 0: the first index that is not its position names a gap.
        let received = u32::try_from(chunks.len()).unwrap_or(u32::MAX);
        if let Some((missing, _)) = chunks
            .keys()
            .zip(0_u32..)
            .find(|(index, position)| **index != *position)
            .map(|(_, position)| (position, ()))
        {
            return Ok(Err(UploadMismatch::Gap { missing }));
        }
        let mut bytes = Vec::with_capacity(usize::try_from(total).unwrap_or_default());
        for data in chunks.into_values() {
            bytes.extend_from_slice(&data);
        }
        let sha256 = sha256_hex(&bytes);
        Ok(Ok(UploadedFile {
            bytes: bytes.into(),
            chunks: received,
            sha256,
        }))
    }

    /// The uploads stream's handle, without the round trip that asks for its info: a commit or
    /// a removal is one operation on it.
    async fn uploads(&self) -> Result<stream::Stream<()>, String> {
        self.jetstream
            .get_stream_no_info(self.subjects.uploads_stream())
            .await
            .map_err(|error| error.to_string())
    }

    /// Removes everything stored for one upload session (after its commit, or once it expired
    /// or failed). Removing nothing is not an error. Chunks an older build let the stream
    /// capture on the workers' own upload subjects are not looked at: they age out
    /// ([`UPLOAD_MAX_AGE`]).
    pub async fn purge_upload(&self, worker_id: &str, upload_id: &str) -> Result<(), BusError> {
        let subject = self.subjects.upload_stored(worker_id, upload_id);
        let stream_name = self.subjects.uploads_stream();
        let failed = |message: String| BusError::Artifacts {
            message: format!("purging upload {upload_id} from {stream_name}: {message}"),
        };
        let stream = self.uploads().await.map_err(failed)?;
        stream
            .purge()
            .filter(subject)
            .await
            .map(|_| ())
            .map_err(|error| failed(error.to_string()))
    }
}
