//! Scans over the bus (issue 27, item 4): `ScansRequest` on
//! `<prefix>.v1.org.<organization_id>.client.<client_id>.scans` (request/reply, queue group
//! `ingestion`) lists the subject's organization's scans, newest first, with the filters
//! `palisade scan list` has and keyset pages. Another organization's scans are never read: the
//! organization is the subject's, not the request's.

use chrono::{DateTime, Utc};
use messages::validate::{invalid, malformed, schema_version};
use messages::{Subjects, v1};
use prost::Message as _;
use store::PgPool;
use store::admin::{ScanFilter, ScanView};
use store::states::ScanState;
use uuid::Uuid;

/// The requests the server answers, as the `server` label of `palisade_requests_total`.
pub const REQUEST_SERVER: &str = "ingestion.scans";
/// A page holds this many scans when the request says 0.
pub const PAGE_DEFAULT: u32 = 50;
/// The most scans one page holds.
pub const PAGE_MAX: u32 = 500;

/// Decodes and validates the request published on `subject`: the filter it asks for, within
/// the subject's organization. The error is the answer.
pub fn parse(subjects: &Subjects, subject: &str, bytes: &[u8]) -> Result<ScanFilter, v1::Error> {
    let request =
        v1::ScansRequest::decode(bytes).map_err(|error| malformed("ScansRequest", error))?;
    schema_version(request.schema_version)?;
    let organization_id = subjects
        .client_of(subject)
        .and_then(|tokens| Uuid::parse_str(tokens.organization_id).ok())
        .ok_or_else(|| {
            invalid(format!(
                "{subject:?} is not a client subject: ask on \
                 <prefix>.v1.org.<organization_id>.client.<client_id>.scans, the organization a \
                 UUID, the client id 1..=64 characters of [A-Za-z0-9_-]"
            ))
        })?;
    let Some(v1::scans_request::Query::List(list)) = request.query else {
        return Err(invalid("query is required: list"));
    };
    filter_of(organization_id, list)
}

/// The filter `list` asks for, within `organization_id`.
fn filter_of(organization_id: Uuid, list: v1::ListScans) -> Result<ScanFilter, v1::Error> {
    let text = |field: &str, value: String, max: usize| {
        if value.len() > max || value.chars().any(char::is_control) {
            Err(invalid(format!(
                "list.{field} must be at most {max} bytes without control characters"
            )))
        } else {
            Ok((!value.is_empty()).then_some(value))
        }
    };
    let state = match list.state.as_str() {
        "" => None,
        state => Some(ScanState::parse(state).ok_or_else(|| {
            invalid(format!(
                "list.state {state:?} is not one of pending, running, completed, failed, cancelled"
            ))
        })?),
    };
    let time = |field: &str, unix_ms: i64| match unix_ms {
        0 => Ok(None),
        ms => DateTime::<Utc>::from_timestamp_millis(ms)
            .map(Some)
            .ok_or_else(|| invalid(format!("list.{field} {ms} is not a time"))),
    };
    let after = match list.after.as_str() {
        "" => None,
        after => Some(
            Uuid::parse_str(after)
                .map_err(|_| invalid(format!("list.after {after:?} is not a scan id (a UUID)")))?,
        ),
    };
    let limit = match list.limit {
        0 => PAGE_DEFAULT,
        limit if limit <= PAGE_MAX => limit,
        limit => {
            return Err(invalid(format!(
                "list.limit {limit} must be 1..={PAGE_MAX} (0 for {PAGE_DEFAULT})"
            )));
        }
    };
    Ok(ScanFilter {
        organization_id: Some(organization_id),
        target: text("target", list.target, messages::limits::TARGET_BYTES_MAX)?,
        state,
        plugin: text(
            "plugin",
            list.plugin,
            messages::limits::IDENTIFIER_BYTES_MAX,
        )?,
        admitted_from: time("admitted_from_unix_ms", list.admitted_from_unix_ms)?,
        admitted_before: time("admitted_before_unix_ms", list.admitted_before_unix_ms)?,
        client_id: text(
            "client_id",
            list.client_id,
            messages::limits::IDENTIFIER_BYTES_MAX,
        )?,
        after,
        limit: i64::from(limit),
    })
}

/// Answers one request.
pub async fn reply(
    pool: &PgPool,
    subjects: &Subjects,
    subject: &str,
    payload: &[u8],
) -> v1::ScansReply {
    let filter = match parse(subjects, subject, payload) {
        Ok(filter) => filter,
        Err(error) => return refuse(error),
    };
    match store::admin::scans(pool, &filter).await {
        Ok(None) => refuse(v1::Error::new(
            messages::ErrorCode::NotFound,
            "list.after names no scan of this organization: start from the first page \
             (after empty) and pass next_after as given",
        )),
        Ok(Some(scans)) => {
            let full = i64::try_from(scans.len()).unwrap_or(i64::MAX) >= filter.limit;
            let next_after = if full {
                scans
                    .last()
                    .map(|scan| scan.id.to_string())
                    .unwrap_or_default()
            } else {
                String::new()
            };
            v1::ScansReply {
                error: None,
                answer: Some(v1::scans_reply::Answer::Page(v1::ScanPage {
                    scans: scans.into_iter().map(summary).collect(),
                    next_after,
                })),
            }
        }
        Err(error) => refuse(runtime::internal_error(
            "the scans request",
            &telemetry::chain(&error),
            "retry the request",
        )),
    }
}

fn refuse(error: v1::Error) -> v1::ScansReply {
    v1::ScansReply {
        error: Some(error),
        answer: None,
    }
}

fn summary(scan: ScanView) -> v1::ScanSummary {
    let unix_ms = |at: Option<DateTime<Utc>>| at.map_or(0, |at| at.timestamp_millis());
    v1::ScanSummary {
        scan_id: scan.id.to_string(),
        target: scan.target,
        client_id: scan.client_id,
        idempotency_key: scan.idempotency_key,
        plugins: scan.plugins,
        state: scan.state,
        failure_code: scan.failure_code,
        failure_reason: scan.failure_reason,
        finding_count: u32::try_from(scan.finding_count).unwrap_or(0),
        admitted_at_unix_ms: scan.created_at.timestamp_millis(),
        started_at_unix_ms: unix_ms(scan.started_at),
        finished_at_unix_ms: unix_ms(scan.finished_at),
        trace_id: scan.trace_id.unwrap_or_default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subjects() -> Subjects {
        Subjects::new("palisade").unwrap()
    }

    fn list(list: v1::ListScans) -> Vec<u8> {
        v1::ScansRequest {
            schema_version: 1,
            query: Some(v1::scans_request::Query::List(list)),
        }
        .encode_to_vec()
    }

    #[test]
    fn the_organization_is_the_subjects_and_bad_fields_are_named() {
        let subjects = subjects();
        let organization = Uuid::now_v7();
        let subject = subjects
            .client(&organization, "ci", messages::ClientVerb::Scans)
            .unwrap();
        let filter = parse(
            &subjects,
            &subject,
            &list(v1::ListScans {
                state: "running".into(),
                ..Default::default()
            }),
        )
        .unwrap();
        assert_eq!(filter.organization_id, Some(organization));
        assert_eq!(filter.state, Some(ScanState::Running));
        assert_eq!(filter.limit, i64::from(PAGE_DEFAULT));
        for (bad, names) in [
            (
                v1::ListScans {
                    state: "done".into(),
                    ..Default::default()
                },
                "list.state",
            ),
            (
                v1::ListScans {
                    after: "x".into(),
                    ..Default::default()
                },
                "list.after",
            ),
            (
                v1::ListScans {
                    limit: PAGE_MAX + 1,
                    ..Default::default()
                },
                "list.limit",
            ),
            (
                v1::ListScans {
                    target: "a\u{0}b".into(),
                    ..Default::default()
                },
                "list.target",
            ),
        ] {
            let error = parse(&subjects, &subject, &list(bad)).unwrap_err();
            assert!(error.message.contains(names), "{error:?}");
        }
        let empty = v1::ScansRequest {
            schema_version: 1,
            query: None,
        };
        assert!(parse(&subjects, &subject, &empty.encode_to_vec()).is_err());
    }
}
