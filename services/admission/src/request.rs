//! Parsing a scan request off the wire into a request admission can act on.

use messages::limits::{
    EXECUTION_DEADLINE_SECONDS_MAX, IDENTIFIER_BYTES_MAX, PRIORITY_ABS_MAX, PROFILE_PLUGINS_MAX,
    SCAN_REQUEST_BYTES_MAX, TARGET_BYTES_MAX,
};
use messages::{ErrorCode, Subjects, v1};
use prost::Message as _;
use uuid::Uuid;

/// A scan request whose every field has its documented form.
#[derive(Debug, Clone)]
pub struct ValidScanRequest {
    pub organization_id: Uuid,
    pub target: String,
    pub plugins: Vec<String>,
    pub priority: i32,
    pub execution_deadline_seconds: Option<i32>,
    pub client_id: String,
    pub idempotency_key: String,
    pub fingerprint: String,
}

impl ValidScanRequest {
    /// What the admission script decides for this request.
    pub fn params<'a>(
        &'a self,
        max_attempts: i32,
        trace_context: Option<&'a str>,
    ) -> store::admit::AdmitParams<'a> {
        store::admit::AdmitParams {
            organization_id: self.organization_id,
            target: &self.target,
            plugins: &self.plugins,
            priority: self.priority,
            execution_deadline_seconds: self.execution_deadline_seconds,
            client_id: &self.client_id,
            idempotency_key: &self.idempotency_key,
            fingerprint: &self.fingerprint,
            max_attempts,
            trace_context,
        }
    }
}

/// Decodes and validates; the error is what the sender gets back. `wire` is returned too so
/// a refusal can name the client and key when the message decoded at all.
/// Decodes and validates the request published on `subject`, whose organization and client
/// tokens must be the request's own.
pub fn parse(
    subjects: &Subjects,
    subject: &str,
    bytes: &[u8],
) -> (Option<v1::ScanRequest>, Result<ValidScanRequest, v1::Error>) {
    match v1::ScanRequest::decode(bytes) {
        // Counted on the bytes, so fields this version does not know count too.
        Ok(wire) if bytes.len() > SCAN_REQUEST_BYTES_MAX => {
            let error = v1::Error::new(
                ErrorCode::TooLarge,
                format!(
                    "scan request is {} bytes, at most {SCAN_REQUEST_BYTES_MAX} are allowed \
                     (fields unknown to palisade count too)",
                    bytes.len()
                ),
            );
            (Some(wire), Err(error))
        }
        Ok(wire) => {
            let valid = validate(&wire).and_then(|valid| {
                messages::validate::client_subject(
                    subjects,
                    subject,
                    &valid.organization_id,
                    &valid.client_id,
                )?;
                Ok(valid)
            });
            (Some(wire), valid)
        }
        Err(error) => (
            None,
            Err(v1::Error::new(
                ErrorCode::MalformedMessage,
                format!("not a palisade.v1.ScanRequest: {error}"),
            )),
        ),
    }
}

fn invalid(message: impl Into<String>) -> v1::Error {
    v1::Error::new(ErrorCode::InvalidField, message)
}

/// Checks every field of `wire`.
pub fn validate(wire: &v1::ScanRequest) -> Result<ValidScanRequest, v1::Error> {
    if wire.schema_version != messages::SCHEMA_VERSION {
        return Err(v1::Error::new(
            ErrorCode::UnsupportedSchemaVersion,
            format!(
                "schema_version {} is not supported; send {}",
                wire.schema_version,
                messages::SCHEMA_VERSION
            ),
        ));
    }
    let organization_id = Uuid::parse_str(&wire.organization_id).map_err(|_| {
        invalid(format!(
            "organization_id {:?} is not a UUID",
            wire.organization_id
        ))
    })?;
    if wire.target.is_empty() || wire.target.chars().any(char::is_control) {
        return Err(invalid(
            "target must be non-empty text without control characters",
        ));
    }
    if wire.target.len() > TARGET_BYTES_MAX {
        return Err(v1::Error::new(
            ErrorCode::TooLarge,
            format!(
                "target is {} bytes, at most {TARGET_BYTES_MAX} are allowed",
                wire.target.len()
            ),
        ));
    }
    if wire.plugins.is_empty() {
        return Err(invalid("plugins must name at least one plugin"));
    }
    if wire.plugins.len() > PROFILE_PLUGINS_MAX {
        return Err(v1::Error::new(
            ErrorCode::TooLarge,
            format!(
                "{} plugins in the profile, at most {PROFILE_PLUGINS_MAX}",
                wire.plugins.len()
            ),
        ));
    }
    for (index, plugin) in wire.plugins.iter().enumerate() {
        if wire.plugins[..index].contains(plugin) {
            return Err(invalid(format!(
                "plugin {plugin:?} appears twice in the profile"
            )));
        }
        if !is_identifier(plugin) {
            return Err(invalid(format!(
                "plugin name {plugin:?} must be 1..={IDENTIFIER_BYTES_MAX} characters of [a-z0-9_-]"
            )));
        }
    }
    if !(-PRIORITY_ABS_MAX..=PRIORITY_ABS_MAX).contains(&wire.priority) {
        return Err(invalid(format!(
            "priority {} is outside -{PRIORITY_ABS_MAX}..={PRIORITY_ABS_MAX}",
            wire.priority
        )));
    }
    if wire.execution_deadline_seconds > EXECUTION_DEADLINE_SECONDS_MAX {
        return Err(invalid(format!(
            "execution_deadline_seconds {} is over {EXECUTION_DEADLINE_SECONDS_MAX}",
            wire.execution_deadline_seconds
        )));
    }
    // The client id is a token of the subject the request is published on.
    if let Err(error) = messages::subjects::token("client_id", &wire.client_id) {
        return Err(invalid(error.to_string()));
    }
    let key = &wire.idempotency_key;
    if key.is_empty() || key.len() > IDENTIFIER_BYTES_MAX || key.chars().any(char::is_control) {
        return Err(invalid(format!(
            "idempotency_key must be 1..={IDENTIFIER_BYTES_MAX} bytes without control characters"
        )));
    }
    Ok(ValidScanRequest {
        organization_id,
        target: wire.target.clone(),
        plugins: wire.plugins.clone(),
        priority: wire.priority,
        execution_deadline_seconds: (wire.execution_deadline_seconds > 0)
            .then_some(wire.execution_deadline_seconds as i32),
        client_id: wire.client_id.clone(),
        idempotency_key: wire.idempotency_key.clone(),
        // The fingerprint covers the organization in its canonical spelling, so two spellings
        // of one UUID are one request.
        fingerprint: messages::scan_request_fingerprint(&v1::ScanRequest {
            organization_id: organization_id.to_string(),
            ..wire.clone()
        }),
    })
}

fn is_identifier(text: &str) -> bool {
    !text.is_empty()
        && text.len() <= IDENTIFIER_BYTES_MAX
        && text
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request() -> v1::ScanRequest {
        v1::ScanRequest {
            schema_version: 1,
            organization_id: Uuid::now_v7().to_string(),
            target: "http://127.0.0.1:8080".into(),
            plugins: vec!["tcp_connect".into()],
            priority: 0,
            execution_deadline_seconds: 0,
            client_id: "ci".into(),
            idempotency_key: "k".into(),
        }
    }

    #[test]
    fn accepts_a_well_formed_request() {
        assert!(validate(&request()).is_ok());
    }

    #[test]
    fn refuses_each_bad_field_with_its_code() {
        type Change = Box<dyn Fn(&mut v1::ScanRequest)>;
        let cases: Vec<(Change, ErrorCode)> = vec![
            (
                Box::new(|r| r.schema_version = 2),
                ErrorCode::UnsupportedSchemaVersion,
            ),
            (
                Box::new(|r| r.organization_id = "nope".into()),
                ErrorCode::InvalidField,
            ),
            (
                Box::new(|r| r.target = String::new()),
                ErrorCode::InvalidField,
            ),
            (
                Box::new(|r| r.target = "x".repeat(513)),
                ErrorCode::TooLarge,
            ),
            (Box::new(|r| r.plugins.clear()), ErrorCode::InvalidField),
            (
                Box::new(|r| r.plugins = vec!["a".into(); 17]),
                ErrorCode::TooLarge,
            ),
            (
                Box::new(|r| r.plugins = vec!["Bad Name".into()]),
                ErrorCode::InvalidField,
            ),
            (Box::new(|r| r.priority = 5_000), ErrorCode::InvalidField),
            (
                Box::new(|r| r.execution_deadline_seconds = u32::MAX),
                ErrorCode::InvalidField,
            ),
            (
                Box::new(|r| r.client_id = String::new()),
                ErrorCode::InvalidField,
            ),
            (
                Box::new(|r| r.client_id = "a.b".into()),
                ErrorCode::InvalidField,
            ),
            (
                Box::new(|r| r.client_id = "*".into()),
                ErrorCode::InvalidField,
            ),
            (
                Box::new(|r| r.idempotency_key = "k".repeat(129)),
                ErrorCode::InvalidField,
            ),
        ];
        for (change, code) in cases {
            let mut bad = request();
            change(&mut bad);
            let error = validate(&bad).expect_err("refused");
            assert_eq!(error.error_code(), Some(code), "{error:?}");
        }
    }

    #[test]
    fn two_spellings_of_one_organization_are_one_request() {
        let canonical = request();
        let mut shouted = canonical.clone();
        shouted.organization_id = canonical.organization_id.to_uppercase().replace('-', "");
        assert_eq!(
            validate(&canonical).unwrap().fingerprint,
            validate(&shouted).unwrap().fingerprint
        );
    }

    #[test]
    fn the_subject_must_name_the_requests_organization_and_client() {
        let subjects = Subjects::new("p").unwrap();
        let wire = request();
        let organization = Uuid::parse_str(&wire.organization_id).unwrap();
        let bytes = wire.encode_to_vec();
        let own = subjects
            .client(&organization, "ci", messages::ClientVerb::Request)
            .unwrap();
        assert!(parse(&subjects, &own, &bytes).1.is_ok());
        let other = subjects
            .client(&Uuid::now_v7(), "ci", messages::ClientVerb::Request)
            .unwrap();
        assert_eq!(
            parse(&subjects, &other, &bytes).1.unwrap_err().error_code(),
            Some(ErrorCode::InvalidField)
        );
    }

    #[test]
    fn malformed_bytes_are_malformed_message() {
        let subjects = Subjects::new("p").unwrap();
        let (wire, result) = parse(
            &subjects,
            "p.v1.org.o.client.c.request",
            &[0xff, 0xff, 0xff],
        );
        assert!(wire.is_none());
        assert_eq!(
            result.unwrap_err().error_code(),
            Some(ErrorCode::MalformedMessage)
        );
    }
}
