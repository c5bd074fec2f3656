//! Upload chunks (issue 23). Chunks travel through a stream of their own, not straight into the
//! JetStream Object Store: an object's name is one base64 token of its subjects, so NATS
//! permissions could not confine a worker to its own objects. Ingestion, not JetStream,
//! receives what a worker publishes on
//! `<prefix>.v1.upload.<worker_id>.<upload_id>` (queue group `ingestion`). No stream captures
//! that subject, so a worker cannot store anything without a session: a chunk is stored (on
//! the uploads stream's own subject `<prefix>.v1.uploaded.<worker_id>.<upload_id>`, which no
//! worker or client account can publish to) only when
//!
//! - the subject's upload id is a session of the subject's worker that is still `prepared`
//!   and has not expired (one statement: `store::artifacts::open_for_chunks`);
//! - the payload is an `ArtifactChunk` of that upload, its `data` at most
//!   [`CHUNK_BYTES_MAX`] bytes and its `index` below the most chunks a session may have
//!   (`PALISADE_ARTIFACT_BYTES_MAX` / [`CHUNK_BYTES_MAX`], rounded up).
//!
//! The worker published with JetStream and awaits a PubAck: the answer has that form, so the
//! wire protocol is unchanged. A stored chunk is answered with the uploads stream's own
//! PubAck (`{"stream":"<PREFIX>_UPLOADS","seq":N}`, with `"duplicate":true` when JetStream
//! de-duplicated it); a refusal with a JetStream API error (`{"error":{"code":404,
//! "err_code":19000,"description":"not_found: no open upload session …"}}`), which JetStream
//! clients surface as the publish's error.
//!
//! The stored message's `Nats-Msg-Id` is `<upload_id>:<index>` whatever the request's says
//! (an upload id is one worker's session, checked above): a resend within JetStream's
//! duplicate window is kept once, whatever id the worker gives it.

use bus::Bus;
use bus::artifacts::CHUNK_BYTES_MAX;
use bus::async_nats::jetstream::publish::PublishAck;
use bytes::Bytes;
use messages::validate::{invalid, malformed};
use messages::{ErrorCode, v1};
use prost::Message as _;
use runtime::ArtifactLimits;
use store::PgPool;
use uuid::Uuid;

/// The upload chunk server's name in `palisade_requests_total` and refusals.
pub const REQUEST_SERVER: &str = "ingestion.upload";

/// The `err_code` of every refusal ingestion answers on an upload subject (JetStream's own
/// codes are 10001–10999). The `code` says which kind: 400 (not a chunk of this upload, or
/// over a limit), 404 (no open session of this worker), 503 (palisade could not decide now:
/// send again). The description begins with palisade's error code (`not_found: …`).
pub const REFUSAL_ERR_CODE: u64 = 19000;

/// A chunk whose form is right, from the subject it came on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    pub worker_id: Uuid,
    pub upload_id: Uuid,
    pub index: u32,
}

/// The most chunks one session may have: a file of `PALISADE_ARTIFACT_BYTES_MAX` bytes in
/// chunks of [`CHUNK_BYTES_MAX`].
pub fn chunks_max(limits: &ArtifactLimits) -> u64 {
    bus::artifacts::chunks_max(limits.bytes_max)
}

fn no_session(upload_id: &str) -> v1::Error {
    v1::Error::new(
        ErrorCode::NotFound,
        format!(
            "no open upload session {upload_id} for this worker (never prepared, expired, failed or already committed); prepare one first"
        ),
    )
}

/// Checks what can be checked without the database: the subject names a worker and an
/// upload (UUIDs in their canonical spelling), and the payload is a chunk of that upload
/// within the limits. The error is the answer.
pub fn parse(
    subjects: &messages::Subjects,
    subject: &str,
    payload: &[u8],
    limits: &ArtifactLimits,
) -> Result<Chunk, v1::Error> {
    let (worker, upload) = subjects
        .upload_of(subject)
        .ok_or_else(|| invalid(format!("{subject:?} is not an upload subject")))?;
    let canonical = |text: &str| {
        Uuid::parse_str(text)
            .ok()
            .filter(|id| id.to_string() == text)
    };
    let worker_id = canonical(worker).ok_or_else(|| {
        invalid(format!(
            "the worker id {worker:?} of the upload subject is not a UUID"
        ))
    })?;
    // Sessions are named by canonical UUIDs: any other token names none.
    let upload_id = canonical(upload).ok_or_else(|| no_session(upload))?;
    let chunk =
        v1::ArtifactChunk::decode(payload).map_err(|error| malformed("ArtifactChunk", error))?;
    if chunk.upload_id != upload {
        return Err(invalid(format!(
            "the chunk's upload_id {:?} is not the subject's upload {upload}",
            chunk.upload_id
        )));
    }
    if chunk.data.len() > CHUNK_BYTES_MAX as usize {
        return Err(v1::Error::new(
            ErrorCode::TooLarge,
            format!(
                "chunk {} is {} bytes, over the {CHUNK_BYTES_MAX} bytes a chunk may have (chunk_bytes_max)",
                chunk.index,
                chunk.data.len()
            ),
        ));
    }
    let most = chunks_max(limits);
    if u64::from(chunk.index) >= most {
        return Err(v1::Error::new(
            ErrorCode::TooLarge,
            format!(
                "chunk index {} is past the {most} chunks of a file of at most {} bytes (PALISADE_ARTIFACT_BYTES_MAX)",
                chunk.index, limits.bytes_max
            ),
        ));
    }
    Ok(Chunk {
        worker_id,
        upload_id,
        index: chunk.index,
    })
}

/// The `code` of a refusal's JetStream-shaped answer.
fn status_of(error: &v1::Error) -> u16 {
    match error.error_code() {
        Some(ErrorCode::NotFound) => 404,
        Some(ErrorCode::Internal) => 503,
        _ => 400,
    }
}

/// A JetStream PubAck for a stored chunk.
pub fn pub_ack(ack: &PublishAck) -> Bytes {
    let mut answer = serde_json::json!({ "stream": ack.stream, "seq": ack.sequence });
    if ack.duplicate {
        answer["duplicate"] = serde_json::Value::Bool(true);
    }
    answer.to_string().into()
}

/// A JetStream API error for a refused chunk.
pub fn api_error(error: &v1::Error) -> Bytes {
    serde_json::json!({
        "error": {
            "code": status_of(error),
            "err_code": REFUSAL_ERR_CODE,
            "description": format!("{}: {}", error.code, error.message),
        }
    })
    .to_string()
    .into()
}

/// What ingestion needs to receive chunks.
pub struct Uploads {
    pub pool: PgPool,
    pub bus: Bus,
    pub limits: ArtifactLimits,
}

impl Uploads {
    /// The answer to one chunk published on `message.subject`.
    pub async fn reply(&self, message: &bus::async_nats::Message) -> Bytes {
        match self.store(message).await {
            Ok(ack) => pub_ack(&ack),
            Err(error) => {
                // Not logged one by one (a worker may send many): counted by code.
                tracing::debug!(code = %error.code, message = %error.message, "upload chunk refused");
                bus::metrics::record_refusal(REQUEST_SERVER, &error.code);
                api_error(&error)
            }
        }
    }

    async fn store(&self, message: &bus::async_nats::Message) -> Result<PublishAck, v1::Error> {
        let chunk = parse(
            self.bus.subjects(),
            message.subject.as_str(),
            &message.payload,
            &self.limits,
        )?;
        let internal = |what: &str, cause: &dyn std::fmt::Display| {
            runtime::internal_error(what, cause, "send the chunk again")
        };
        let open = store::artifacts::open_for_chunks(&self.pool, chunk.worker_id, chunk.upload_id)
            .await
            .map_err(|error| internal("checking the upload session", &telemetry::chain(&error)))?;
        if !open {
            return Err(no_session(&chunk.upload_id.to_string()));
        }
        let (worker, upload) = (chunk.worker_id.to_string(), chunk.upload_id.to_string());
        self.bus
            .publish_durable(
                self.bus.subjects().upload_stored(&worker, &upload),
                &format!("{upload}:{}", chunk.index),
                bus::async_nats::HeaderMap::new(),
                message.payload.clone(),
            )
            .await
            .map_err(|error| match error {
                bus::BusError::Quota { .. } => v1::Error::new(
                    ErrorCode::TooLarge,
                    format!(
                        "upload {upload} already holds the most chunks a session may store (twice the chunks of a file of PALISADE_ARTIFACT_BYTES_MAX); prepare a new upload"
                    ),
                ),
                error => internal("storing the chunk", &telemetry::chain(&error)),
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chunk(upload_id: &str, index: u32, len: usize) -> Vec<u8> {
        v1::ArtifactChunk {
            upload_id: upload_id.to_owned(),
            index,
            data: vec![7; len],
        }
        .encode_to_vec()
    }

    #[test]
    fn a_chunk_is_one_of_its_subjects_upload_within_the_limits() {
        let subjects = messages::Subjects::new("p").unwrap();
        let limits = ArtifactLimits::default();
        let (worker, upload) = (Uuid::new_v4(), Uuid::new_v4());
        let subject = subjects.upload(&worker.to_string(), &upload.to_string());
        let code = |subject: &str, payload: &[u8]| {
            parse(&subjects, subject, payload, &limits)
                .expect_err("refused")
                .code
        };
        let most = chunks_max(&limits);
        assert_eq!(most, 256);
        let parsed = parse(
            &subjects,
            &subject,
            &chunk(&upload.to_string(), 255, CHUNK_BYTES_MAX as usize),
            &limits,
        )
        .unwrap();
        assert_eq!(
            parsed,
            Chunk {
                worker_id: worker,
                upload_id: upload,
                index: 255
            }
        );
        let id = upload.to_string();
        assert_eq!(code(&subject, &chunk(&id, 256, 1)), "too_large");
        assert_eq!(
            code(&subject, &chunk(&id, 0, CHUNK_BYTES_MAX as usize + 1)),
            "too_large"
        );
        assert_eq!(
            code(&subject, &chunk(&Uuid::new_v4().to_string(), 0, 1)),
            "invalid_field"
        );
        assert_eq!(code(&subject, b"\xff\xff"), "malformed_message");
        let upper = subjects.upload(&worker.to_string(), &id.to_uppercase());
        assert_eq!(code(&upper, &chunk(&id.to_uppercase(), 0, 1)), "not_found");
        let not_a_worker = subjects.upload("w", &id);
        assert_eq!(code(&not_a_worker, &chunk(&id, 0, 1)), "invalid_field");
        assert_eq!(
            code("p.v1.upload.a.b.c", &chunk(&id, 0, 1)),
            "invalid_field"
        );
    }

    #[test]
    fn answers_have_the_form_jetstream_clients_parse() {
        let refusal = api_error(&no_session("u"));
        let value: serde_json::Value = serde_json::from_slice(&refusal).unwrap();
        assert_eq!(value["error"]["code"], 404);
        assert_eq!(value["error"]["err_code"], REFUSAL_ERR_CODE);
        let description = value["error"]["description"].as_str().unwrap();
        assert!(
            description.starts_with("not_found: no open upload session u for this worker"),
            "{description}"
        );
        let internal = api_error(&v1::Error::new(ErrorCode::Internal, "x"));
        let value: serde_json::Value = serde_json::from_slice(&internal).unwrap();
        assert_eq!(value["error"]["code"], 503);
    }
}
