//! Requests for a scan's enrichment, on `<prefix>.v1.org.<organization_id>.client.<client_id>.enrich`
//! (request/reply), and the one answer shape they and `palisade scan enrich` give.

use messages::validate::{invalid, malformed, schema_version};
use messages::{ErrorCode, Subjects, v1};
use prost::Message as _;
use store::enrichment::RequestOutcome;
use uuid::Uuid;

/// A request whose fields have their documented form: the organization is the subject's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnrichRequest {
    pub organization_id: Uuid,
    pub scan_id: Uuid,
}

/// Decodes and validates the request published on `subject`; the error is the answer.
pub fn parse(subjects: &Subjects, subject: &str, bytes: &[u8]) -> Result<EnrichRequest, v1::Error> {
    let request =
        v1::EnrichRequest::decode(bytes).map_err(|error| malformed("EnrichRequest", error))?;
    schema_version(request.schema_version)?;
    let organization_id = subjects
        .client_of(subject)
        .and_then(|tokens| Uuid::parse_str(tokens.organization_id).ok())
        .ok_or_else(|| {
            invalid(format!(
                "{subject:?} names no organization: ask on <prefix>.v1.org.<organization_id>.client.<client_id>.enrich"
            ))
        })?;
    let scan_id = Uuid::parse_str(&request.scan_id)
        .map_err(|_| invalid(format!("scan_id {:?} is not a UUID", request.scan_id)))?;
    Ok(EnrichRequest {
        organization_id,
        scan_id,
    })
}

/// The answer to a request that `outcome` decided.
pub fn reply(scan_id: Uuid, outcome: &RequestOutcome) -> v1::EnrichReply {
    use store::states::EnrichmentJobState as State;
    let answer = |job_id: &Uuid, status: State, message: String| v1::EnrichReply {
        error: None,
        scan_id: scan_id.to_string(),
        job_id: job_id.to_string(),
        status: status.as_str().into(),
        outcome: outcome.name().into(),
        message,
    };
    let refuse = |error: v1::Error| v1::EnrichReply {
        error: Some(error),
        scan_id: scan_id.to_string(),
        ..Default::default()
    };
    match outcome {
        RequestOutcome::Created { job_id } => answer(
            job_id,
            State::Pending,
            "the scan had no enrichment job; one was queued".into(),
        ),
        RequestOutcome::Requeued { job_id } => answer(
            job_id,
            State::Pending,
            "the failed enrichment job was queued again with a fresh retry budget; it resumes from its checkpoint".into(),
        ),
        RequestOutcome::Active { job_id, state } => answer(
            job_id,
            *state,
            format!("the enrichment job is already {state}; nothing was changed"),
        ),
        RequestOutcome::Completed { job_id } => answer(
            job_id,
            State::Completed,
            "enrichment already completed; nothing was restarted".into(),
        ),
        RequestOutcome::NotFound => refuse(v1::Error::new(ErrorCode::NotFound, "no such scan")),
        RequestOutcome::NotCompleted { scan_state } => refuse(v1::Error::new(
            ErrorCode::ScanNotCompleted,
            format!("the scan is {scan_state}: only a completed scan is enriched"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    mod hostile {
        use super::*;
        use messages::testing::{
            any_bytes, bad_schema_version, cases, hostile_text, not_a_uuid, uuid_text,
        };
        use proptest::prelude::*;

        fn subject(organization: &Uuid) -> String {
            Subjects::new("p")
                .unwrap()
                .client(organization, "c", messages::ClientVerb::Enrich)
                .unwrap()
        }

        proptest! {
            #![proptest_config(cases(256))]

            /// Any bytes on any subject: no panic, and only the refusals reference 6.12 lists
            /// before the decision.
            #[test]
            fn hostile_enrich_bytes_get_a_documented_code(bytes in any_bytes(), subject in hostile_text()) {
                let subjects = Subjects::new("p").unwrap();
                if let Err(error) = parse(&subjects, &subject, &bytes) {
                    use ErrorCode::*;
                    let code = error.error_code().expect("a known code");
                    prop_assert!([MalformedMessage, UnsupportedSchemaVersion, InvalidField].contains(&code), "{code:?}");
                }
            }

            /// A well-formed request on its organization's subject is read as sent; one bad
            /// field gets its code.
            #[test]
            fn hostile_enrich_request_fault_gets_its_code(
                organization in uuid_text(),
                scan in uuid_text(),
                fault in 0..3u8,
                version in bad_schema_version(),
                not_uuid in not_a_uuid(),
            ) {
                let subjects = Subjects::new("p").unwrap();
                let organization_id = Uuid::parse_str(&organization).unwrap();
                let mut request = v1::EnrichRequest { schema_version: 1, scan_id: scan.clone() };
                let on = subject(&organization_id);
                let valid = parse(&subjects, &on, &request.encode_to_vec()).unwrap();
                prop_assert_eq!(valid, EnrichRequest { organization_id, scan_id: Uuid::parse_str(&scan).unwrap() });
                let (subject, expected) = match fault {
                    0 => { request.schema_version = version; (on, ErrorCode::UnsupportedSchemaVersion) }
                    1 => { request.scan_id = not_uuid; (on, ErrorCode::InvalidField) }
                    _ => (on.replace(&organization, "not-an-org"), ErrorCode::InvalidField),
                };
                let error = parse(&subjects, &subject, &request.encode_to_vec()).unwrap_err();
                prop_assert_eq!(error.error_code(), Some(expected));
            }
        }
    }
}
