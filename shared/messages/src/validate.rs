//! Checks every receiver applies to every message, with the refusal the sender gets.

use uuid::Uuid;

use crate::{ErrorCode, SCHEMA_VERSION, v1};

/// `invalid_field` with `message`.
pub fn invalid(message: impl Into<String>) -> v1::Error {
    v1::Error::new(ErrorCode::InvalidField, message)
}

/// `malformed_message` for bytes that are not a `kind`.
pub fn malformed(kind: &str, error: prost::DecodeError) -> v1::Error {
    v1::Error::new(
        ErrorCode::MalformedMessage,
        format!("not a palisade.v1.{kind}: {error}"),
    )
}

/// The only schema version this build reads.
pub fn schema_version(version: u32) -> Result<(), v1::Error> {
    if version == SCHEMA_VERSION {
        return Ok(());
    }
    Err(v1::Error::new(
        ErrorCode::UnsupportedSchemaVersion,
        format!("schema_version {version} is not supported; send {SCHEMA_VERSION}"),
    ))
}

/// The worker a message claims to come from: the `worker_id` field must equal the subject's
/// worker token (so NATS permissions on subjects confine what a credential can claim) and be
/// a UUID.
pub fn worker_id(subject_worker: Option<&str>, field: &str) -> Result<Uuid, v1::Error> {
    if subject_worker != Some(field) {
        return Err(invalid(format!(
            "worker_id {field:?} does not match the subject's worker id {subject_worker:?}"
        )));
    }
    Uuid::parse_str(field).map_err(|_| invalid(format!("worker_id {field:?} is not a UUID")))
}

/// The client a message claims to come from: its subject must be a client subject whose
/// organization token is `organization_id` (in any spelling of the UUID) and whose client token
/// is `client_id`, so NATS permissions on subjects confine what a client credential can claim.
pub fn client_subject(
    subjects: &crate::Subjects,
    subject: &str,
    organization_id: &Uuid,
    client_id: &str,
) -> Result<(), v1::Error> {
    let Some(tokens) = subjects.client_of(subject) else {
        return Err(invalid(format!("{subject:?} is not a client subject")));
    };
    if Uuid::parse_str(tokens.organization_id).ok() != Some(*organization_id) {
        return Err(invalid(format!(
            "organization_id {organization_id} does not match the subject's organization {:?}",
            tokens.organization_id
        )));
    }
    if tokens.client_id != client_id {
        return Err(invalid(format!(
            "client_id {client_id:?} does not match the subject's client id {:?}",
            tokens.client_id
        )));
    }
    Ok(())
}

/// A CVE id as NVD spells it: `CVE-`, a four-digit year, `-`, 4 to 7 digits
/// (`CVE-2024-12345`). Ingestion refuses a finding whose `cve_ids` hold anything else, and
/// plugins use this to pick the CVE ids out of an advisory's aliases.
pub fn is_cve_id(text: &str) -> bool {
    let mut parts = text.split('-');
    matches!(
        (parts.next(), parts.next(), parts.next(), parts.next()),
        (Some("CVE"), Some(year), Some(number), None)
            if year.len() == 4 && year.bytes().all(|b| b.is_ascii_digit())
            && (4..=7).contains(&number.len()) && number.bytes().all(|b| b.is_ascii_digit())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cve_ids_are_checked() {
        assert!(is_cve_id("CVE-2024-12345"));
        assert!(is_cve_id("CVE-2099-0001"));
        assert!(!is_cve_id("CVE-24-1"));
        assert!(!is_cve_id("cve-2024-1234"));
        assert!(!is_cve_id("CVE-2024-123"));
        assert!(!is_cve_id("CVE-2024-12345678"));
        assert!(!is_cve_id("GHSA-xxxx-xxxx-xxxx"));
    }

    #[test]
    fn worker_id_must_match_the_subject_and_be_a_uuid() {
        let id = Uuid::new_v4().to_string();
        assert!(worker_id(Some(&id), &id).is_ok());
        assert!(worker_id(Some("other"), &id).is_err());
        assert!(worker_id(None, &id).is_err());
        assert!(worker_id(Some("nope"), "nope").is_err());
    }

    #[test]
    fn a_client_message_must_match_its_subject() {
        let subjects = crate::Subjects::new("p").unwrap();
        let organization = Uuid::now_v7();
        let subject = subjects
            .client(&organization, "ci", crate::ClientVerb::Submit)
            .unwrap();
        assert!(client_subject(&subjects, &subject, &organization, "ci").is_ok());
        assert!(client_subject(&subjects, &subject, &Uuid::now_v7(), "ci").is_err());
        assert!(client_subject(&subjects, &subject, &organization, "other").is_err());
        assert!(client_subject(&subjects, "p.v1.event.task.ready", &organization, "ci").is_err());
    }

    #[test]
    fn only_schema_version_one_is_read() {
        assert!(schema_version(1).is_ok());
        assert_eq!(
            schema_version(2).unwrap_err().error_code(),
            Some(ErrorCode::UnsupportedSchemaVersion)
        );
    }

    mod hostile {
        use super::*;
        use crate::testing::{cases, hostile_text, token_text, uuid_text};
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(cases(512))]

            /// A worker id is accepted exactly when it is the subject's token and a UUID;
            /// every refusal is `invalid_field`.
            #[test]
            fn hostile_worker_id_is_the_subjects_and_a_uuid(
                subject_worker in proptest::option::of(prop_oneof![uuid_text(), token_text(), hostile_text()]),
                field in prop_oneof![uuid_text(), token_text(), hostile_text()],
                same in any::<bool>(),
            ) {
                let subject_worker = if same { Some(field.clone()) } else { subject_worker };
                match worker_id(subject_worker.as_deref(), &field) {
                    Ok(id) => {
                        prop_assert_eq!(subject_worker.as_deref(), Some(field.as_str()));
                        prop_assert_eq!(Ok(id), Uuid::parse_str(&field));
                    }
                    Err(error) => {
                        prop_assert_eq!(error.error_code(), Some(ErrorCode::InvalidField));
                        prop_assert!(
                            subject_worker.as_deref() != Some(field.as_str())
                                || Uuid::parse_str(&field).is_err()
                        );
                    }
                }
            }

            /// A client subject check never panics, and refuses with `invalid_field`.
            #[test]
            fn hostile_client_subject_refuses_with_invalid_field(
                subject in prop_oneof![hostile_text(), token_text()],
                organization in any::<u128>(),
                client_id in prop_oneof![token_text(), hostile_text()],
            ) {
                let subjects = crate::Subjects::new("p").unwrap();
                let organization = Uuid::from_u128(organization);
                for subject in [format!("p.v1.org.{organization}.client.{subject}.submit"), subject] {
                    if let Err(error) = client_subject(&subjects, &subject, &organization, &client_id) {
                        prop_assert_eq!(error.error_code(), Some(ErrorCode::InvalidField));
                    }
                }
            }
        }
    }
}
