//! Findings over the bus (issue 12, item 2): `FindingsRequest` on
//! `<prefix>.v1.org.<organization_id>.client.<client_id>.findings` (request/reply, queue
//! group `ingestion`) lists a scan's findings, shows one with its history, sets a disposition
//! or answers the scan's gate, always within the subject's organization (a scan or finding
//! of another is `not_found`, as one that does not exist). The decisions are
//! `store::findings`', the ones `palisade finding` and `palisade scan gate` make.

use messages::validate::{invalid, malformed, schema_version};
use messages::{ErrorCode, Subjects, v1};
use prost::Message as _;
use store::PgPool;
use store::findings::{Change, ChangeFailure, ChangeOutcome, Filter};
use store::states::{FindingStatus, Severity};
use uuid::Uuid;
use v1::findings_reply::Answer;

/// A page holds this many findings when the request says 0.
pub const PAGE_DEFAULT: u32 = 100;
/// The gate's threshold when the request names none.
pub const THRESHOLD_DEFAULT: Severity = Severity::High;

/// A request whose fields have their documented form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub organization_id: Uuid,
    pub query: Query,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    List {
        scan_id: Uuid,
        filter: Filter,
        after: String,
        limit: i64,
    },
    Show {
        finding_id: Uuid,
    },
    Set {
        change: Change,
        status: FindingStatus,
    },
    Gate {
        scan_id: Uuid,
        threshold: Severity,
    },
    Coverage(crate::coverage::CoverageQuery),
    Diff(crate::coverage::DiffQuery),
}

pub(crate) fn uuid_field(name: &str, text: &str) -> Result<Uuid, v1::Error> {
    Uuid::parse_str(text).map_err(|_| invalid(format!("{name} {text:?} is not a UUID")))
}

/// Decodes and validates the request published on `subject`; the error is the answer.
pub fn parse(subjects: &Subjects, subject: &str, bytes: &[u8]) -> Result<Request, v1::Error> {
    use v1::findings_request::Query as Wire;
    let request =
        v1::FindingsRequest::decode(bytes).map_err(|error| malformed("FindingsRequest", error))?;
    schema_version(request.schema_version)?;
    let tokens = subjects.client_of(subject).ok_or_else(|| {
        invalid(format!(
            "{subject:?} names no organization: ask on <prefix>.v1.org.<organization_id>.client.<client_id>.findings"
        ))
    })?;
    let organization_id = Uuid::parse_str(tokens.organization_id).map_err(|_| {
        invalid(format!(
            "{subject:?} names no organization: ask on <prefix>.v1.org.<organization_id>.client.<client_id>.findings"
        ))
    })?;
    let query = match request.query {
        None => {
            return Err(invalid(
                "query is required: list, show, set, gate, coverage or diff",
            ));
        }
        Some(Wire::List(list)) => parse_list(list)?,
        Some(Wire::Show(show)) => Query::Show {
            finding_id: uuid_field("show.finding_id", &show.finding_id)?,
        },
        Some(Wire::Set(set)) => parse_set(set, organization_id, tokens.client_id)?,
        Some(Wire::Gate(gate)) => Query::Gate {
            scan_id: uuid_field("gate.scan_id", &gate.scan_id)?,
            threshold: if gate.threshold.is_empty() {
                THRESHOLD_DEFAULT
            } else {
                severity_of("gate.threshold", &gate.threshold)?
            },
        },
        Some(Wire::Coverage(coverage)) => {
            Query::Coverage(crate::coverage::parse_coverage(coverage)?)
        }
        Some(Wire::Diff(diff)) => Query::Diff(crate::coverage::parse_diff(diff)?),
    };
    Ok(Request {
        organization_id,
        query,
    })
}

/// A `list` query: its filter, its cursor (a finding key) and its page size.
fn parse_list(list: v1::ListFindings) -> Result<Query, v1::Error> {
    let statuses = list
        .statuses
        .iter()
        .map(|status| {
            FindingStatus::parse(status).ok_or_else(|| {
                invalid(format!(
                    "list.statuses: {status:?} is not one of {}",
                    FindingStatus::NAMES.join(", ")
                ))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let severities = list
        .severities
        .iter()
        .map(|severity| severity_of("list.severities", severity))
        .collect::<Result<Vec<_>, _>>()?;
    let key_form = list.after.len() <= 64
        && list
            .after
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
    if !key_form {
        return Err(invalid(
            "list.after must be a finding key (64 lowercase hex digits) or empty",
        ));
    }
    let limit = match list.limit {
        0 => PAGE_DEFAULT,
        limit if i64::from(limit) <= store::findings::PAGE_MAX => limit,
        _ => {
            return Err(invalid(format!(
                "list.limit must be 1..={} (0 for {PAGE_DEFAULT})",
                store::findings::PAGE_MAX
            )));
        }
    };
    Ok(Query::List {
        scan_id: uuid_field("list.scan_id", &list.scan_id)?,
        filter: Filter {
            statuses,
            severities,
        },
        after: list.after,
        limit: i64::from(limit),
    })
}

/// A `set` query: the disposition, the revisions it expects, its reason, and its actor
/// (the subject's client, with the actor the request names after a colon).
fn parse_set(
    set: v1::SetDisposition,
    organization_id: Uuid,
    client_id: &str,
) -> Result<Query, v1::Error> {
    let status = FindingStatus::parse(&set.status).ok_or_else(|| {
        invalid(format!(
            "set.status {:?} is not one of {}",
            set.status,
            FindingStatus::NAMES.join(", ")
        ))
    })?;
    let expected_revision = i32::try_from(set.expected_revision)
        .ok()
        .filter(|revision| *revision > 0)
        .ok_or_else(|| {
            invalid("set.expected_revision must be the finding's revision (1 or more)")
        })?;
    let expected_collection_revision = set
        .expected_collection_revision
        .map(|revision| {
            i32::try_from(revision)
                .map_err(|_| invalid("set.expected_collection_revision is too large"))
        })
        .transpose()?;
    if set.reason.chars().count() > store::findings::REASON_CHARS_MAX || set.reason.contains('\0') {
        return Err(invalid(format!(
            "set.reason must be at most {} characters, without NUL",
            store::findings::REASON_CHARS_MAX
        )));
    }
    if status.needs_reason() && set.reason.trim().is_empty() {
        return Err(invalid(format!(
            "set.reason is required for {status}: gate_exempt, accepted_risk, ignore, false_positive and fixed need one"
        )));
    }
    let actor = if set.actor.trim().is_empty() {
        client_id.to_owned()
    } else {
        format!("{}:{}", client_id, set.actor.trim())
    };
    if actor.chars().count() > store::findings::ACTOR_CHARS_MAX || actor.contains('\0') {
        return Err(invalid(format!(
            "set.actor must be at most {} characters with the client id",
            store::findings::ACTOR_CHARS_MAX
        )));
    }
    Ok(Query::Set {
        change: Change {
            finding_id: uuid_field("set.finding_id", &set.finding_id)?,
            organization_id: Some(organization_id),
            expected_revision,
            expected_collection_revision,
            reason: set.reason,
            actor,
        },
        status,
    })
}

fn severity_of(field: &str, text: &str) -> Result<Severity, v1::Error> {
    Severity::parse(text).ok_or_else(|| {
        invalid(format!(
            "{field}: {text:?} is not one of {}",
            Severity::NAMES.join(", ")
        ))
    })
}

pub(crate) fn refuse(error: v1::Error) -> v1::FindingsReply {
    v1::FindingsReply {
        error: Some(error),
        answer: None,
    }
}

pub(crate) fn answer(answer: v1::findings_reply::Answer) -> v1::FindingsReply {
    v1::FindingsReply {
        error: None,
        answer: Some(answer),
    }
}

pub(crate) fn not_found(what: &str) -> v1::FindingsReply {
    refuse(v1::Error::new(
        ErrorCode::NotFound,
        format!("no such {what}"),
    ))
}

/// Answers one request.
pub async fn reply(
    pool: &PgPool,
    subjects: &Subjects,
    subject: &str,
    payload: &[u8],
) -> v1::FindingsReply {
    let request = match parse(subjects, subject, payload) {
        Ok(request) => request,
        Err(error) => return refuse(error),
    };
    match decide(pool, request).await {
        Ok(reply) => reply,
        Err(error) => refuse(runtime::internal_error(
            "the findings request",
            &error,
            "retry the request",
        )),
    }
}

async fn decide(pool: &PgPool, request: Request) -> Result<v1::FindingsReply, String> {
    let organization = Some(request.organization_id);
    match request.query {
        Query::List {
            scan_id,
            filter,
            after,
            limit,
        } => decide_list(pool, organization, scan_id, &filter, &after, limit).await,
        Query::Show { finding_id } => decide_show(pool, organization, finding_id).await,
        Query::Set { change, status } => decide_set(pool, &change, status).await,
        Query::Gate { scan_id, threshold } => {
            decide_gate(pool, organization, scan_id, threshold).await
        }
        Query::Coverage(query) => crate::coverage::decide_coverage(pool, organization, query).await,
        Query::Diff(query) => crate::coverage::decide_diff(pool, organization, query).await,
    }
}

pub(crate) fn chain(error: store::StoreError) -> String {
    telemetry::chain(&error).to_string()
}

/// One page of a scan's findings.
async fn decide_list(
    pool: &PgPool,
    organization: Option<Uuid>,
    scan_id: Uuid,
    filter: &Filter,
    after: &str,
    limit: i64,
) -> Result<v1::FindingsReply, String> {
    let page = store::findings::page(pool, organization, scan_id, filter, after, limit)
        .await
        .map_err(chain)?;
    Ok(match page {
        None => not_found("scan"),
        Some(page) => answer(Answer::Page(v1::FindingPage {
            scan_id: scan_id.to_string(),
            scan_state: page.scan_state,
            collection_revision: page.collection_revision.max(0) as u32,
            findings: page
                .findings
                .iter()
                .map(|finding| view(scan_id, finding))
                .collect(),
            next_after: page.next_after.unwrap_or_default(),
        })),
    })
}

/// One finding with its history and its occurrences in other scans.
async fn decide_show(
    pool: &PgPool,
    organization: Option<Uuid>,
    finding_id: Uuid,
) -> Result<v1::FindingsReply, String> {
    let detail = store::findings::show(pool, organization, finding_id)
        .await
        .map_err(chain)?;
    let Some(detail) = detail else {
        return Ok(not_found("finding"));
    };
    Ok(answer(Answer::Finding(v1::FindingDetail {
        finding: Some(view(detail.scan_id, &detail.finding)),
        collection_revision: detail.collection_revision.max(0) as u32,
        history: detail
            .history
            .iter()
            .map(|entry| v1::FindingChange {
                action: entry.action.clone(),
                revision: entry.revision.max(0) as u32,
                from_status: entry.from_status.clone(),
                to_status: entry.to_status.clone(),
                reason: entry.reason.clone(),
                actor: entry.actor.clone(),
                changed_at_unix_ms: entry.changed_at.timestamp_millis(),
            })
            .collect(),
        occurrences: detail
            .occurrences
            .iter()
            .map(|occurrence| v1::FindingOccurrence {
                finding_id: occurrence.id.to_string(),
                scan_id: occurrence.scan_id.to_string(),
                status: occurrence.status.clone(),
                revision: occurrence.revision.max(0) as u32,
                scan_state: occurrence.scan_state.clone(),
                scanned_at_unix_ms: occurrence.scanned_at.timestamp_millis(),
            })
            .collect(),
    })))
}

/// A disposition set, or why not.
async fn decide_set(
    pool: &PgPool,
    change: &Change,
    status: FindingStatus,
) -> Result<v1::FindingsReply, String> {
    let outcome = match store::findings::set_status(pool, change, status).await {
        Ok(outcome) => outcome,
        Err(ChangeFailure::Invalid(error)) => {
            return Ok(refuse(invalid(error.to_string())));
        }
        Err(ChangeFailure::Store(error)) => return Err(chain(error)),
    };
    Ok(match outcome {
        ChangeOutcome::Changed {
            revision,
            collection_revision,
        } => answer(Answer::Set(v1::DispositionSet {
            finding_id: change.finding_id.to_string(),
            revision: revision.unwrap_or_default().max(0) as u32,
            collection_revision: collection_revision.max(0) as u32,
        })),
        ChangeOutcome::RevisionConflict {
            current_revision,
            current_collection_revision,
        } => refuse(v1::Error::new(
            ErrorCode::RevisionConflict,
            format!(
                "the finding is at revision {current_revision} and its scan's findings at collection revision {current_collection_revision}: nothing changed; read it again and decide on what it holds now"
            ),
        )),
        ChangeOutcome::ReasonRequired => {
            refuse(invalid(format!("set.reason is required for {status}")))
        }
        // Not an outcome of setting a disposition.
        ChangeOutcome::ScanActive | ChangeOutcome::NotFound => not_found("finding"),
    })
}

/// The scan's gate at `threshold`, with the counts behind it.
async fn decide_gate(
    pool: &PgPool,
    organization: Option<Uuid>,
    scan_id: Uuid,
    threshold: Severity,
) -> Result<v1::FindingsReply, String> {
    let summary = store::findings::summary(pool, organization, scan_id, threshold)
        .await
        .map_err(chain)?;
    let Some(summary) = summary else {
        return Ok(not_found("scan"));
    };
    let counts = |map: &std::collections::BTreeMap<String, i64>| {
        map.iter()
            .map(|(key, n)| (key.clone(), (*n).max(0) as u32))
            .collect()
    };
    Ok(answer(Answer::Gate(v1::GateResult {
        scan_id: scan_id.to_string(),
        scan_state: summary.scan_state.clone(),
        complete: summary.complete,
        plugins: summary.plugins.max(0) as u32,
        plugins_complete: summary.plugins_complete.max(0) as u32,
        by_status: counts(&summary.by_status),
        by_severity: counts(&summary.by_severity),
        gate_counted: counts(&summary.gate_counted),
        gate_exempt: summary.gate_exempt.max(0) as u32,
        suppressed: summary.suppressed.max(0) as u32,
        threshold: summary.threshold.clone(),
        blocking: summary.blocking.max(0) as u32,
        passed: summary.gate_passed,
        collection_revision: summary.collection_revision.max(0) as u32,
        coverage: Some(summary.coverage.to_wire()),
        refusal: summary.gate_refusal.clone().unwrap_or_default(),
    })))
}

fn view(scan_id: Uuid, finding: &store::findings::Finding) -> v1::FindingView {
    v1::FindingView {
        id: finding.id.to_string(),
        scan_id: scan_id.to_string(),
        finding_key: finding.finding_key.clone(),
        plugin: finding.plugin.clone(),
        rule_id: finding.rule_id.clone(),
        resource: finding.resource.clone(),
        discriminator: finding.discriminator.clone(),
        severity: finding.severity.clone(),
        title: finding.title.clone(),
        description: finding.description.clone(),
        evidence: finding.evidence.clone(),
        cve_ids: finding.cve_ids.clone(),
        cve_data_json: finding
            .cve_data
            .as_ref()
            .map(|data| data.to_string())
            .unwrap_or_default(),
        status: finding.status.clone(),
        status_reason: finding.status_reason.clone(),
        revision: finding.revision.max(0) as u32,
        reviewed_by: finding.reviewed_by.clone(),
        reviewed_at_unix_ms: finding
            .reviewed_at
            .map(|at| at.timestamp_millis())
            .unwrap_or_default(),
        created_at_unix_ms: finding.created_at.timestamp_millis(),
        updated_at_unix_ms: finding.updated_at.timestamp_millis(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subjects() -> Subjects {
        Subjects::new("p").unwrap()
    }

    fn subject(organization: Uuid) -> String {
        subjects()
            .client(&organization, "ci", messages::ClientVerb::Findings)
            .unwrap()
    }

    fn request(query: v1::findings_request::Query) -> Vec<u8> {
        v1::FindingsRequest {
            schema_version: 1,
            query: Some(query),
        }
        .encode_to_vec()
    }

    fn code(result: Result<Request, v1::Error>) -> String {
        result.expect_err("refused").code
    }

    #[test]
    fn each_query_is_checked_field_by_field() {
        use v1::findings_request::Query as Wire;
        let organization = Uuid::now_v7();
        let subject = subject(organization);
        let parse = |bytes: Vec<u8>| parse(&subjects(), &subject, &bytes);
        let set = |status: &str, revision: u32, reason: &str| {
            Wire::Set(v1::SetDisposition {
                finding_id: Uuid::now_v7().to_string(),
                status: status.into(),
                expected_revision: revision,
                reason: reason.into(),
                actor: "alice".into(),
                ..Default::default()
            })
        };
        let Request { query, .. } = parse(request(set("ignore", 3, "noise"))).unwrap();
        let Query::Set { change, status } = query else {
            panic!("a set")
        };
        assert_eq!(status, FindingStatus::Ignore);
        assert_eq!(change.actor, "ci:alice");
        assert_eq!(change.organization_id, Some(organization));
        assert_eq!(code(parse(request(set("ignore", 3, " ")))), "invalid_field");
        assert_eq!(code(parse(request(set("closed", 3, "x")))), "invalid_field");
        assert_eq!(code(parse(request(set("open", 0, "")))), "invalid_field");
        assert!(parse(request(set("open", 1, ""))).is_ok());
        let list = |after: &str, limit: u32, statuses: &[&str]| {
            Wire::List(v1::ListFindings {
                scan_id: Uuid::now_v7().to_string(),
                statuses: statuses.iter().map(|s| (*s).to_owned()).collect(),
                after: after.into(),
                limit,
                ..Default::default()
            })
        };
        let Request { query, .. } = parse(request(list("", 0, &["open"]))).unwrap();
        assert!(matches!(query, Query::List { limit: 100, .. }));
        assert_eq!(code(parse(request(list("", 501, &[])))), "invalid_field");
        assert_eq!(code(parse(request(list("XYZ", 10, &[])))), "invalid_field");
        assert_eq!(
            code(parse(request(list("", 10, &["opened"])))),
            "invalid_field"
        );
        let gate = |threshold: &str| {
            Wire::Gate(v1::ScanGate {
                scan_id: Uuid::now_v7().to_string(),
                threshold: threshold.into(),
            })
        };
        assert!(matches!(
            parse(request(gate(""))).unwrap().query,
            Query::Gate {
                threshold: Severity::High,
                ..
            }
        ));
        assert_eq!(code(parse(request(gate("severe")))), "invalid_field");
        let none = v1::FindingsRequest {
            schema_version: 1,
            query: None,
        };
        assert_eq!(code(parse(none.encode_to_vec())), "invalid_field");
        assert_eq!(code(parse(vec![0xff, 0xff])), "malformed_message");
        let old = v1::FindingsRequest {
            schema_version: 9,
            query: Some(gate("")),
        };
        assert_eq!(
            code(parse(old.encode_to_vec())),
            "unsupported_schema_version"
        );
    }

    mod hostile {
        use messages::testing::{any_bytes, cases, hostile_text};
        use proptest::prelude::*;

        use super::*;

        proptest! {
            #![proptest_config(cases(256))]

            /// Any bytes on any subject: no panic, and only the refusals reference 6.13 lists
            /// before the decision.
            #[test]
            fn hostile_findings_bytes_get_a_documented_code(bytes in any_bytes(), subject in hostile_text()) {
                if let Err(error) = parse(&subjects(), &subject, &bytes) {
                    use ErrorCode::*;
                    let code = error.error_code().expect("a known code");
                    prop_assert!([MalformedMessage, UnsupportedSchemaVersion, InvalidField].contains(&code), "{code:?}");
                }
            }

            /// A disposition change with hostile text in every field is read or refused
            /// `invalid_field`, and what is read is within the store's bounds.
            #[test]
            fn hostile_disposition_fields_are_bounded(
                status in hostile_text(),
                reason in hostile_text(),
                actor in hostile_text(),
                revision in any::<u32>(),
            ) {
                let organization = Uuid::now_v7();
                let bytes = request(v1::findings_request::Query::Set(v1::SetDisposition {
                    finding_id: Uuid::now_v7().to_string(),
                    status,
                    expected_revision: revision,
                    reason,
                    actor,
                    ..Default::default()
                }));
                match parse(&subjects(), &subject(organization), &bytes) {
                    Ok(Request { query: Query::Set { change, status }, .. }) => {
                        prop_assert!(change.expected_revision > 0);
                        prop_assert!(change.actor.chars().count() <= store::findings::ACTOR_CHARS_MAX);
                        prop_assert!(change.reason.chars().count() <= store::findings::REASON_CHARS_MAX);
                        prop_assert!(!change.reason.contains('\0') && !change.actor.contains('\0'));
                        prop_assert!(!status.needs_reason() || !change.reason.trim().is_empty());
                    }
                    Ok(other) => prop_assert!(false, "{other:?}"),
                    Err(error) => prop_assert_eq!(error.error_code(), Some(ErrorCode::InvalidField)),
                }
            }
        }
    }
}
