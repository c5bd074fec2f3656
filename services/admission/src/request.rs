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

/// `ScanRequest.plugins`' field number: an oversized request's plugins are counted, not held.
const PLUGINS_TAG: u32 = 4;

/// Decodes and validates the request published on `subject`, whose organization and client
/// tokens must be the request's own; the error is what the sender gets back. `wire` is
/// returned too so a refusal can name the client and key when the message decoded at all
/// (of a request over the size limit, with at most the profile's limit of plugins: a
/// megabyte of empty plugin names would otherwise become 12 MB of `String`s).
pub fn parse(
    subjects: &Subjects,
    subject: &str,
    bytes: &[u8],
) -> (Option<v1::ScanRequest>, Result<ValidScanRequest, v1::Error>) {
    let decoded = if bytes.len() > SCAN_REQUEST_BYTES_MAX {
        messages::bounded::decode_counted(bytes, PLUGINS_TAG, PROFILE_PLUGINS_MAX)
            .map(|counted| counted.message)
    } else {
        v1::ScanRequest::decode(bytes)
    };
    match decoded {
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

/// Checks every field of `wire`, in the order the reference gives (the first fault is the
/// one reported).
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
    validate_target(&wire.target)?;
    validate_plugins(&wire.plugins)?;
    validate_scheduling(wire)?;
    validate_sender(wire)?;
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

/// The target: non-empty text without control characters, within its byte limit.
fn validate_target(target: &str) -> Result<(), v1::Error> {
    if target.is_empty() || target.chars().any(char::is_control) {
        return Err(invalid(
            "target must be non-empty text without control characters",
        ));
    }
    if target.len() > TARGET_BYTES_MAX {
        return Err(v1::Error::new(
            ErrorCode::TooLarge,
            format!(
                "target is {} bytes, at most {TARGET_BYTES_MAX} are allowed",
                target.len()
            ),
        ));
    }
    Ok(())
}

/// The profile: one to `PROFILE_PLUGINS_MAX` distinct plugin identifiers.
fn validate_plugins(plugins: &[String]) -> Result<(), v1::Error> {
    if plugins.is_empty() {
        return Err(invalid("plugins must name at least one plugin"));
    }
    if plugins.len() > PROFILE_PLUGINS_MAX {
        return Err(v1::Error::new(
            ErrorCode::TooLarge,
            format!(
                "{} plugins in the profile, at most {PROFILE_PLUGINS_MAX}",
                plugins.len()
            ),
        ));
    }
    for (index, plugin) in plugins.iter().enumerate() {
        if plugins[..index].contains(plugin) {
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
    Ok(())
}

/// The priority and the execution deadline, each within its bound.
fn validate_scheduling(wire: &v1::ScanRequest) -> Result<(), v1::Error> {
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
    Ok(())
}

/// The client id (a subject token) and the idempotency key.
fn validate_sender(wire: &v1::ScanRequest) -> Result<(), v1::Error> {
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
    Ok(())
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

    mod hostile {
        use super::*;
        use messages::testing::{
            any_bytes, bad_schema_version, cases, hostile_text, not_a_uuid, scan_request,
            token_text,
        };
        use proptest::prelude::*;

        fn own_subject(wire: &v1::ScanRequest) -> String {
            let organization = Uuid::parse_str(&wire.organization_id).unwrap();
            Subjects::new("p")
                .unwrap()
                .client(&organization, &wire.client_id, messages::ClientVerb::Submit)
                .unwrap()
        }

        fn code(result: &Result<ValidScanRequest, v1::Error>) -> Option<ErrorCode> {
            result
                .as_ref()
                .err()
                .map(|error| error.error_code().expect("a known code"))
        }

        proptest! {
            #![proptest_config(cases(256))]

            /// Any bytes on any subject: no panic, and a refusal with a code admission sends
            /// before its transaction.
            #[test]
            fn hostile_bytes_get_a_documented_code(
                bytes in prop_oneof![any_bytes(), proptest::collection::vec(any::<u8>(), 4_000..6_000)],
                subject in prop_oneof![hostile_text(), token_text()],
            ) {
                let subjects = Subjects::new("p").unwrap();
                let (_, result) = parse(&subjects, &subject, &bytes);
                use ErrorCode::*;
                prop_assert!(code(&result).is_none_or(|c| [MalformedMessage, TooLarge, UnsupportedSchemaVersion, InvalidField].contains(&c)));
            }

            /// A well-formed request on its own subject is accepted as sent, and its
            /// fingerprint is the wire's (with the organization in canonical form).
            #[test]
            fn hostile_valid_request_is_accepted_as_sent(wire in scan_request()) {
                let subjects = Subjects::new("p").unwrap();
                let bytes = wire.encode_to_vec();
                let (decoded, result) = parse(&subjects, &own_subject(&wire), &bytes);
                prop_assert_eq!(decoded.as_ref(), Some(&wire));
                let valid = result.unwrap();
                prop_assert_eq!(valid.organization_id.to_string(), wire.organization_id.clone());
                prop_assert_eq!(&valid.plugins, &wire.plugins);
                prop_assert_eq!(&valid.target, &wire.target);
                prop_assert_eq!(valid.fingerprint, messages::scan_request_fingerprint(&wire));
            }

            /// One bad field of a well-formed request gets the code reference 6.1 gives it.
            #[test]
            fn hostile_request_fault_gets_its_code(
                mut wire in scan_request(),
                fault in 0..12u8,
                version in bad_schema_version(),
                not_uuid in not_a_uuid(),
                text in hostile_text(),
                number in any::<i32>(),
            ) {
                let subjects = Subjects::new("p").unwrap();
                let subject = own_subject(&wire);
                let control = |text: &str| text.chars().any(char::is_control);
                let expected = match fault {
                    0 => { wire.schema_version = version; ErrorCode::UnsupportedSchemaVersion }
                    1 => { wire.organization_id = not_uuid; ErrorCode::InvalidField }
                    2 => {
                        prop_assume!(text.is_empty() || control(&text));
                        wire.target = text;
                        ErrorCode::InvalidField
                    }
                    3 => { wire.target = "x".repeat(TARGET_BYTES_MAX + 1); ErrorCode::TooLarge }
                    4 => { wire.plugins.clear(); ErrorCode::InvalidField }
                    5 => {
                        wire.plugins = (0..=PROFILE_PLUGINS_MAX).map(|i| format!("p{i}")).collect();
                        ErrorCode::TooLarge
                    }
                    6 => {
                        prop_assume!(!is_identifier(&text));
                        wire.plugins.truncate(PROFILE_PLUGINS_MAX - 1);
                        wire.plugins.push(text);
                        ErrorCode::InvalidField
                    }
                    7 => {
                        let first = wire.plugins[0].clone();
                        wire.plugins.truncate(PROFILE_PLUGINS_MAX - 1);
                        wire.plugins.push(first);
                        ErrorCode::InvalidField
                    }
                    8 => {
                        prop_assume!(!(-PRIORITY_ABS_MAX..=PRIORITY_ABS_MAX).contains(&number));
                        wire.priority = number;
                        ErrorCode::InvalidField
                    }
                    9 => {
                        wire.execution_deadline_seconds = EXECUTION_DEADLINE_SECONDS_MAX + 1 + number.unsigned_abs() % 1_000;
                        ErrorCode::InvalidField
                    }
                    10 => {
                        prop_assume!(messages::subjects::token("c", &text).is_err());
                        wire.client_id = text;
                        ErrorCode::InvalidField
                    }
                    _ => {
                        prop_assume!(text.is_empty() || text.len() > IDENTIFIER_BYTES_MAX || control(&text));
                        wire.idempotency_key = text;
                        ErrorCode::InvalidField
                    }
                };
                let (_, result) = parse(&subjects, &subject, &wire.encode_to_vec());
                prop_assert_eq!(code(&result), Some(expected), "{:?}", result);
            }

            /// A request of another organization or client than its subject's is
            /// `invalid_field`, whatever the subject holds.
            #[test]
            fn hostile_foreign_subject_is_invalid_field(
                wire in scan_request(),
                other in prop_oneof![scan_request().prop_map(|other| own_subject(&other)), hostile_text()],
            ) {
                let subjects = Subjects::new("p").unwrap();
                prop_assume!(other != own_subject(&wire));
                let (_, result) = parse(&subjects, &other, &wire.encode_to_vec());
                prop_assert_eq!(code(&result), Some(ErrorCode::InvalidField));
            }
        }

        /// Padding past the size limit is `too_large`, and a megabyte of empty plugin names
        /// is decoded without holding them.
        #[test]
        fn hostile_an_oversized_request_is_too_large_without_holding_its_plugins() {
            let mut wire = v1::ScanRequest {
                schema_version: 1,
                client_id: "ci".into(),
                idempotency_key: "k".into(),
                ..Default::default()
            };
            wire.plugins = vec![String::new(); 500_000];
            let subjects = Subjects::new("p").unwrap();
            let (decoded, result) = parse(
                &subjects,
                "p.v1.org.o.client.ci.submit",
                &wire.encode_to_vec(),
            );
            assert_eq!(code(&result), Some(ErrorCode::TooLarge));
            let decoded = decoded.expect("it decodes");
            assert_eq!(decoded.plugins.len(), PROFILE_PLUGINS_MAX);
            assert_eq!(decoded.client_id, "ci");
        }
    }
}
