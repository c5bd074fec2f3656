//! Recurring scans over the bus (issue 27, item 1): `SchedulesRequest` on
//! `<prefix>.v1.org.<organization_id>.client.<client_id>.schedules` (request/reply, queue group
//! `admission`) adds, lists, shows, pauses, resumes and deletes the subject's organization's
//! schedules. A schedule added here submits its scans as the requesting client (a revoked
//! client has them refused) and records `client:<client_id>` as who changed it; another
//! organization's schedule is `not_found`, as one that does not exist. The schedule's request is
//! checked as a scan request off the wire ([`check`], which `palisade schedule add` runs too);
//! `store::schedules` fires it.

use chrono::{DateTime, Utc};
use messages::validate::{invalid, malformed, schema_version};
use messages::{ErrorCode, Subjects, v1};
use prost::Message as _;
use store::PgPool;
use store::schedules::{self, Created, FireRow, NewSchedule, ScheduleRow};
use store::states::ScheduleOverlap;
use uuid::Uuid;

use crate::request::{self, ValidScanRequest};

/// The requests the server answers, as the `server` label of `palisade_requests_total`.
pub const REQUEST_SERVER: &str = "admission.schedules";
/// A page holds this many schedules when the request says 0.
pub const PAGE_DEFAULT: u32 = 50;
/// The most schedules one page holds.
pub const PAGE_MAX: u32 = 500;
/// The fired slots `show` answers with.
pub const FIRES_SHOWN: i64 = 20;
/// The longest reason kept with a change.
pub const REASON_CHARS_MAX: usize = 2_048;

/// A schedule as asked for, before its checks.
#[derive(Debug, Clone)]
pub struct Definition {
    pub organization_id: Uuid,
    pub name: String,
    pub target: String,
    pub plugins: Vec<String>,
    pub priority: i32,
    pub execution_deadline_seconds: u32,
    pub client_id: String,
    pub cron: Option<String>,
    pub every_seconds: Option<i64>,
    /// Empty means UTC.
    pub time_zone: String,
    pub jitter_seconds: i64,
    pub overlap: ScheduleOverlap,
    pub paused: bool,
}

/// Checks a definition as admission checks a scan request off the wire, and its timing; the
/// schedule to create, and its request as admission would read it (for the known-plugin check).
pub fn check(definition: Definition) -> Result<(NewSchedule, ValidScanRequest), v1::Error> {
    let name = definition.name.trim();
    if name.is_empty()
        || name.len() > messages::limits::IDENTIFIER_BYTES_MAX
        || name.chars().any(char::is_control)
    {
        return Err(invalid(format!(
            "name must be 1..={} bytes without control characters",
            messages::limits::IDENTIFIER_BYTES_MAX
        )));
    }
    // The slot's key stands in for the idempotency key.
    let valid = request::validate(&v1::ScanRequest {
        schema_version: messages::SCHEMA_VERSION,
        organization_id: definition.organization_id.to_string(),
        target: definition.target,
        plugins: definition.plugins,
        priority: definition.priority,
        execution_deadline_seconds: definition.execution_deadline_seconds,
        client_id: definition.client_id,
        idempotency_key: "schedule".to_owned(),
    })?;
    let schedule = NewSchedule {
        organization_id: valid.organization_id,
        name: name.to_owned(),
        target: valid.target.clone(),
        plugins: valid.plugins.clone(),
        priority: valid.priority,
        execution_deadline_seconds: valid.execution_deadline_seconds,
        client_id: valid.client_id.clone(),
        cron: definition.cron.filter(|cron| !cron.is_empty()),
        interval_seconds: definition.every_seconds.filter(|seconds| *seconds != 0),
        time_zone: if definition.time_zone.is_empty() {
            "UTC".to_owned()
        } else {
            definition.time_zone
        },
        jitter_seconds: i32::try_from(definition.jitter_seconds).unwrap_or(i32::MAX),
        overlap: definition.overlap,
        paused: definition.paused,
    };
    schedule
        .timing()
        .map_err(|error| invalid(error.to_string()))?;
    Ok((schedule, valid))
}

/// What was asked, within the subject's organization.
#[derive(Debug)]
enum Query {
    Add {
        definition: Box<Definition>,
        reason: String,
    },
    List {
        after: Option<Uuid>,
        limit: i64,
    },
    Show(Uuid),
    SetPaused {
        id: Uuid,
        paused: bool,
        reason: String,
    },
    Delete(Uuid),
}

/// Decodes and validates the request published on `subject`; the organization and the client
/// are the subject's. The error is the answer.
fn parse(
    subjects: &Subjects,
    subject: &str,
    bytes: &[u8],
) -> Result<(Uuid, String, Query), v1::Error> {
    use v1::schedules_request::Query as Wire;
    let request = v1::SchedulesRequest::decode(bytes)
        .map_err(|error| malformed("SchedulesRequest", error))?;
    schema_version(request.schema_version)?;
    let tokens = subjects.client_of(subject);
    let Some((organization_id, client_id)) = tokens.and_then(|tokens| {
        Uuid::parse_str(tokens.organization_id)
            .ok()
            .map(|id| (id, tokens.client_id.to_owned()))
    }) else {
        return Err(invalid(format!(
            "{subject:?} names no organization: ask on <prefix>.v1.org.<organization_id>.client.<client_id>.schedules"
        )));
    };
    let id = |field: &str, text: &str| {
        Uuid::parse_str(text).map_err(|_| invalid(format!("{field} {text:?} is not a UUID")))
    };
    let query = match request.query {
        None => {
            return Err(invalid(
                "query is required: add, list, show, pause, resume or delete",
            ));
        }
        Some(Wire::Add(add)) => add_query(organization_id, &client_id, add)?,
        Some(Wire::List(list)) => Query::List {
            after: match list.after.as_str() {
                "" => None,
                after => Some(id("list.after", after)?),
            },
            limit: match list.limit {
                0 => i64::from(PAGE_DEFAULT),
                limit if limit <= PAGE_MAX => i64::from(limit),
                limit => {
                    return Err(invalid(format!(
                        "list.limit {limit} must be 1..={PAGE_MAX} (0 for {PAGE_DEFAULT})"
                    )));
                }
            },
        },
        Some(Wire::Show(show)) => Query::Show(id("show.schedule_id", &show.schedule_id)?),
        Some(Wire::Pause(change)) => Query::SetPaused {
            id: id("pause.schedule_id", &change.schedule_id)?,
            paused: true,
            reason: reason("pause.reason", change.reason, true)?,
        },
        Some(Wire::Resume(change)) => Query::SetPaused {
            id: id("resume.schedule_id", &change.schedule_id)?,
            paused: false,
            reason: reason("resume.reason", change.reason, true)?,
        },
        Some(Wire::Delete(delete)) => Query::Delete(id("delete.schedule_id", &delete.schedule_id)?),
    };
    Ok((organization_id, client_id, query))
}

/// An `add`'s definition and reason, the schedule's client being the requester.
fn add_query(
    organization_id: Uuid,
    client_id: &str,
    add: v1::AddSchedule,
) -> Result<Query, v1::Error> {
    let overlap = match add.overlap.as_str() {
        "" => ScheduleOverlap::Skip,
        overlap => ScheduleOverlap::parse(overlap)
            .ok_or_else(|| invalid(format!("add.overlap {overlap:?} is not skip or queue")))?,
    };
    Ok(Query::Add {
        reason: reason("add.reason", add.reason, false)?,
        definition: Box::new(Definition {
            organization_id,
            name: add.name,
            target: add.target,
            plugins: add.plugins,
            priority: add.priority,
            execution_deadline_seconds: add.execution_deadline_seconds,
            client_id: client_id.to_owned(),
            cron: Some(add.cron),
            every_seconds: Some(i64::from(add.every_seconds)),
            time_zone: add.time_zone,
            jitter_seconds: i64::from(add.jitter_seconds),
            overlap,
            paused: add.paused,
        }),
    })
}

fn reason(field: &str, text: String, required: bool) -> Result<String, v1::Error> {
    let text = text.trim().to_owned();
    if text.chars().count() > REASON_CHARS_MAX || text.contains('\0') {
        return Err(invalid(format!(
            "{field} must be at most {REASON_CHARS_MAX} characters, without NUL"
        )));
    }
    if required && text.is_empty() {
        return Err(invalid(format!("{field} is required: say why")));
    }
    Ok(text)
}

/// Answers one request; `plugins_known` is admission's known-plugin check.
pub async fn reply(
    pool: &PgPool,
    subjects: &Subjects,
    plugins_known: &(dyn Fn(&ValidScanRequest) -> Result<(), v1::Error> + Sync),
    subject: &str,
    payload: &[u8],
) -> v1::SchedulesReply {
    let (organization_id, client_id, query) = match parse(subjects, subject, payload) {
        Ok(parsed) => parsed,
        Err(error) => return refuse(error),
    };
    let by = format!("client:{client_id}");
    let decided = decide(pool, plugins_known, organization_id, &by, query).await;
    decided.unwrap_or_else(|error| {
        refuse(runtime::internal_error(
            "the schedules request",
            &telemetry::chain(&error),
            "retry the request",
        ))
    })
}

async fn decide(
    pool: &PgPool,
    plugins_known: &(dyn Fn(&ValidScanRequest) -> Result<(), v1::Error> + Sync),
    organization_id: Uuid,
    by: &str,
    query: Query,
) -> Result<v1::SchedulesReply, store::StoreError> {
    use v1::schedules_reply::Answer;
    let now = Utc::now();
    // A schedule of the subject's organization, or none.
    let owned = |row: Option<ScheduleRow>| row.filter(|row| row.organization_id == organization_id);
    Ok(match query {
        Query::Add { definition, reason } => {
            add(
                pool,
                plugins_known,
                organization_id,
                by,
                *definition,
                &reason,
            )
            .await?
        }
        Query::List { after, limit } => {
            let rows = schedules::list(pool, Some(organization_id), after, limit).await?;
            let full = i64::try_from(rows.len()).unwrap_or(i64::MAX) >= limit;
            let next_after = match rows.last() {
                Some(last) if full => last.id.to_string(),
                _ => String::new(),
            };
            answer(Answer::Page(v1::SchedulePage {
                schedules: rows.into_iter().map(|row| view(row, Vec::new())).collect(),
                next_after,
            }))
        }
        Query::Show(id) => match owned(schedules::get(pool, id).await?) {
            Some(row) => {
                let fires = schedules::fires(pool, id, FIRES_SHOWN).await?;
                schedule_answer(view(row, fires))
            }
            None => not_found(id),
        },
        Query::SetPaused { id, paused, reason } => {
            if owned(schedules::get(pool, id).await?).is_none() {
                return Ok(not_found(id));
            }
            match schedules::set_paused(pool, id, paused, now, by, &reason).await? {
                Some(row) => schedule_answer(view(row, Vec::new())),
                None => not_found(id),
            }
        }
        Query::Delete(id) => {
            let Some(row) = owned(schedules::get(pool, id).await?) else {
                return Ok(not_found(id));
            };
            if !schedules::delete(pool, id).await? {
                return Ok(not_found(id));
            }
            let mut deleted = view(row, Vec::new());
            deleted.deleted = true;
            schedule_answer(deleted)
        }
    })
}

/// `add`: checked, then created with its first slot after now.
async fn add(
    pool: &PgPool,
    plugins_known: &(dyn Fn(&ValidScanRequest) -> Result<(), v1::Error> + Sync),
    organization_id: Uuid,
    by: &str,
    definition: Definition,
    reason: &str,
) -> Result<v1::SchedulesReply, store::StoreError> {
    let (schedule, valid) = match check(definition) {
        Ok(checked) => checked,
        Err(error) => return Ok(refuse(error)),
    };
    if let Err(error) = plugins_known(&valid) {
        return Ok(refuse(error));
    }
    Ok(
        match schedules::create(pool, &schedule, Utc::now(), by, reason).await? {
            Err(invalid_timing) => refuse(invalid(invalid_timing.to_string())),
            Ok(Created::UnknownOrganization) => refuse(v1::Error::new(
                ErrorCode::UnknownOrganization,
                format!("organization {organization_id} does not exist"),
            )),
            Ok(Created::TooMany) => refuse(v1::Error::new(
                ErrorCode::QuotaExceeded,
                format!(
                    "the organization has {} schedules, the most it may have; delete one first",
                    schedules::SCHEDULES_PER_ORGANIZATION_MAX
                ),
            )),
            Ok(Created::NameTaken) => refuse(invalid(format!(
                "add.name: the organization has a schedule named {:?} already",
                schedule.name
            ))),
            Ok(Created::Created(id)) => match schedules::get(pool, id).await? {
                Some(row) => schedule_answer(view(row, Vec::new())),
                None => not_found(id),
            },
        },
    )
}

fn answer(answer: v1::schedules_reply::Answer) -> v1::SchedulesReply {
    v1::SchedulesReply {
        error: None,
        answer: Some(answer),
    }
}

fn schedule_answer(schedule: v1::ScheduleView) -> v1::SchedulesReply {
    answer(v1::schedules_reply::Answer::Schedule(schedule))
}

fn refuse(error: v1::Error) -> v1::SchedulesReply {
    v1::SchedulesReply {
        error: Some(error),
        answer: None,
    }
}

fn not_found(id: Uuid) -> v1::SchedulesReply {
    refuse(v1::Error::new(
        ErrorCode::NotFound,
        format!("no schedule {id} in this organization"),
    ))
}

fn unix_ms(at: DateTime<Utc>) -> i64 {
    at.timestamp_millis()
}

fn view(row: ScheduleRow, fires: Vec<FireRow>) -> v1::ScheduleView {
    v1::ScheduleView {
        schedule_id: row.id.to_string(),
        name: row.name,
        target: row.target,
        plugins: row.plugins,
        priority: row.priority,
        execution_deadline_seconds: row.execution_deadline_seconds.map_or(0, i32::unsigned_abs),
        client_id: row.client_id,
        cron: row.cron.unwrap_or_default(),
        every_seconds: row
            .interval_seconds
            .map_or(0, |seconds| u32::try_from(seconds).unwrap_or(u32::MAX)),
        time_zone: row.time_zone,
        jitter_seconds: row.jitter_seconds.unsigned_abs(),
        overlap: row.overlap,
        paused: row.paused,
        next_slot_unix_ms: unix_ms(row.next_slot),
        next_fire_unix_ms: unix_ms(row.next_fire_at),
        updated_by: row.updated_by,
        update_reason: row.update_reason,
        updated_at_unix_ms: unix_ms(row.updated_at),
        fires: fires
            .into_iter()
            .map(|fire| v1::ScheduleFire {
                slot_unix_ms: unix_ms(fire.slot),
                fired_at_unix_ms: unix_ms(fire.fired_at),
                outcome: fire.outcome,
                scan_id: fire.scan_id.map(|id| id.to_string()).unwrap_or_default(),
                missed_before: fire.missed_before.unsigned_abs(),
                detail: fire.detail,
            })
            .collect(),
        deleted: false,
    }
}
