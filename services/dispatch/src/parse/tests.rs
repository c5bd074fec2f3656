//! Hostile-input property tests of dispatch's parsers: arbitrary bytes, and well-formed
//! requests with one field made bad, each refused with the code reference 6 gives it.

use super::*;
use messages::testing::{
    any_bytes, bad_bounded_text, bad_lease_ref, bad_schema_version, cases, hostile_text, lease_ref,
    not_a_uuid, token_text, uuid_text,
};
use proptest::collection::vec;
use proptest::prelude::*;

const PROPERTY_CASES: u32 = 256;

fn code(result: Result<impl std::fmt::Debug, v1::Error>) -> Option<ErrorCode> {
    result.err().map(|error| {
        error
            .error_code()
            .unwrap_or_else(|| panic!("unknown code {:?}", error.code))
    })
}

fn enroll_request() -> impl Strategy<Value = v1::EnrollRequest> {
    (
        uuid_text(),
        uuid_text(),
        "[A-Za-z0-9_-]{1,128}",
        vec(uuid_text(), 0..4),
        vec("[a-z0-9_-]{1,128}", 0..8),
    )
        .prop_map(
            |(worker_id, token_id, secret, organization_ids, capabilities)| v1::EnrollRequest {
                schema_version: messages::SCHEMA_VERSION,
                worker_id,
                token_id,
                secret,
                public_key: nkeys::KeyPair::new_user().public_key(),
                organization_ids,
                capabilities,
            },
        )
}

fn hello_request() -> impl Strategy<Value = v1::HelloRequest> {
    (
        uuid_text(),
        "[ -~]{0,128}",
        1..=WORKER_CAPACITY_MAX,
        vec("[a-z0-9_-]{1,128}", 0..8),
    )
        .prop_map(
            |(worker_id, software_version, capacity, capabilities)| v1::HelloRequest {
                schema_version: 1,
                worker_id,
                software_version,
                protocol_version: messages::PROTOCOL_VERSION.into(),
                capabilities,
                capacity,
                rules: Vec::new(),
            },
        )
}

fn acquire_request() -> impl Strategy<Value = v1::AcquireRequest> {
    (
        uuid_text(),
        uuid_text(),
        1..=ACQUIRE_TASKS_MAX,
        0..=ACQUIRE_WAIT_MS_MAX,
    )
        .prop_map(
            |(worker_id, request_id, max_tasks, wait_ms)| v1::AcquireRequest {
                schema_version: 1,
                worker_id,
                request_id,
                max_tasks,
                wait_ms,
            },
        )
}

fn renew_request() -> impl Strategy<Value = v1::RenewRequest> {
    (uuid_text(), lease_ref(), vec(lease_ref(), 0..4)).prop_map(
        |(worker_id, lease, more_leases)| v1::RenewRequest {
            schema_version: 1,
            worker_id,
            lease: Some(lease),
            more_leases,
        },
    )
}

fn release_request() -> impl Strategy<Value = v1::ReleaseRequest> {
    (uuid_text(), lease_ref(), hostile_text()).prop_map(|(worker_id, lease, reason)| {
        v1::ReleaseRequest {
            schema_version: 1,
            worker_id,
            lease: Some(lease),
            reason,
        }
    })
}

fn cancel_request() -> impl Strategy<Value = v1::CancelRequest> {
    (uuid_text(), any::<bool>(), "[ -~]{0,512}").prop_map(|(id, scan, reason)| v1::CancelRequest {
        schema_version: 1,
        scan_id: if scan { id.clone() } else { String::new() },
        task_id: if scan { String::new() } else { id },
        reason,
    })
}

/// A worker id field that is not the subject's token, or is it but not a UUID.
fn bad_worker_id() -> impl Strategy<Value = (Option<String>, String)> {
    prop_oneof![
        // Not the subject's.
        (uuid_text(), uuid_text()).prop_map(|(subject, field)| (Some(subject), field)),
        uuid_text().prop_map(|field| (None, field)),
        // The subject's, but no UUID.
        token_text()
            .prop_filter("not a UUID", |t| Uuid::parse_str(t).is_err())
            .prop_map(|token| (Some(token.clone()), token)),
    ]
}

fn subjects() -> Subjects {
    Subjects::new("p").unwrap()
}

proptest! {
    #![proptest_config(cases(PROPERTY_CASES))]

    /// Any bytes on any verb: no panic, and a refusal has a code its verb can send.
    #[test]
    fn hostile_bytes_get_a_documented_code(bytes in any_bytes(), worker in uuid_text()) {
        use ErrorCode::*;
        let subject_worker = Some(worker.as_str());
        let request = [MalformedMessage, UnsupportedSchemaVersion, InvalidField];
        prop_assert!(code(hello(subject_worker, &bytes)).is_none_or(|c| request.contains(&c)));
        prop_assert!(code(acquire(subject_worker, &bytes)).is_none_or(|c| request.contains(&c)));
        prop_assert!(code(release(subject_worker, &bytes)).is_none_or(|c| request.contains(&c)));
        prop_assert!(code(renew(subject_worker, &bytes)).is_none_or(|c| request.contains(&c) || c == TooLarge));
        let subject = format!("p.v1.org.{worker}.client.ci.cancel");
        prop_assert!(code(cancel(&subjects(), &subject, &bytes)).is_none_or(|c| request.contains(&c)));
        prop_assert!(code(enroll(subject_worker, &bytes)).is_none_or(|c| request.contains(&c)));
        prop_assert!(code(credentials(subject_worker, &bytes)).is_none_or(|c| request.contains(&c)));
    }

    #[test]
    fn hostile_valid_enroll_is_accepted_as_sent(request in enroll_request()) {
        let enroll = enroll(Some(&request.worker_id), &request.encode_to_vec()).unwrap();
        prop_assert_eq!(enroll.worker_id.to_string(), request.worker_id);
        prop_assert_eq!(enroll.token_id.to_string(), request.token_id);
        prop_assert_eq!(enroll.secret_sha256, identity::enrollment::secret_digest(&request.secret));
        prop_assert_eq!(enroll.public_key, request.public_key);
        prop_assert_eq!(enroll.capabilities, request.capabilities);
        let organizations: Vec<String> =
            enroll.organization_ids.iter().map(Uuid::to_string).collect();
        prop_assert_eq!(organizations, request.organization_ids);
    }

    #[test]
    fn hostile_enroll_fault_gets_its_code(
        mut request in enroll_request(),
        fault in 0..6_usize,
        junk in hostile_text(),
    ) {
        let subject_worker = request.worker_id.clone();
        let expected = match fault {
            0 => { request.schema_version = 2; ErrorCode::UnsupportedSchemaVersion }
            1 => { request.token_id = format!("{junk}!"); ErrorCode::InvalidField }
            2 => { request.secret = String::new(); ErrorCode::InvalidField }
            3 => { request.public_key = format!("U{junk}"); ErrorCode::InvalidField }
            4 => { request.organization_ids.push(format!("{junk}?")); ErrorCode::InvalidField }
            _ => { request.capabilities.push(String::new()); ErrorCode::InvalidField }
        };
        prop_assert_eq!(
            code(enroll(Some(&subject_worker), &request.encode_to_vec())),
            Some(expected)
        );
    }

    #[test]
    fn hostile_credentials_need_a_user_key_of_the_subjects_worker(
        worker in uuid_text(),
        other in uuid_text(),
        junk in hostile_text(),
    ) {
        let key = nkeys::KeyPair::new_user().public_key();
        let request = |worker_id: &str, public_key: &str| v1::CredentialsRequest {
            schema_version: messages::SCHEMA_VERSION,
            worker_id: worker_id.to_owned(),
            public_key: public_key.to_owned(),
        }
        .encode_to_vec();
        prop_assert!(credentials(Some(&worker), &request(&worker, &key)).is_ok());
        prop_assert_eq!(code(credentials(Some(&worker), &request(&worker, &junk))), Some(ErrorCode::InvalidField));
        if other != worker {
            prop_assert_eq!(code(credentials(Some(&other), &request(&worker, &key))), Some(ErrorCode::InvalidField));
        }
    }

    #[test]
    fn hostile_valid_hello_is_accepted_as_sent(request in hello_request()) {
        let hello = hello(Some(&request.worker_id), &request.encode_to_vec()).unwrap();
        prop_assert_eq!(hello.worker_id.to_string(), request.worker_id);
        prop_assert_eq!(hello.capabilities, request.capabilities);
        prop_assert_eq!(hello.software_version, request.software_version);
        prop_assert_eq!(hello.capacity as u32, request.capacity);
    }

    #[test]
    fn hostile_hello_fault_gets_its_code(
        mut request in hello_request(),
        fault in 0..8u8,
        version in bad_schema_version(),
        (subject_worker, worker_field) in bad_worker_id(),
        text in hostile_text(),
        bad in bad_bounded_text(IDENTIFIER_BYTES_MAX),
        capacity in prop_oneof![Just(0), WORKER_CAPACITY_MAX + 1..=u32::MAX],
    ) {
        let mut subject = Some(request.worker_id.clone());
        let expected = match fault {
            0 => { request.schema_version = version; ErrorCode::UnsupportedSchemaVersion }
            1 => { subject = subject_worker; request.worker_id = worker_field; ErrorCode::InvalidField }
            2 => {
                prop_assume!(text != messages::PROTOCOL_VERSION);
                request.protocol_version = text;
                ErrorCode::UnsupportedSchemaVersion
            }
            3 => {
                prop_assume!(!bad.is_empty());
                request.software_version = bad;
                ErrorCode::InvalidField
            }
            4 => { request.capacity = capacity; ErrorCode::InvalidField }
            5 => { request.capabilities.push(bad); ErrorCode::InvalidField }
            6 => {
                request.capabilities = vec!["c".into(); WORKER_CAPABILITIES_MAX + 1];
                ErrorCode::InvalidField
            }
            _ => {
                // Far more (empty) capabilities than accepted: counted, not held.
                request.capabilities = vec![String::new(); 20_000];
                ErrorCode::InvalidField
            }
        };
        let got = code(hello(subject.as_deref(), &request.encode_to_vec()));
        prop_assert_eq!(got, Some(expected));
    }

    #[test]
    fn hostile_valid_acquire_is_accepted_as_sent(request in acquire_request()) {
        let acquire = acquire(Some(&request.worker_id), &request.encode_to_vec()).unwrap();
        prop_assert_eq!(acquire.request_id.to_string(), request.request_id);
        prop_assert_eq!((acquire.max_tasks, acquire.wait_ms), (request.max_tasks, request.wait_ms));
    }

    #[test]
    fn hostile_acquire_fault_gets_its_code(
        mut request in acquire_request(),
        fault in 0..5u8,
        version in bad_schema_version(),
        (subject_worker, worker_field) in bad_worker_id(),
        not_uuid in not_a_uuid(),
        max_tasks in prop_oneof![Just(0), ACQUIRE_TASKS_MAX + 1..=u32::MAX],
        wait_ms in ACQUIRE_WAIT_MS_MAX + 1..=u32::MAX,
    ) {
        let mut subject = Some(request.worker_id.clone());
        let expected = match fault {
            0 => { request.schema_version = version; ErrorCode::UnsupportedSchemaVersion }
            1 => { subject = subject_worker; request.worker_id = worker_field; ErrorCode::InvalidField }
            2 => { request.request_id = not_uuid; ErrorCode::InvalidField }
            3 => { request.max_tasks = max_tasks; ErrorCode::InvalidField }
            _ => { request.wait_ms = wait_ms; ErrorCode::InvalidField }
        };
        prop_assert_eq!(code(acquire(subject.as_deref(), &request.encode_to_vec())), Some(expected));
    }

    #[test]
    fn hostile_valid_renew_is_accepted_in_order(request in renew_request()) {
        let renew = renew(Some(&request.worker_id), &request.encode_to_vec()).unwrap();
        let named: Vec<String> = request.lease.iter().chain(&request.more_leases)
            .map(|lease| lease.attempt_id.clone()).collect();
        let claimed: Vec<String> = renew.claims.claims().iter()
            .map(|claim| claim.attempt_id.to_string()).collect();
        prop_assert_eq!(claimed, named);
        prop_assert_eq!(renew.batch, !request.more_leases.is_empty());
    }

    #[test]
    fn hostile_renew_fault_gets_its_code(
        mut request in renew_request(),
        fault in 0..7u8,
        version in bad_schema_version(),
        (subject_worker, worker_field) in bad_worker_id(),
        bad_lease in bad_lease_ref(),
        extra in 0..5_000usize,
    ) {
        let mut subject = Some(request.worker_id.clone());
        let expected = match fault {
            0 => { request.schema_version = version; ErrorCode::UnsupportedSchemaVersion }
            1 => { subject = subject_worker; request.worker_id = worker_field; ErrorCode::InvalidField }
            2 => { request.lease = Some(bad_lease); ErrorCode::InvalidField }
            3 => { request.lease = None; ErrorCode::InvalidField }
            4 => { request.more_leases.push(bad_lease); ErrorCode::InvalidField }
            5 => {
                let twice = request.lease.clone().unwrap();
                request.more_leases.push(twice);
                ErrorCode::InvalidField
            }
            _ => {
                // Over the limit, even with (empty, invalid) leases: the count is checked first.
                let over = RENEW_LEASES_MAX - request.more_leases.len() + extra;
                request.more_leases.extend(std::iter::repeat_n(v1::LeaseRef::default(), over));
                ErrorCode::TooLarge
            }
        };
        prop_assert_eq!(code(renew(subject.as_deref(), &request.encode_to_vec())), Some(expected));
    }

    #[test]
    fn hostile_valid_release_keeps_a_clean_reason(request in release_request()) {
        let release = release(Some(&request.worker_id), &request.encode_to_vec()).unwrap();
        prop_assert!(!release.reason.contains('\0'));
        prop_assert!(release.reason.chars().count() <= REASON_MAX);
        let lease = request.lease.unwrap();
        prop_assert_eq!(release.claim.attempt_id.to_string(), lease.attempt_id);
        prop_assert_eq!(release.claim.lease_token, lease.lease_token);
    }

    #[test]
    fn hostile_release_fault_gets_its_code(
        mut request in release_request(),
        fault in 0..4u8,
        version in bad_schema_version(),
        (subject_worker, worker_field) in bad_worker_id(),
        bad_lease in bad_lease_ref(),
    ) {
        let mut subject = Some(request.worker_id.clone());
        let expected = match fault {
            0 => { request.schema_version = version; ErrorCode::UnsupportedSchemaVersion }
            1 => { subject = subject_worker; request.worker_id = worker_field; ErrorCode::InvalidField }
            2 => { request.lease = Some(bad_lease); ErrorCode::InvalidField }
            _ => { request.lease = None; ErrorCode::InvalidField }
        };
        prop_assert_eq!(code(release(subject.as_deref(), &request.encode_to_vec())), Some(expected));
    }

    #[test]
    fn hostile_valid_cancel_is_accepted_for_the_subjects_organization(
        request in cancel_request(),
        organization in any::<u128>(),
        client_id in token_text(),
    ) {
        let organization = Uuid::from_u128(organization);
        let subject = subjects().client(&organization, &client_id, messages::ClientVerb::Cancel).unwrap();
        let cancel = cancel(&subjects(), &subject, &request.encode_to_vec()).unwrap();
        prop_assert_eq!(cancel.organization_id, organization);
        let id = match cancel.target { CancelTarget::Scan(id) | CancelTarget::Task(id) => id.to_string() };
        prop_assert_eq!(id, format!("{}{}", request.scan_id, request.task_id));
        prop_assert!(!cancel.reason.is_empty());
    }

    #[test]
    fn hostile_cancel_fault_gets_its_code(
        mut request in cancel_request(),
        fault in 0..6u8,
        version in bad_schema_version(),
        not_uuid in not_a_uuid().prop_filter("set", |text| !text.is_empty()),
        other_id in uuid_text(),
        organization_token in prop_oneof![token_text(), hostile_text()],
        reason in bad_bounded_text(REASON_MAX).prop_filter("not empty", |text| !text.is_empty()),
    ) {
        let organization = Uuid::now_v7();
        let mut subject = subjects().client(&organization, "ci", messages::ClientVerb::Cancel).unwrap();
        let expected = match fault {
            0 => { request.schema_version = version; ErrorCode::UnsupportedSchemaVersion }
            1 => {
                prop_assume!(Uuid::parse_str(&organization_token).is_err());
                subject = format!("p.v1.org.{organization_token}.client.ci.cancel");
                ErrorCode::InvalidField
            }
            2 => { request.scan_id = other_id; request.task_id = not_uuid; ErrorCode::InvalidField }
            3 => { request.scan_id.clear(); request.task_id.clear(); ErrorCode::InvalidField }
            4 => {
                if request.scan_id.is_empty() { request.task_id = not_uuid } else { request.scan_id = not_uuid }
                ErrorCode::InvalidField
            }
            _ => { request.reason = reason; ErrorCode::InvalidField }
        };
        prop_assert_eq!(code(cancel(&subjects(), &subject, &request.encode_to_vec())), Some(expected));
    }
}

#[test]
fn hostile_a_renew_naming_half_a_million_leases_is_too_large() {
    let request = v1::RenewRequest {
        schema_version: 1,
        worker_id: Uuid::nil().to_string(),
        lease: Some(v1::LeaseRef {
            task_id: Uuid::nil().to_string(),
            attempt_id: Uuid::nil().to_string(),
            attempt_number: 1,
            lease_token: "t".into(),
        }),
        more_leases: vec![v1::LeaseRef::default(); 500_000],
    };
    let bytes = request.encode_to_vec();
    let subject_worker = Uuid::nil().to_string();
    assert_eq!(
        code(renew(Some(&subject_worker), &bytes)),
        Some(ErrorCode::TooLarge)
    );
}
