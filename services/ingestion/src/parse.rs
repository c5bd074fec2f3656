//! Parsing worker messages off the wire into what ingestion can act on.

use messages::limits::{
    BATCH_SEQUENCE_MAX, FINDING_FIELD_BYTES_MAX, IDENTIFIER_BYTES_MAX, RESOURCE_KIND_BYTES_MAX,
};
use messages::validate::{invalid, is_cve_id, malformed, schema_version as schema, worker_id};
use messages::{ErrorCode, WorkerVerb, v1};
use prost::Message as _;
use runtime::BatchLimits;
use store::evidence::redact;
use store::ingest;
use store::ingest::{BatchParams, FailParams};
use store::{LeaseClaim, RetryPolicy};
use uuid::Uuid;

/// Longest text kept from a completion summary or failure message.
pub const TEXT_CHARS_MAX: usize = 4_096;

const SEVERITIES: &[&str] = store::states::Severity::NAMES;

/// `BatchPayload.findings`' and `BatchPayload.evaluations`' field numbers: counted together
/// against the findings limit before more than the limit are held.
const FINDINGS_TAG: u32 = 1;
const EVALUATIONS_TAG: u32 = 3;

const EVALUATION_STATUSES: &[&str] = store::states::EvaluationStatus::NAMES;

/// A worker message that passed validation.
#[derive(Debug, Clone)]
pub enum WorkerMessage {
    Result {
        claim: LeaseClaim,
        sequence_number: i32,
        idempotency_key: String,
        payload_sha256: String,
        payload: v1::BatchPayload,
    },
    Complete {
        claim: LeaseClaim,
        batch_count: i32,
        /// The last batch, carried inside the completion (a `Result`).
        final_batch: Option<Box<WorkerMessage>>,
        summary: String,
        /// The worker asks for its scan's next plugin with the acknowledgement.
        lease_next: bool,
    },
    Fail {
        claim: LeaseClaim,
        error_code: String,
        error_message: String,
        retryable: bool,
    },
}

impl WorkerMessage {
    pub fn claim(&self) -> &LeaseClaim {
        match self {
            WorkerMessage::Result { claim, .. }
            | WorkerMessage::Complete { claim, .. }
            | WorkerMessage::Fail { claim, .. } => claim,
        }
    }

    /// The message as the store's decision script takes it: one message, or two for a
    /// completion carrying its last batch (the batch first).
    pub fn to_store(&self, retry: RetryPolicy) -> Vec<ingest::Message<'_>> {
        match self {
            WorkerMessage::Complete {
                final_batch: Some(batch),
                ..
            } => vec![batch.as_store(retry), self.as_store(retry)],
            _ => vec![self.as_store(retry)],
        }
    }

    fn as_store(&self, retry: RetryPolicy) -> ingest::Message<'_> {
        match self {
            WorkerMessage::Result {
                claim,
                sequence_number,
                idempotency_key,
                payload_sha256,
                payload,
            } => ingest::Message::Result(BatchParams {
                claim,
                sequence_number: *sequence_number,
                idempotency_key,
                payload_sha256,
                findings: &payload.findings,
                assets: &payload.assets,
                evaluations: &payload.evaluations,
            }),
            WorkerMessage::Complete {
                claim,
                batch_count,
                summary,
                lease_next,
                ..
            } => ingest::Message::Complete(ingest::CompleteParams {
                claim,
                batch_count: *batch_count,
                summary,
                lease_next: *lease_next,
            }),
            WorkerMessage::Fail {
                claim,
                error_code,
                error_message,
                retryable,
            } => ingest::Message::Fail(FailParams {
                claim,
                error_code,
                error_message,
                retryable: *retryable,
                retry,
            }),
        }
    }

    /// Order within a batch: by task, results before the completion or failure, results by
    /// sequence. Transactions then lock tasks in one order, and a completion that arrives in
    /// the same fetch as its last batches sees them.
    pub fn sort_key(&self) -> (Uuid, u8, i32) {
        match self {
            WorkerMessage::Result {
                claim,
                sequence_number,
                ..
            } => (claim.task_id, 0, *sequence_number),
            WorkerMessage::Complete { claim, .. } => (claim.task_id, 1, 0),
            WorkerMessage::Fail { claim, .. } => (claim.task_id, 1, 0),
        }
    }
}

/// How to answer a message: what is known about it even when it is refused.
#[derive(Debug, Clone, Default)]
pub struct AckAddress {
    pub worker_id: Option<String>,
    pub kind: &'static str,
    pub task_id: String,
    pub attempt_id: String,
    pub idempotency_key: String,
    pub sequence_number: u32,
}

fn too_large(message: impl Into<String>) -> v1::Error {
    v1::Error::new(ErrorCode::TooLarge, message)
}

fn address(
    subject_worker: Option<&str>,
    kind: &'static str,
    lease: Option<&v1::LeaseRef>,
) -> AckAddress {
    AckAddress {
        worker_id: subject_worker.map(str::to_owned),
        kind,
        task_id: lease.map(|l| l.task_id.clone()).unwrap_or_default(),
        attempt_id: lease.map(|l| l.attempt_id.clone()).unwrap_or_default(),
        ..Default::default()
    }
}

/// Decodes and validates one message from `verb`'s subject.
pub fn parse(
    verb: Option<WorkerVerb>,
    subject_worker: Option<&str>,
    payload: &[u8],
    limits: &BatchLimits,
) -> (AckAddress, Result<WorkerMessage, v1::Error>) {
    match verb {
        Some(WorkerVerb::Result) => parse_result(subject_worker, payload, limits),
        Some(WorkerVerb::Complete) => parse_complete(subject_worker, payload, limits),
        Some(WorkerVerb::Fail) => parse_fail(subject_worker, payload),
        _ => (
            AckAddress {
                worker_id: subject_worker.map(str::to_owned),
                kind: "unknown",
                ..Default::default()
            },
            Err(invalid("unexpected subject on the results stream")),
        ),
    }
}

fn parse_complete(
    subject_worker: Option<&str>,
    payload: &[u8],
    limits: &BatchLimits,
) -> (AckAddress, Result<WorkerMessage, v1::Error>) {
    match v1::TaskComplete::decode(payload) {
        Err(error) => (
            address(subject_worker, "complete", None),
            Err(malformed("TaskComplete", error)),
        ),
        Ok(message) => (
            address(subject_worker, "complete", message.lease.as_ref()),
            validate_complete(subject_worker, message, limits),
        ),
    }
}

/// Validates a completion, and the final batch it carries.
fn validate_complete(
    subject_worker: Option<&str>,
    message: v1::TaskComplete,
    limits: &BatchLimits,
) -> Result<WorkerMessage, v1::Error> {
    schema(message.schema_version)?;
    let claim = LeaseClaim::from_wire(
        worker_id(subject_worker, &message.worker_id)?,
        message.lease.as_ref(),
    )?;
    if message.batch_count > BATCH_SEQUENCE_MAX + 1 {
        return Err(v1::Error::new(
            ErrorCode::SequenceOutOfRange,
            format!(
                "batch_count {} is over {}",
                message.batch_count,
                BATCH_SEQUENCE_MAX + 1
            ),
        ));
    }
    let final_batch = match message.final_batch {
        None => None,
        Some(batch) => Some(Box::new(validate_final_batch(
            subject_worker,
            batch,
            &claim,
            message.batch_count,
            limits,
        )?)),
    };
    Ok(WorkerMessage::Complete {
        claim,
        batch_count: message.batch_count as i32,
        final_batch,
        summary: worker_text(&message.summary),
        lease_next: message.lease_next,
    })
}

/// Validates a completion's final batch: a valid batch under the completion's own lease,
/// numbered last of its `batch_count`.
fn validate_final_batch(
    subject_worker: Option<&str>,
    batch: v1::ResultBatch,
    claim: &LeaseClaim,
    batch_count: u32,
    limits: &BatchLimits,
) -> Result<WorkerMessage, v1::Error> {
    let batch = validate_batch(subject_worker, batch, limits)?;
    let WorkerMessage::Result {
        claim: batch_claim,
        sequence_number,
        ..
    } = &batch
    else {
        unreachable!("validate_batch returns a result")
    };
    if batch_claim != claim {
        return Err(invalid("final_batch.lease must be the completion's lease"));
    }
    if i64::from(*sequence_number) != i64::from(batch_count) - 1 {
        return Err(invalid(format!(
            "final_batch.sequence_number must be batch_count - 1 ({}), not {sequence_number}",
            i64::from(batch_count) - 1
        )));
    }
    Ok(batch)
}

fn parse_fail(
    subject_worker: Option<&str>,
    payload: &[u8],
) -> (AckAddress, Result<WorkerMessage, v1::Error>) {
    let message = match v1::TaskFail::decode(payload) {
        Ok(message) => message,
        Err(error) => {
            return (
                address(subject_worker, "fail", None),
                Err(malformed("TaskFail", error)),
            );
        }
    };
    let address = address(subject_worker, "fail", message.lease.as_ref());
    let parsed = (|| {
        schema(message.schema_version)?;
        let claim = LeaseClaim::from_wire(
            worker_id(subject_worker, &message.worker_id)?,
            message.lease.as_ref(),
        )?;
        let error = message.error.unwrap_or_default();
        let error_code = if error.code.is_empty() {
            "plugin_failed".to_owned()
        } else {
            error.code
        };
        if error_code.len() > IDENTIFIER_BYTES_MAX || error_code.contains('\0') {
            return Err(invalid(format!(
                "error.code must be 1..={IDENTIFIER_BYTES_MAX} bytes without NUL"
            )));
        }
        Ok(WorkerMessage::Fail {
            claim,
            error_code,
            error_message: worker_text(&error.message),
            retryable: message.retryable,
        })
    })();
    (address, parsed)
}

/// A worker's free text (a completion summary, a failure message) as it is kept, logged and
/// published: without NUL, redacted, then cut to [`TEXT_CHARS_MAX`] characters (redacted
/// first, so a secret across the cut is not half kept).
fn worker_text(text: &str) -> String {
    let clean: String = text.chars().filter(|c| *c != '\0').collect();
    redact(&clean).chars().take(TEXT_CHARS_MAX).collect()
}

fn parse_result(
    subject_worker: Option<&str>,
    payload: &[u8],
    limits: &BatchLimits,
) -> (AckAddress, Result<WorkerMessage, v1::Error>) {
    let message = match v1::ResultBatch::decode(payload) {
        Ok(message) => message,
        Err(error) => {
            return (
                address(subject_worker, "result", None),
                Err(malformed("ResultBatch", error)),
            );
        }
    };
    let mut address = address(subject_worker, "result", message.lease.as_ref());
    address.idempotency_key = message.idempotency_key.clone();
    address.sequence_number = message.sequence_number;
    let parsed = validate_batch(subject_worker, message, limits);
    (address, parsed)
}

/// Validates a result batch, sent on its own or inside a completion.
fn validate_batch(
    subject_worker: Option<&str>,
    message: v1::ResultBatch,
    limits: &BatchLimits,
) -> Result<WorkerMessage, v1::Error> {
    schema(message.schema_version)?;
    let claim = LeaseClaim::from_wire(
        worker_id(subject_worker, &message.worker_id)?,
        message.lease.as_ref(),
    )?;
    validate_envelope(&message, limits)?;
    let batch = validate_payload(&message.payload, limits)?;
    Ok(WorkerMessage::Result {
        claim,
        sequence_number: message.sequence_number as i32,
        idempotency_key: message.idempotency_key,
        payload_sha256: message.payload_sha256,
        payload: batch,
    })
}

/// A batch's envelope: its sequence number, its idempotency key, and its payload's size
/// and checksum, checked before the payload is decoded.
fn validate_envelope(message: &v1::ResultBatch, limits: &BatchLimits) -> Result<(), v1::Error> {
    if message.sequence_number > BATCH_SEQUENCE_MAX {
        return Err(v1::Error::new(
            ErrorCode::SequenceOutOfRange,
            format!(
                "sequence_number {} is over {BATCH_SEQUENCE_MAX}",
                message.sequence_number
            ),
        ));
    }
    if message.idempotency_key.is_empty()
        || message.idempotency_key.len() > IDENTIFIER_BYTES_MAX
        || message.idempotency_key.contains('\0')
    {
        return Err(invalid(format!(
            "idempotency_key must be 1..={IDENTIFIER_BYTES_MAX} bytes"
        )));
    }
    let checksum_form = message.payload_sha256.len() == 64
        && message
            .payload_sha256
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !checksum_form {
        return Err(invalid("payload_sha256 must be 64 lowercase hex digits"));
    }
    if message.payload.len() > limits.bytes_max {
        return Err(too_large(format!(
            "batch payload is {} bytes, at most {} are accepted; send smaller batches",
            message.payload.len(),
            limits.bytes_max
        )));
    }
    let actual = messages::sha256_hex(&message.payload);
    if actual != message.payload_sha256 {
        return Err(v1::Error::new(
            ErrorCode::ChecksumMismatch,
            format!(
                "payload hashes to {actual}, the message says {}",
                message.payload_sha256
            ),
        ));
    }
    Ok(())
}

/// A batch's payload decoded (at most the limit of findings held), every finding and asset
/// checked, and the assets' values redacted.
fn validate_payload(payload: &[u8], limits: &BatchLimits) -> Result<v1::BatchPayload, v1::Error> {
    // An empty finding is two bytes on the wire and some 200 decoded: at most the limit of
    // findings and evaluations together is held, the rest only counted.
    let counted = messages::bounded::decode_counted_among::<v1::BatchPayload>(
        payload,
        &[FINDINGS_TAG, EVALUATIONS_TAG],
        limits.findings_max,
    )
    .map_err(|error| malformed("BatchPayload", error))?;
    if !counted.is_whole(limits.findings_max) {
        return Err(too_large(format!(
            "batch has {} findings and evaluations, at most {} are accepted; send smaller \
             batches",
            counted.count, limits.findings_max
        )));
    }
    let mut batch = counted.message;
    for finding in &batch.findings {
        validate_finding(finding)?;
    }
    for asset in &batch.assets {
        if asset.kind.is_empty()
            || asset.kind.len() > RESOURCE_KIND_BYTES_MAX
            || asset.value.is_empty()
            || asset.value.len() > 2_048
            || asset.kind.contains('\0')
            || asset.value.contains('\0')
        {
            return Err(invalid(format!(
                "asset kind must be 1..={RESOURCE_KIND_BYTES_MAX} bytes and value 1..=2048 bytes"
            )));
        }
    }
    for evaluation in &batch.evaluations {
        validate_evaluation(evaluation)?;
    }
    // Asset values are stored and de-duplicated as redacted; a finding's text fields are
    // redacted by the store, after its key is computed from what the worker sent.
    for asset in &mut batch.assets {
        asset.value = redact(&asset.value);
    }
    Ok(batch)
}

fn validate_finding(finding: &v1::Finding) -> Result<(), v1::Error> {
    if finding.rule_id.is_empty() || finding.rule_id.len() > IDENTIFIER_BYTES_MAX {
        return Err(invalid(format!(
            "finding rule_id must be 1..={IDENTIFIER_BYTES_MAX} bytes"
        )));
    }
    if finding.resource.is_empty() || finding.title.is_empty() {
        return Err(invalid(format!(
            "finding {:?} needs a resource and a title",
            finding.rule_id
        )));
    }
    if !SEVERITIES.contains(&finding.severity.as_str()) {
        return Err(invalid(format!(
            "finding severity {:?} is not one of {}",
            finding.severity,
            SEVERITIES.join(", ")
        )));
    }
    for (name, text) in [
        ("rule_id", &finding.rule_id),
        ("severity", &finding.severity),
        ("resource", &finding.resource),
        ("discriminator", &finding.discriminator),
        ("title", &finding.title),
        ("description", &finding.description),
        ("evidence", &finding.evidence),
    ] {
        if text.len() > FINDING_FIELD_BYTES_MAX {
            return Err(too_large(format!(
                "finding {name} is over {FINDING_FIELD_BYTES_MAX} bytes"
            )));
        }
        if text.contains('\0') {
            return Err(invalid(format!("finding {name} contains a NUL character")));
        }
    }
    if finding.cve_ids.iter().any(|cve| !is_cve_id(cve)) {
        return Err(invalid("finding cve_ids must look like CVE-2024-12345"));
    }
    Ok(())
}

/// An evaluation: a rule and a resource as for a finding, a known status, a reason code where
/// the status needs one (error, not applicable), text fields bounded as a finding's.
fn validate_evaluation(evaluation: &v1::Evaluation) -> Result<(), v1::Error> {
    if evaluation.rule_id.is_empty() || evaluation.rule_id.len() > IDENTIFIER_BYTES_MAX {
        return Err(invalid(format!(
            "evaluation rule_id must be 1..={IDENTIFIER_BYTES_MAX} bytes"
        )));
    }
    if evaluation.resource.is_empty() {
        return Err(invalid(format!(
            "evaluation {:?} needs a resource",
            evaluation.rule_id
        )));
    }
    let Some(status) = store::states::EvaluationStatus::parse(&evaluation.status) else {
        return Err(invalid(format!(
            "evaluation status {:?} is not one of {}",
            evaluation.status,
            EVALUATION_STATUSES.join(", ")
        )));
    };
    if evaluation.reason_code.len() > IDENTIFIER_BYTES_MAX {
        return Err(invalid(format!(
            "evaluation reason_code must be at most {IDENTIFIER_BYTES_MAX} bytes"
        )));
    }
    if status.needs_reason() && evaluation.reason_code.is_empty() {
        return Err(invalid(format!(
            "evaluation {:?} on {:?} is {}: it needs a reason_code saying why",
            evaluation.rule_id, evaluation.resource, evaluation.status
        )));
    }
    for (name, text) in [
        ("rule_id", &evaluation.rule_id),
        ("resource", &evaluation.resource),
        ("reason_code", &evaluation.reason_code),
        ("evidence", &evaluation.evidence),
        ("finding_discriminator", &evaluation.finding_discriminator),
    ] {
        if text.len() > FINDING_FIELD_BYTES_MAX {
            return Err(too_large(format!(
                "evaluation {name} is over {FINDING_FIELD_BYTES_MAX} bytes"
            )));
        }
        if text.contains('\0') {
            return Err(invalid(format!(
                "evaluation {name} contains a NUL character"
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod hostile;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn lease() -> v1::LeaseRef {
        v1::LeaseRef {
            task_id: Uuid::now_v7().to_string(),
            attempt_id: Uuid::now_v7().to_string(),
            attempt_number: 1,
            lease_token: "t".into(),
        }
    }

    fn batch(worker: &str, payload: Vec<u8>, checksum: String) -> Vec<u8> {
        v1::ResultBatch {
            schema_version: 1,
            worker_id: worker.into(),
            lease: Some(lease()),
            sequence_number: 0,
            idempotency_key: "k".into(),
            payload_sha256: checksum,
            payload,
        }
        .encode_to_vec()
    }

    fn finding() -> v1::Finding {
        v1::Finding {
            rule_id: "r".into(),
            resource: "x".into(),
            severity: "low".into(),
            title: "t".into(),
            ..Default::default()
        }
    }

    #[test]
    fn checksum_mismatch_is_detected() {
        let worker = Uuid::now_v7().to_string();
        let payload = v1::BatchPayload {
            findings: vec![finding()],
            ..Default::default()
        }
        .encode_to_vec();
        let good = batch(&worker, payload.clone(), messages::sha256_hex(&payload));
        let (_, parsed) = parse(
            Some(WorkerVerb::Result),
            Some(&worker),
            &good,
            &BatchLimits::default(),
        );
        assert!(parsed.is_ok());
        let bad = batch(&worker, payload, messages::sha256_hex(b"other"));
        let (_, parsed) = parse(
            Some(WorkerVerb::Result),
            Some(&worker),
            &bad,
            &BatchLimits::default(),
        );
        assert_eq!(
            parsed.unwrap_err().error_code(),
            Some(ErrorCode::ChecksumMismatch)
        );
    }

    #[test]
    fn oversized_batches_are_too_large() {
        let worker = Uuid::now_v7().to_string();
        let payload = v1::BatchPayload {
            findings: vec![finding(); 3],
            ..Default::default()
        }
        .encode_to_vec();
        let message = batch(&worker, payload.clone(), messages::sha256_hex(&payload));
        let limits = BatchLimits {
            findings_max: 2,
            bytes_max: 1 << 20,
        };
        let (_, parsed) = parse(Some(WorkerVerb::Result), Some(&worker), &message, &limits);
        assert_eq!(parsed.unwrap_err().error_code(), Some(ErrorCode::TooLarge));
    }

    #[test]
    fn worker_id_must_match_the_subject() {
        let worker = Uuid::now_v7().to_string();
        let payload = v1::BatchPayload::default().encode_to_vec();
        let message = batch(&worker, payload.clone(), messages::sha256_hex(&payload));
        let (_, parsed) = parse(
            Some(WorkerVerb::Result),
            Some("someone-else"),
            &message,
            &BatchLimits::default(),
        );
        assert_eq!(
            parsed.unwrap_err().error_code(),
            Some(ErrorCode::InvalidField)
        );
    }

    fn evaluation(status: &str, reason_code: &str) -> v1::Evaluation {
        v1::Evaluation {
            rule_id: "r".into(),
            resource: "x".into(),
            status: status.into(),
            reason_code: reason_code.into(),
            ..Default::default()
        }
    }

    fn parse_payload(payload: v1::BatchPayload, limits: &BatchLimits) -> Result<(), v1::Error> {
        let worker = Uuid::now_v7().to_string();
        let payload = payload.encode_to_vec();
        let message = batch(&worker, payload.clone(), messages::sha256_hex(&payload));
        parse(Some(WorkerVerb::Result), Some(&worker), &message, limits)
            .1
            .map(|_| ())
    }

    #[test]
    fn evaluations_need_a_known_status_and_a_reason_where_it_needs_one() {
        let limits = BatchLimits::default();
        let with = |evaluation| v1::BatchPayload {
            evaluations: vec![evaluation],
            ..Default::default()
        };
        for (status, reason) in [
            ("pass", ""),
            ("fail", ""),
            ("error", "connection_refused"),
            ("not_applicable", "no_tls_service"),
        ] {
            parse_payload(with(evaluation(status, reason)), &limits)
                .unwrap_or_else(|e| panic!("{status} with {reason:?}: {e:?}"));
        }
        for (status, reason) in [
            ("error", ""),
            ("not_applicable", ""),
            ("unknown", "nothing"),
            ("PASS", ""),
            ("", ""),
        ] {
            let refused = parse_payload(with(evaluation(status, reason)), &limits).unwrap_err();
            assert_eq!(
                refused.error_code(),
                Some(ErrorCode::InvalidField),
                "{status} with {reason:?}"
            );
        }
    }

    #[test]
    fn the_wire_and_the_store_spell_the_same_statuses() {
        assert_eq!(
            messages::EVALUATION_STATUSES.as_slice(),
            store::states::EvaluationStatus::NAMES
        );
    }

    #[test]
    fn findings_and_evaluations_share_the_batch_limit() {
        let limits = BatchLimits {
            findings_max: 4,
            bytes_max: 1 << 20,
        };
        let payload = |findings, evaluations| v1::BatchPayload {
            findings: vec![finding(); findings],
            evaluations: vec![evaluation("pass", ""); evaluations],
            ..Default::default()
        };
        parse_payload(payload(2, 2), &limits).unwrap();
        let refused = parse_payload(payload(2, 3), &limits).unwrap_err();
        assert_eq!(refused.error_code(), Some(ErrorCode::TooLarge));
    }
}
