//! Artifacts on the bus: the chunks a worker sends in an upload session (the uploads stream,
//! `<PREFIX>_UPLOADS`), streamed back in order when it commits, and the store that keeps a
//! committed artifact ([`ArtifactStore`]; the JetStream Object Store bucket `<PREFIX>_ARTIFACTS`
//! here).
//!
//! A worker never touches the store nor the stream: it may only publish on its own upload
//! subjects (`<prefix>.v1.upload.<worker_id>.<upload_id>`), which ingestion serves. Ingestion
//! stores a chunk of an open session of that worker on the stream's own subject
//! (`<prefix>.v1.uploaded.<worker_id>.<upload_id>`, [`messages::Subjects::upload_stored`])
//! and, at commit, streams the file into the store without holding it: [`Bus::index_upload`]
//! reads the session's chunks once, as they lie on the stream (any order, resends included),
//! keeping of each only its stream sequence, length and digest, and checks them; then
//! [`Bus::upload_pieces`] fetches them again by sequence in index order as the store asks for
//! them, hashing the file as it passes. Either pass asks for [`CHUNKS_FETCHED_AT_ONCE`] chunks
//! at a time.

use std::collections::BTreeMap;
use std::pin::Pin;
use std::task::{Context, Poll};

use async_nats::jetstream::{consumer, object_store, stream};
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::{Stream, StreamExt as _};
use messages::v1;
use prost::Message as _;
use sha2::{Digest as _, Sha256};

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

/// Chunks a commit asks the uploads stream for at once: the indexing pass's consumer is sent
/// this many at a time, the streaming pass has this many gets in flight. So ingestion holds a
/// chunk or two of a file being committed, whatever its size. One, because more made a commit
/// no faster (a 128 MiB file in 1.4 s with 4, 1.6 s with 1, debug build) while the peak
/// resident set of the ingestion process grew by 25 to 50 MiB during the commit instead of 2
/// to 8 (`tests/tests/system/artifacts.rs`, `a_commit_holds_…`).
pub const CHUNKS_FETCHED_AT_ONCE: usize = 1;

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

/// One upload session's chunks as the uploads stream holds them, in index order, without
/// their data: where the first copy of each lies. Made by [`Bus::index_upload`], which checked
/// that the indexes are dense from 0, that copies of a chunk agree and that the whole is
/// within the size limit; streamed by [`Bus::upload_pieces`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadIndex {
    upload_id: String,
    /// The stream sequence of each chunk, by index.
    sequences: Vec<u64>,
    size_bytes: u64,
}

impl UploadIndex {
    /// How many distinct chunks arrived.
    pub fn chunks(&self) -> u32 {
        u32::try_from(self.sequences.len()).unwrap_or(u32::MAX)
    }

    /// The file's size: the distinct chunks' lengths summed.
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// Checks the chunk count and size against what the commit claims. The sha256 is checked
    /// as the file streams ([`UploadPieces::check`]).
    pub fn check(&self, chunks: u32, size_bytes: u64) -> Result<(), UploadMismatch> {
        if self.chunks() != chunks {
            return Err(UploadMismatch::Chunks {
                claimed: chunks,
                received: self.chunks(),
            });
        }
        if self.size_bytes != size_bytes {
            return Err(UploadMismatch::Size {
                claimed: size_bytes,
                actual: self.size_bytes,
            });
        }
        Ok(())
    }
}

/// An indexed upload session's file, chunk by chunk in index order: each fetched from the
/// uploads stream by its sequence when the store asks for it ([`CHUNKS_FETCHED_AT_ONCE`] at a
/// time), and hashed as it passes. Give it to [`ArtifactStore::put_stream`], then
/// [`UploadPieces::check`] what passed.
pub struct UploadPieces {
    pieces: BoxStream<'static, Result<Bytes, BusError>>,
    sha256: Sha256,
    size_bytes: u64,
    ended: bool,
}

impl std::fmt::Debug for UploadPieces {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UploadPieces")
            .field("size_bytes", &self.size_bytes)
            .field("ended", &self.ended)
            .finish()
    }
}

impl Stream for UploadPieces {
    type Item = Result<Bytes, BusError>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let next = std::task::ready!(this.pieces.poll_next_unpin(cx));
        match &next {
            Some(Ok(piece)) => {
                this.sha256.update(piece);
                this.size_bytes += piece.len() as u64;
            }
            Some(Err(_)) => {}
            None => this.ended = true,
        }
        Poll::Ready(next)
    }
}

impl UploadPieces {
    /// Checks the file that passed against the size and sha256 the commit claims. Call it
    /// after the store read the whole file.
    pub fn check(&self, size_bytes: u64, sha256: &str) -> Result<(), UploadMismatch> {
        assert!(
            self.ended,
            "an artifact store returned before reading the whole file"
        );
        if self.size_bytes != size_bytes {
            return Err(UploadMismatch::Size {
                claimed: size_bytes,
                actual: self.size_bytes,
            });
        }
        let actual = hex::encode(self.sha256.clone().finalize());
        if !actual.eq_ignore_ascii_case(sha256) {
            return Err(UploadMismatch::Digest {
                claimed: sha256.to_owned(),
                actual,
            });
        }
        Ok(())
    }
}

/// The chunks of one upload as its first pass reads them (pure: no I/O).
struct ChunkIndex {
    /// Per index: (stream sequence, length, sha256) of its first copy.
    chunks: BTreeMap<u32, (u64, usize, [u8; 32])>,
    /// Bytes of the distinct chunks so far.
    total: u64,
    size_max: u64,
}

impl ChunkIndex {
    fn new(size_max: u64) -> Self {
        Self {
            chunks: BTreeMap::new(),
            total: 0,
            size_max,
        }
    }

    /// Keeps a chunk read at `sequence`, once: a copy with the same contents is skipped, one
    /// with other contents is a conflict, and the distinct chunks stay within `size_max`.
    fn add(&mut self, sequence: u64, chunk: &v1::ArtifactChunk) -> Result<(), UploadMismatch> {
        let digest: [u8; 32] = Sha256::digest(&chunk.data).into();
        match self.chunks.get(&chunk.index) {
            Some((_, len, kept)) if (*len, kept) != (chunk.data.len(), &digest) => {
                Err(UploadMismatch::ChunkConflict { index: chunk.index })
            }
            Some(_) => Ok(()),
            None => {
                self.total += chunk.data.len() as u64;
                if self.total > self.size_max {
                    return Err(UploadMismatch::TooLarge { max: self.size_max });
                }
                self.chunks
                    .insert(chunk.index, (sequence, chunk.data.len(), digest));
                Ok(())
            }
        }
    }

    /// The index of the upload, unless a chunk is missing below the highest one.
    fn finish(self, upload_id: &str) -> Result<UploadIndex, UploadMismatch> {
        // Indexes are dense from 0: the first index that is not its position names a gap.
        if let Some(missing) = self
            .chunks
            .keys()
            .zip(0_u32..)
            .find(|(index, position)| **index != *position)
            .map(|(_, position)| position)
        {
            return Err(UploadMismatch::Gap { missing });
        }
        Ok(UploadIndex {
            upload_id: upload_id.to_owned(),
            sequences: self
                .chunks
                .into_values()
                .map(|(sequence, _, _)| sequence)
                .collect(),
            size_bytes: self.total,
        })
    }
}

/// Decodes a message of upload `upload_id`'s stored subject: a chunk of that upload within
/// the chunk limit.
fn chunk_of(payload: Bytes, upload_id: &str) -> Result<v1::ArtifactChunk, UploadMismatch> {
    let chunk = v1::ArtifactChunk::decode(payload).map_err(|_| UploadMismatch::NotAChunk)?;
    if chunk.upload_id != upload_id {
        return Err(UploadMismatch::NotAChunk);
    }
    if chunk.data.len() > CHUNK_BYTES_MAX as usize {
        return Err(UploadMismatch::ChunkTooLarge {
            index: chunk.index,
            len: chunk.data.len(),
            max: CHUNK_BYTES_MAX,
        });
    }
    Ok(chunk)
}

/// Where committed artifacts are kept, by key. The JetStream Object Store is the one palisade
/// ships ([`ObjectStoreArtifacts`]); an S3-compatible bucket implements the same
/// (`runtime::artifacts::S3Artifacts`).
pub trait ArtifactStore: Send + Sync {
    /// Stores the file `pieces` yields, in order, under `key`, replacing what was there (a
    /// commit retried after a crash writes the same bytes again). Reads `pieces` as it writes,
    /// holding a bounded part of the file at a time, never all of it (each store says how
    /// much). A piece that is an error ends it with that error, replacing nothing.
    fn put_stream<P>(
        &self,
        key: &str,
        pieces: &mut P,
    ) -> impl Future<Output = Result<(), BusError>> + Send
    where
        P: Stream<Item = Result<Bytes, BusError>> + Unpin + Send;
    /// Stores `bytes` under `key`, replacing what was there.
    fn put(&self, key: &str, bytes: Bytes) -> impl Future<Output = Result<(), BusError>> + Send {
        async move {
            self.put_stream(key, &mut futures::stream::iter([Ok(bytes)]))
                .await
        }
    }
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
    /// The object store reads the pieces through its own buffer of one object chunk (128 KiB)
    /// and publishes each chunk before it reads the next. A failed put leaves the object chunks
    /// it published behind in the bucket's stream, under no object (as every failed put of
    /// the async-nats object store does).
    async fn put_stream<P>(&self, key: &str, pieces: &mut P) -> Result<(), BusError>
    where
        P: Stream<Item = Result<Bytes, BusError>> + Unpin + Send,
    {
        use futures::TryStreamExt as _;
        let mut reader = tokio_util::io::StreamReader::new(pieces.map_err(std::io::Error::other));
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
                .map_err(|error| {
                    let stream = subjects.artifacts_stream();
                    let message = error.to_string();
                    // A bucket whose stream JetStream did not answer for (see `provision`).
                    if error.kind()
                        == async_nats::jetstream::context::CreateKeyValueErrorKind::TimedOut
                    {
                        BusError::ProvisionUnanswered { stream, message }
                    } else {
                        BusError::Provision { stream, message }
                    }
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

    /// The first pass of a commit: reads everything stored for one upload session (on its
    /// stored subject, [`messages::Subjects::upload_stored`]) once, in stream order, and keeps
    /// of each chunk only where it lies, its length and its digest. Copies of a chunk (a resend
    /// whose PubAck was lost) are kept once; a chunk sent twice with other contents, a gap, a
    /// message that is not a chunk of this upload, or more than `size_max` bytes is a mismatch.
    pub async fn index_upload(
        &self,
        worker_id: &str,
        upload_id: &str,
        size_max: u64,
    ) -> Result<Result<UploadIndex, UploadMismatch>, BusError> {
        let subject = self.subjects.upload_stored(worker_id, upload_id);
        let stream_name = self.subjects.uploads_stream();
        let failed = |message: String| BusError::Artifacts {
            message: format!("reading upload {upload_id} from {stream_name}: {message}"),
        };
        let stream = self.uploads().await.map_err(failed)?;
        let last = match stream.get_last_raw_message_by_subject(&subject).await {
            Ok(message) => message.sequence,
            Err(error) if error.kind() == stream::LastRawMessageErrorKind::NoMessageFound => {
                return Ok(Ok(UploadIndex {
                    upload_id: upload_id.to_owned(),
                    sequences: Vec::new(),
                    size_bytes: 0,
                }));
            }
            Err(error) => return Err(failed(error.to_string())),
        };
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                filter_subject: subject.clone(),
                deliver_policy: consumer::DeliverPolicy::All,
                // Each pull asks for so many chunks, so no more than these wait in the client.
                max_batch: CHUNKS_FETCHED_AT_ONCE as i64,
                ..Default::default()
            })
            .await
            .map_err(|error| failed(error.to_string()))?;
        let mut messages = consumer
            .messages()
            .await
            .map_err(|error| failed(error.to_string()))?;
        let mut index = ChunkIndex::new(size_max);
        while let Some(message) = messages.next().await {
            let message = message.map_err(|error| failed(error.to_string()))?;
            let info = message.info().map_err(|error| failed(error.to_string()))?;
            let (sequence, pending) = (info.stream_sequence, info.pending);
            let added = chunk_of(message.payload.clone(), upload_id)
                .and_then(|chunk| index.add(sequence, &chunk));
            if let Err(mismatch) = added {
                return Ok(Err(mismatch));
            }
            // The last message looked up, or none after this one (it was purged meanwhile).
            if sequence >= last || pending == 0 {
                break;
            }
        }
        Ok(index.finish(upload_id))
    }

    /// The second pass of a commit: the indexed session's file as a stream of its chunks in
    /// index order, each fetched by its stream sequence (the leader's message get) when the
    /// consumer of the stream asks for it, [`CHUNKS_FETCHED_AT_ONCE`] gets in flight.
    pub async fn upload_pieces(&self, index: UploadIndex) -> Result<UploadPieces, BusError> {
        let UploadIndex {
            upload_id,
            sequences,
            ..
        } = index;
        let failed = {
            let stream_name = self.subjects.uploads_stream();
            let upload_id = upload_id.clone();
            move |message: String| BusError::Artifacts {
                message: format!("reading upload {upload_id} from {stream_name}: {message}"),
            }
        };
        let stream = self.uploads().await.map_err(&failed)?;
        let pieces = futures::stream::iter(sequences.into_iter().zip(0_u32..))
            .map(move |(sequence, position)| {
                let stream = stream.clone();
                let upload_id = upload_id.clone();
                let failed = failed.clone();
                async move {
                    let message = stream
                        .get_raw_message(sequence)
                        .await
                        .map_err(|error| failed(format!("chunk {position}: {error}")))?;
                    let chunk = chunk_of(message.payload, &upload_id)
                        .map_err(|mismatch| failed(format!("chunk {position}: {mismatch}")))?;
                    if chunk.index != position {
                        return Err(failed(format!(
                            "stream sequence {sequence} holds chunk {}, not chunk {position}",
                            chunk.index
                        )));
                    }
                    Ok(Bytes::from(chunk.data))
                }
            })
            .buffered(CHUNKS_FETCHED_AT_ONCE)
            .boxed();
        Ok(UploadPieces {
            pieces,
            sha256: Sha256::new(),
            size_bytes: 0,
            ended: false,
        })
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
