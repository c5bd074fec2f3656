//! palisade's wire contract: the `palisade.v1` protobuf messages, the subjects they travel on,
//! the error codes a sender can get back, and the limits every party checks.
//!
//! This crate depends on no other workspace crate; everything that crosses a process boundary
//! is defined here and documented in `docs/protocol/`.

pub mod access;
pub mod codes;
pub mod limits;
pub mod retry;
pub mod subjects;
pub mod validate;

pub use access::{Identity, Permissions, Service};
pub use codes::ErrorCode;
pub use subjects::{Audience, ClientVerb, EventKind, Subjects, WorkerVerb};

/// The generated `palisade.v1` messages.
#[allow(clippy::all, missing_docs)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/palisade.v1.rs"));
}

/// The only `schema_version` this build accepts.
pub const SCHEMA_VERSION: u32 = 1;

/// The protocol version a worker reports in its hello.
pub const PROTOCOL_VERSION: &str = "palisade.v1";

/// NATS header carrying the sender's idempotency key on JetStream publishes.
pub const HEADER_MSG_ID: &str = "Nats-Msg-Id";

impl v1::Error {
    /// A refusal with `code` and a human-readable `message`.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self {
            code: code.as_str().to_owned(),
            message: message.into(),
            ..Default::default()
        }
    }

    /// The code as an enum; `None` for a code this build does not know.
    pub fn error_code(&self) -> Option<ErrorCode> {
        ErrorCode::parse(&self.code)
    }
}

impl std::fmt::Debug for v1::LeaseRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseRef")
            .field("task_id", &self.task_id)
            .field("attempt_id", &self.attempt_id)
            .field("attempt_number", &self.attempt_number)
            .field("lease_token", &"<redacted>")
            .finish()
    }
}

/// Lowercase hex sha256 of `bytes`: the `payload_sha256` of a result batch.
pub fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    hex::encode(sha2::Sha256::digest(bytes))
}

/// The request fingerprint of a scan request: sha256 over its semantic fields in a fixed,
/// length-prefixed encoding (see docs/protocol/reference.md, "Request fingerprint"). Identity fields
/// (client id, idempotency key) are not part of it.
pub fn scan_request_fingerprint(request: &v1::ScanRequest) -> String {
    use sha2::Digest as _;
    let mut hasher = sha2::Sha256::new();
    let mut field = |bytes: &[u8]| {
        hasher.update((bytes.len() as u64).to_be_bytes());
        hasher.update(bytes);
    };
    field(b"palisade.v1.ScanRequest");
    field(request.organization_id.to_ascii_lowercase().as_bytes());
    field(request.target.as_bytes());
    field(&(request.plugins.len() as u64).to_be_bytes());
    for plugin in &request.plugins {
        field(plugin.as_bytes());
    }
    field(&request.priority.to_be_bytes());
    field(&request.execution_deadline_seconds.to_be_bytes());
    hex::encode(hasher.finalize())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lease_ref_never_shows_its_token() {
        let lease = v1::Lease {
            lease: Some(v1::LeaseRef {
                lease_token: "the-secret-token".into(),
                ..Default::default()
            }),
            ..Default::default()
        };
        let shown = format!("{lease:?} {lease:#?}");
        assert!(!shown.contains("the-secret-token"), "{shown}");
        assert!(shown.contains("<redacted>"), "{shown}");
    }

    fn request() -> v1::ScanRequest {
        v1::ScanRequest {
            schema_version: 1,
            organization_id: "0193c3c4-0000-7000-8000-000000000001".into(),
            target: "http://127.0.0.1:8080".into(),
            plugins: vec!["tcp_connect".into(), "http_headers".into()],
            priority: 0,
            execution_deadline_seconds: 0,
            client_id: "ci".into(),
            idempotency_key: "k1".into(),
        }
    }

    #[test]
    fn fingerprint_ignores_identity_fields() {
        let a = request();
        let mut b = request();
        b.client_id = "other".into();
        b.idempotency_key = "k2".into();
        assert_eq!(scan_request_fingerprint(&a), scan_request_fingerprint(&b));
    }

    #[test]
    fn fingerprint_covers_every_semantic_field() {
        let base = scan_request_fingerprint(&request());
        type Change = Box<dyn Fn(&mut v1::ScanRequest)>;
        let changes: Vec<Change> = vec![
            Box::new(|r| r.organization_id = "0193c3c4-0000-7000-8000-000000000002".into()),
            Box::new(|r| r.target.push('/')),
            Box::new(|r| r.plugins.reverse()),
            Box::new(|r| r.plugins = vec!["tcp_connecthttp_headers".into()]),
            Box::new(|r| r.priority = 1),
            Box::new(|r| r.execution_deadline_seconds = 60),
        ];
        for change in changes {
            let mut changed = request();
            change(&mut changed);
            assert_ne!(base, scan_request_fingerprint(&changed));
        }
    }
}
