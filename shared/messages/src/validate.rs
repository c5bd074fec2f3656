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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_id_must_match_the_subject_and_be_a_uuid() {
        let id = Uuid::new_v4().to_string();
        assert!(worker_id(Some(&id), &id).is_ok());
        assert!(worker_id(Some("other"), &id).is_err());
        assert!(worker_id(None, &id).is_err());
        assert!(worker_id(Some("nope"), "nope").is_err());
    }

    #[test]
    fn only_schema_version_one_is_read() {
        assert!(schema_version(1).is_ok());
        assert_eq!(
            schema_version(2).unwrap_err().error_code(),
            Some(ErrorCode::UnsupportedSchemaVersion)
        );
    }
}
