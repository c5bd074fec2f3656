//! Hostile-input property tests of ingestion's parser: arbitrary bytes on each verb, and
//! well-formed batches, completions and failures with one field made bad, each refused with
//! the code reference 6.7–6.9 gives it.

use super::*;
use messages::Subjects;
use messages::testing::{
    any_bytes, bad_bounded_text, bad_lease_ref, bad_schema_version, batch_payload, cases, finding,
    hostile_text, lease_ref, token_text, uuid_text,
};
use proptest::prelude::*;

/// Small limits, so that going over them is cheap to generate.
const LIMITS: BatchLimits = BatchLimits {
    findings_max: 16,
    bytes_max: 4_096,
};

fn code(result: &Result<WorkerMessage, v1::Error>) -> Option<ErrorCode> {
    result
        .as_ref()
        .err()
        .map(|error| error.error_code().expect("a known code"))
}

fn batch(worker_id: String, lease: v1::LeaseRef, payload: &v1::BatchPayload) -> v1::ResultBatch {
    let payload = payload.encode_to_vec();
    v1::ResultBatch {
        schema_version: 1,
        worker_id,
        lease: Some(lease),
        sequence_number: 0,
        idempotency_key: "batch-0".into(),
        payload_sha256: messages::sha256_hex(&payload),
        payload,
    }
}

fn result_batch() -> impl Strategy<Value = v1::ResultBatch> {
    (
        uuid_text(),
        lease_ref(),
        batch_payload(),
        0..=BATCH_SEQUENCE_MAX,
        "[ -~]{1,128}",
    )
        .prop_map(
            |(worker_id, lease, payload, sequence_number, key)| v1::ResultBatch {
                sequence_number,
                idempotency_key: key,
                ..batch(worker_id, lease, &payload)
            },
        )
}

fn reseal(batch: &mut v1::ResultBatch) {
    batch.payload_sha256 = messages::sha256_hex(&batch.payload);
}

fn parse_on(
    verb: WorkerVerb,
    worker: Option<&str>,
    bytes: &[u8],
) -> Result<WorkerMessage, v1::Error> {
    parse(Some(verb), worker, bytes, &LIMITS).1
}

proptest! {
    #![proptest_config(cases(256))]

    /// Any bytes on any subject: no panic; the ack names the subject's verb and a worker
    /// token only; a refusal has a code ingestion sends before its transaction.
    #[test]
    fn hostile_bytes_get_a_documented_code(
        bytes in any_bytes(),
        verb in proptest::sample::select(vec![WorkerVerb::Result, WorkerVerb::Complete, WorkerVerb::Fail]),
        worker in prop_oneof![uuid_text(), token_text(), hostile_text()],
    ) {
        use ErrorCode::*;
        let subjects = Subjects::new("p").unwrap();
        let subject = format!("p.v1.worker.{worker}.{}", verb.name());
        let subject_worker = subjects.worker_id_of(&subject);
        let (address, result) = parse(Some(verb), subject_worker, &bytes, &LIMITS);
        prop_assert_eq!(address.kind, verb.name());
        if let Some(worker_id) = &address.worker_id {
            prop_assert!(messages::subjects::token("worker_id", worker_id).is_ok());
            // What `answer` builds from it: asserts (in debug builds) that it is a token.
            let _ = subjects.worker(worker_id, WorkerVerb::Ack);
        }
        let documented = [MalformedMessage, UnsupportedSchemaVersion, InvalidField, TooLarge,
            SequenceOutOfRange, ChecksumMismatch];
        prop_assert!(code(&result).is_none_or(|c| documented.contains(&c)), "{result:?}");
    }

    /// A well-formed batch is accepted as sent (its asset values redacted, as they are
    /// stored), and its ack names its lease, key and number.
    #[test]
    fn hostile_valid_batch_is_accepted_as_sent(wire in result_batch()) {
        let (address, result) = parse(Some(WorkerVerb::Result), Some(&wire.worker_id), &wire.encode_to_vec(), &LIMITS);
        let WorkerMessage::Result { claim, sequence_number, idempotency_key, payload, payload_sha256 } = result.unwrap() else {
            panic!("a result");
        };
        let lease = wire.lease.unwrap();
        prop_assert_eq!(claim.attempt_id.to_string(), lease.attempt_id.clone());
        prop_assert_eq!(address.attempt_id, lease.attempt_id);
        prop_assert_eq!(sequence_number as u32, wire.sequence_number);
        prop_assert_eq!(address.sequence_number, wire.sequence_number);
        prop_assert_eq!(&idempotency_key, &wire.idempotency_key);
        prop_assert_eq!(payload_sha256, wire.payload_sha256);
        let mut sent = v1::BatchPayload::decode(&*wire.payload).unwrap();
        for asset in &mut sent.assets {
            asset.value = store::evidence::redact(&asset.value);
        }
        prop_assert_eq!(payload, sent);
    }

    /// One bad field of a well-formed batch gets the code reference 6.7 gives it.
    #[test]
    fn hostile_batch_fault_gets_its_code(
        mut wire in result_batch(),
        fault in 0..14u8,
        version in bad_schema_version(),
        other_worker in uuid_text(),
        bad_lease in bad_lease_ref(),
        bad_key in bad_bounded_text(IDENTIFIER_BYTES_MAX),
        junk in any_bytes(),
        bad_text in bad_bounded_text(FINDING_FIELD_BYTES_MAX).prop_filter("not empty", |t| !t.is_empty()),
        good_finding in finding(),
    ) {
        let subject_worker = wire.worker_id.clone();
        let mut payload = v1::BatchPayload::decode(&*wire.payload).unwrap();
        let expected = match fault {
            0 => { wire.schema_version = version; ErrorCode::UnsupportedSchemaVersion }
            1 => { wire.worker_id = other_worker; ErrorCode::InvalidField }
            2 => { wire.lease = Some(bad_lease); ErrorCode::InvalidField }
            3 => { wire.sequence_number = BATCH_SEQUENCE_MAX + 1; ErrorCode::SequenceOutOfRange }
            4 => { wire.idempotency_key = bad_key; ErrorCode::InvalidField }
            5 => { wire.payload_sha256 = wire.payload_sha256.to_uppercase(); ErrorCode::InvalidField }
            6 => { wire.payload.push(0); ErrorCode::ChecksumMismatch }
            7 => { wire.payload = vec![0; LIMITS.bytes_max + 1]; reseal(&mut wire); ErrorCode::TooLarge }
            8 => {
                prop_assume!(v1::BatchPayload::decode(&*junk).is_err());
                wire.payload = junk;
                reseal(&mut wire);
                ErrorCode::MalformedMessage
            }
            9 => {
                // Far more findings (empty, invalid) than accepted: counted before held.
                payload.findings.resize(LIMITS.findings_max + 1 + junk.len(), v1::Finding::default());
                wire.payload = payload.encode_to_vec();
                prop_assume!(wire.payload.len() <= LIMITS.bytes_max);
                reseal(&mut wire);
                ErrorCode::TooLarge
            }
            10 => {
                let mut bad = good_finding;
                bad.severity = "urgent".into();
                payload.findings.push(bad);
                wire.payload = payload.encode_to_vec();
                reseal(&mut wire);
                ErrorCode::InvalidField
            }
            11 => {
                let mut bad = good_finding;
                let too_long = bad_text.len() > FINDING_FIELD_BYTES_MAX;
                bad.description = bad_text;
                payload.findings.insert(0, bad);
                payload.findings.truncate(LIMITS.findings_max);
                wire.payload = payload.encode_to_vec();
                reseal(&mut wire);
                // A 64 KiB field passes the byte limit only with a larger one.
                return {
                    let limits = BatchLimits { bytes_max: 1 << 20, ..LIMITS };
                    let (_, result) = parse(Some(WorkerVerb::Result), Some(&subject_worker), &wire.encode_to_vec(), &limits);
                    prop_assert_eq!(code(&result), Some(if too_long { ErrorCode::TooLarge } else { ErrorCode::InvalidField }));
                    Ok(())
                };
            }
            12 => {
                let mut bad = good_finding;
                bad.cve_ids.push("CVE-1-1".into());
                payload.findings.push(bad);
                payload.findings.truncate(LIMITS.findings_max);
                wire.payload = payload.encode_to_vec();
                reseal(&mut wire);
                ErrorCode::InvalidField
            }
            _ => {
                payload.assets.push(v1::Asset { kind: bad_key, value: "v".into() });
                wire.payload = payload.encode_to_vec();
                reseal(&mut wire);
                ErrorCode::InvalidField
            }
        };
        let (_, result) = parse(Some(WorkerVerb::Result), Some(&subject_worker), &wire.encode_to_vec(), &LIMITS);
        prop_assert_eq!(code(&result), Some(expected), "{:?}", result);
    }

    /// A completion carrying its last batch is accepted; its faults get their codes; the
    /// summary is kept without NULs and cut to its limit.
    #[test]
    fn hostile_completion_gets_its_code(
        batch in result_batch(),
        fault in 0..6u8,
        summary in hostile_text(),
        version in bad_schema_version(),
        other_lease in lease_ref(),
    ) {
        let mut wire = v1::TaskComplete {
            schema_version: 1,
            worker_id: batch.worker_id.clone(),
            lease: batch.lease.clone(),
            batch_count: batch.sequence_number + 1,
            summary,
            final_batch: Some(batch),
            lease_next: false,
        };
        let subject_worker = wire.worker_id.clone();
        let expected = match fault {
            0 => None,
            1 => { wire.schema_version = version; Some(ErrorCode::UnsupportedSchemaVersion) }
            2 => { wire.batch_count = BATCH_SEQUENCE_MAX + 2; Some(ErrorCode::SequenceOutOfRange) }
            3 => { wire.lease = Some(other_lease); Some(ErrorCode::InvalidField) }
            4 => {
                prop_assume!(wire.batch_count <= BATCH_SEQUENCE_MAX);
                wire.batch_count += 1;
                Some(ErrorCode::InvalidField)
            }
            _ => { wire.final_batch.as_mut().unwrap().payload.push(0); Some(ErrorCode::ChecksumMismatch) }
        };
        let result = parse_on(WorkerVerb::Complete, Some(&subject_worker), &wire.encode_to_vec());
        prop_assert_eq!(code(&result), expected, "{:?}", result);
        if let Ok(WorkerMessage::Complete { summary, final_batch, .. }) = result {
            prop_assert!(!summary.contains('\0') && summary.chars().count() <= TEXT_CHARS_MAX);
            prop_assert!(final_batch.is_some());
        }
    }

    /// A failure's code is refused when too long or with NUL; its message is cleaned.
    #[test]
    fn hostile_failure_gets_its_code(
        worker in uuid_text(),
        lease in lease_ref(),
        error_code in prop_oneof![Just(String::new()), "[a-z_]{1,128}", bad_bounded_text(IDENTIFIER_BYTES_MAX)],
        message in hostile_text(),
    ) {
        let wire = v1::TaskFail {
            schema_version: 1,
            worker_id: worker.clone(),
            lease: Some(lease),
            error: Some(v1::Error { code: error_code.clone(), message, ..Default::default() }),
            retryable: true,
        };
        let result = parse_on(WorkerVerb::Fail, Some(&worker), &wire.encode_to_vec());
        let bad = error_code.len() > IDENTIFIER_BYTES_MAX || error_code.contains('\0');
        prop_assert_eq!(code(&result), bad.then_some(ErrorCode::InvalidField));
        if let Ok(WorkerMessage::Fail { error_code: kept, error_message, .. }) = result {
            prop_assert_eq!(kept, if error_code.is_empty() { "plugin_failed".to_owned() } else { error_code });
            prop_assert!(!error_message.contains('\0') && error_message.chars().count() <= TEXT_CHARS_MAX);
        }
    }
}

/// Regression: a results subject whose worker token is no token (empty, `{x}`) used to give
/// an ack address naming it, and `Subjects::worker` then failed its debug assertion building
/// the ack subject (a panic in a debug build; in a release build, an ack on a subject no
/// worker has). `hostile_bytes_get_a_documented_code` found the empty token; its seed is in
/// `proptest-regressions/parse/hostile.txt`.
#[test]
fn hostile_a_worker_token_that_is_no_token_gets_no_ack_address() {
    let subjects = Subjects::new("p").unwrap();
    for subject in [
        "p.v1.worker..result",
        "p.v1.worker.{x}.result",
        "p.v1.worker.a:b.result",
    ] {
        let (address, result) = parse(
            Some(WorkerVerb::Result),
            subjects.worker_id_of(subject),
            b"",
            &LIMITS,
        );
        if let Some(worker_id) = &address.worker_id {
            // What `answer` does with it.
            let _ = subjects.worker(worker_id, WorkerVerb::Ack);
        }
        assert_eq!(address.worker_id, None, "{subject}");
        assert!(result.is_err());
    }
}

/// A payload of a megabyte of empty findings is `too_large` without holding them.
#[test]
fn hostile_a_million_empty_findings_are_too_large() {
    let worker = Uuid::nil().to_string();
    let payload = v1::BatchPayload {
        findings: vec![v1::Finding::default(); 500_000],
        ..Default::default()
    };
    let lease = v1::LeaseRef {
        task_id: worker.clone(),
        attempt_id: worker.clone(),
        attempt_number: 1,
        lease_token: "t".into(),
    };
    let wire = batch(worker.clone(), lease, &payload);
    let (_, result) = parse(
        Some(WorkerVerb::Result),
        Some(&worker),
        &wire.encode_to_vec(),
        &BatchLimits::default(),
    );
    assert_eq!(code(&result), Some(ErrorCode::TooLarge));
}
