//! Test aids for the hostile-input property tests of every receiver (behind the `testing`
//! feature, which only dev-dependencies enable): proptest strategies for well-formed
//! `palisade.v1` messages, and for the values that must be refused in their fields.
//!
//! Every such test is named `hostile_*`, so `cargo nextest run --workspace -E 'test(/hostile/)'`
//! selects them all; [`cases`] gives each its number of cases, which `PROPTEST_CASES` overrides.

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::Config;

use crate::limits::{IDENTIFIER_BYTES_MAX, PROFILE_PLUGINS_MAX, TARGET_BYTES_MAX};
use crate::subjects::TOKEN_BYTES_MAX;
use crate::v1;

/// The proptest configuration of a hostile-input test: `default_cases` cases (chosen so that
/// all of them together add a few seconds to a debug test run), or `PROPTEST_CASES` when set,
/// for a long run on demand. Failing inputs are written to `proptest-regressions/` beside the
/// test's source file; commit them, they are replayed first on every later run.
pub fn cases(default_cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(default_cases);
    Config {
        cases,
        // Shrinking a failure is worth a little time, not a CI timeout.
        max_shrink_iters: 2_048,
        ..Config::default()
    }
}

/// Any bytes, mostly short, sometimes long: what an attacker or a broken encoder sends.
pub fn any_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        4 => vec(any::<u8>(), 0..64),
        1 => vec(any::<u8>(), 0..4_096),
    ]
}

/// A UUID as palisade writes it: lowercase, hyphenated.
pub fn uuid_text() -> impl Strategy<Value = String> {
    any::<u128>().prop_map(|bits| uuid::Uuid::from_u128(bits).to_string())
}

/// A subject token: 1..=64 characters of `[A-Za-z0-9_-]`.
pub fn token_text() -> impl Strategy<Value = String> {
    proptest::string::string_regex(&format!("[A-Za-z0-9_-]{{1,{TOKEN_BYTES_MAX}}}"))
        .expect("a valid regex")
}

/// Text with what validators must catch: NUL and other control characters, subject
/// wildcards and separators (`*`, `>`, `.`), whitespace, non-ASCII characters.
pub fn hostile_text() -> impl Strategy<Value = String> {
    let piece = prop_oneof![
        Just("\0".to_owned()),
        Just("*".to_owned()),
        Just(">".to_owned()),
        Just(".".to_owned()),
        Just(" ".to_owned()),
        Just("\t".to_owned()),
        Just("\n".to_owned()),
        Just("\u{7f}".to_owned()),
        Just("é".to_owned()),
        Just("{".to_owned()),
        Just(":".to_owned()),
        "[a-z0-9]{0,8}",
        any::<String>(),
    ];
    vec(piece, 0..8).prop_map(|pieces| pieces.concat())
}

/// Text that is certainly not a UUID in any spelling `Uuid::parse_str` accepts.
pub fn not_a_uuid() -> impl Strategy<Value = String> {
    hostile_text().prop_filter("not a UUID", |text| uuid::Uuid::parse_str(text).is_err())
}

/// Text that is certainly not 1..=`bytes_max` bytes without NUL: empty, one byte too long, or
/// with a NUL.
pub fn bad_bounded_text(bytes_max: usize) -> impl Strategy<Value = String> {
    prop_oneof![
        Just(String::new()),
        (bytes_max + 1..bytes_max + 64).prop_map(|length| "x".repeat(length)),
        ("[a-z]{0,16}", "[a-z]{0,16}").prop_map(|(before, after)| format!("{before}\0{after}")),
    ]
}

/// A plugin name: 1..=128 characters of `[a-z0-9_-]` (short ones, so profiles rarely repeat).
pub fn plugin_name() -> impl Strategy<Value = String> {
    "[a-z0-9_-]{1,12}"
}

/// A well-formed scan request: every field has its documented form.
pub fn scan_request() -> impl Strategy<Value = v1::ScanRequest> {
    (
        uuid_text(),
        proptest::string::string_regex(&format!("[!-~]{{1,{}}}", TARGET_BYTES_MAX / 8))
            .expect("a valid regex"),
        proptest::sample::subsequence(
            (0..PROFILE_PLUGINS_MAX * 2)
                .map(|i| format!("plugin-{i}"))
                .collect::<Vec<_>>(),
            1..=PROFILE_PLUGINS_MAX,
        ),
        -1_000..=1_000i32,
        prop_oneof![
            Just(0u32),
            1..=crate::limits::EXECUTION_DEADLINE_SECONDS_MAX
        ],
        token_text(),
        proptest::string::string_regex(&format!("[ -~]{{1,{IDENTIFIER_BYTES_MAX}}}"))
            .expect("a valid regex"),
    )
        .prop_map(
            |(organization_id, target, plugins, priority, deadline, client_id, key)| {
                v1::ScanRequest {
                    schema_version: crate::SCHEMA_VERSION,
                    organization_id,
                    target,
                    plugins,
                    priority,
                    execution_deadline_seconds: deadline,
                    client_id,
                    idempotency_key: key,
                }
            },
        )
}

/// A well-formed lease reference.
pub fn lease_ref() -> impl Strategy<Value = v1::LeaseRef> {
    (
        uuid_text(),
        uuid_text(),
        1..=i32::MAX as u32,
        proptest::string::string_regex("[!-~]{1,128}").expect("a valid regex"),
    )
        .prop_map(
            |(task_id, attempt_id, attempt_number, lease_token)| v1::LeaseRef {
                task_id,
                attempt_id,
                attempt_number,
                lease_token,
            },
        )
}

/// A lease reference with exactly one field that must be refused (`invalid_field`).
pub fn bad_lease_ref() -> impl Strategy<Value = v1::LeaseRef> {
    (
        lease_ref(),
        0..4u8,
        not_a_uuid(),
        prop_oneof![Just(0), i32::MAX as u32 + 1..=u32::MAX],
        bad_bounded_text(128),
    )
        .prop_map(|(mut lease, field, not_uuid, bad_number, bad_token)| {
            match field {
                0 => lease.task_id = not_uuid,
                1 => lease.attempt_id = not_uuid,
                2 => lease.attempt_number = bad_number,
                _ => lease.lease_token = bad_token,
            }
            lease
        })
}

/// A schema version this build does not read.
pub fn bad_schema_version() -> impl Strategy<Value = u32> {
    any::<u32>().prop_filter("not the supported version", |v| *v != crate::SCHEMA_VERSION)
}

/// A well-formed finding.
pub fn finding() -> impl Strategy<Value = v1::Finding> {
    (
        "[a-z0-9_.-]{1,32}",
        proptest::sample::select(vec!["info", "low", "medium", "high", "critical"]),
        "[ -~]{1,64}",
        "[ -~]{0,16}",
        "[ -~]{1,64}",
        "[ -~]{0,64}",
        vec("CVE-[0-9]{4}-[0-9]{4,7}", 0..3),
    )
        .prop_map(
            |(rule_id, severity, resource, discriminator, title, description, cve_ids)| {
                v1::Finding {
                    rule_id,
                    severity: severity.to_owned(),
                    resource,
                    discriminator,
                    title,
                    description,
                    evidence: String::new(),
                    cve_ids,
                }
            },
        )
}

/// A well-formed asset.
pub fn asset() -> impl Strategy<Value = v1::Asset> {
    ("[a-z_]{1,64}", "[ -~]{1,128}").prop_map(|(kind, value)| v1::Asset { kind, value })
}

/// A well-formed evaluation: a status a plugin may report, a reason code where it needs one.
pub fn evaluation() -> impl Strategy<Value = v1::Evaluation> {
    (
        "[a-z0-9_.-]{1,32}",
        "[ -~]{1,64}",
        proptest::sample::select(crate::EVALUATION_STATUSES.to_vec()),
        "[a-z_]{1,32}",
        "[ -~]{0,16}",
    )
        .prop_map(
            |(rule_id, resource, status, reason_code, discriminator)| v1::Evaluation {
                rule_id,
                resource,
                status: status.to_owned(),
                reason_code,
                evidence: String::new(),
                finding_discriminator: discriminator,
            },
        )
}

/// A well-formed batch payload.
pub fn batch_payload() -> impl Strategy<Value = v1::BatchPayload> {
    (
        vec(finding(), 0..8),
        vec(asset(), 0..4),
        vec(evaluation(), 0..4),
    )
        .prop_map(|(findings, assets, evaluations)| v1::BatchPayload {
            findings,
            assets,
            evaluations,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest! {
        #![proptest_config(cases(64))]

        #[test]
        fn hostile_strategies_make_what_they_say(
            token in token_text(),
            not_uuid in not_a_uuid(),
            bad in bad_bounded_text(IDENTIFIER_BYTES_MAX),
        ) {
            prop_assert!(crate::subjects::token("t", &token).is_ok());
            prop_assert!(uuid::Uuid::parse_str(&not_uuid).is_err());
            prop_assert!(bad.is_empty() || bad.len() > IDENTIFIER_BYTES_MAX || bad.contains('\0'));
        }
    }
}
