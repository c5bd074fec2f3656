//! palisade's wire contract: the `palisade.v1` protobuf messages, the subjects they travel on,
//! the error codes a sender can get back, and the limits every party checks.
//!
//! This crate depends on no other workspace crate; everything that crosses a process boundary
//! is defined here and documented in `docs/protocol/`.

pub mod access;
pub mod bounded;
pub mod codes;
pub mod limits;
pub mod retry;
pub mod subjects;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod validate;

pub use access::{Crossing, Identity, Permissions, Service};
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

/// The resource kind of a scan's target itself, for `RuleDeclaration.resource_kinds`: a rule
/// that applies to it is required on the target as the scan request gave it.
pub const TARGET_RESOURCE_KIND: &str = "target";

/// The statuses a plugin may report in `Evaluation.status` (reference 6.7 "Evaluations"); the
/// store's `EvaluationStatus` spells the same, and ingestion's tests pin that they agree.
pub const EVALUATION_STATUSES: [&str; 4] = ["pass", "fail", "error", "not_applicable"];

impl v1::Evaluation {
    fn with(rule_id: &str, resource: &str, status: &str, reason_code: &str) -> Self {
        Self {
            rule_id: rule_id.to_owned(),
            resource: resource.to_owned(),
            status: status.to_owned(),
            reason_code: reason_code.to_owned(),
            ..Default::default()
        }
    }

    /// `rule_id` was checked on `resource` and holds.
    pub fn pass(rule_id: &str, resource: &str) -> Self {
        Self::with(rule_id, resource, EVALUATION_STATUSES[0], "")
    }

    /// `rule_id` was checked on `resource` and does not hold: it produced the finding of the
    /// same rule and resource whose discriminator is `finding_discriminator` ("" for none).
    pub fn fail(rule_id: &str, resource: &str, finding_discriminator: &str) -> Self {
        Self {
            finding_discriminator: finding_discriminator.to_owned(),
            ..Self::with(rule_id, resource, EVALUATION_STATUSES[1], "")
        }
    }

    /// `rule_id` could not be checked on `resource`, for the reason `reason_code`.
    pub fn error(rule_id: &str, resource: &str, reason_code: &str) -> Self {
        Self::with(rule_id, resource, EVALUATION_STATUSES[2], reason_code)
    }

    /// `rule_id` does not apply to `resource`, for the reason `reason_code`.
    pub fn not_applicable(rule_id: &str, resource: &str, reason_code: &str) -> Self {
        Self::with(rule_id, resource, EVALUATION_STATUSES[3], reason_code)
    }

    /// This evaluation with `evidence` as its supporting detail.
    pub fn with_evidence(mut self, evidence: impl Into<String>) -> Self {
        self.evidence = evidence.into();
        self
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

    mod hostile {
        use super::*;
        use crate::testing::{any_bytes, cases, hostile_text, scan_request};
        use proptest::prelude::*;

        fn is_lowercase_hex_sha256(text: &str) -> bool {
            text.len() == 64
                && text
                    .bytes()
                    .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        }

        proptest! {
            #![proptest_config(cases(256))]

            /// The fingerprint is a function of the semantic fields alone: the same for any
            /// client id and key and for either case of the organization id.
            #[test]
            fn hostile_fingerprint_ignores_identity_fields(
                request in scan_request(),
                client_id in hostile_text(),
                idempotency_key in hostile_text(),
            ) {
                let fingerprint = scan_request_fingerprint(&request);
                prop_assert!(is_lowercase_hex_sha256(&fingerprint));
                prop_assert_eq!(&fingerprint, &scan_request_fingerprint(&request.clone()));
                let other = v1::ScanRequest {
                    client_id,
                    idempotency_key,
                    organization_id: request.organization_id.to_uppercase(),
                    ..request.clone()
                };
                prop_assert_eq!(fingerprint, scan_request_fingerprint(&other));
            }

            /// Fields are length-prefixed: moving bytes from the target into the first plugin
            /// (or splitting a plugin in two) is another request.
            #[test]
            fn hostile_fingerprint_fields_do_not_run_together(
                request in scan_request(),
                split in any::<prop::sample::Index>(),
            ) {
                let target = &request.target;
                let at = split.index(target.len());
                prop_assume!(target.is_char_boundary(at) && at < target.len());
                let mut moved = request.clone();
                moved.target = target[..at].to_owned();
                moved.plugins[0] = format!("{}{}", &target[at..], request.plugins[0]);
                prop_assert_ne!(scan_request_fingerprint(&request), scan_request_fingerprint(&moved));
                let plugin = &request.plugins[0];
                if plugin.len() > 1 {
                    let mut split_plugin = request.clone();
                    split_plugin.plugins.splice(0..1, [plugin[..1].to_owned(), plugin[1..].to_owned()]);
                    prop_assert_ne!(
                        scan_request_fingerprint(&request),
                        scan_request_fingerprint(&split_plugin)
                    );
                }
            }

            /// The batch checksum is 64 lowercase hex digits and changes with any byte.
            #[test]
            fn hostile_checksum_is_lowercase_hex_and_sees_every_byte(
                bytes in any_bytes(),
                flip in any::<prop::sample::Index>(),
            ) {
                let checksum = sha256_hex(&bytes);
                prop_assert!(is_lowercase_hex_sha256(&checksum));
                if !bytes.is_empty() {
                    let mut changed = bytes.clone();
                    changed[flip.index(bytes.len())] ^= 1;
                    prop_assert_ne!(checksum, sha256_hex(&changed));
                }
            }
        }
    }
}
