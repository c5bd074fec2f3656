//! `palisade worker show` and `palisade org show` (issue 27, item 5): a worker or an
//! organization with its access and limits, and the latest changes of them, each with who made
//! it and why (`store::audit`); as JSON, or as text a field a line with a table of each.

use serde::Serialize;
use store::PgPool;
use store::audit::{OrganizationView, Recorded, WorkerView};
use uuid::Uuid;

use crate::cli_support::{field, instant, instant_or_dash, table};
use crate::exit;

/// A worker as `palisade worker show` prints it: its record with `changes` beside its fields.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerShown {
    #[serde(flatten)]
    pub worker: WorkerView,
    /// Newest first.
    pub changes: Vec<Recorded>,
}

/// An organization as `palisade org show` prints it: its record with `changes` beside its
/// fields.
#[derive(Debug, Clone, Serialize)]
pub struct OrganizationShown {
    #[serde(flatten)]
    pub organization: OrganizationView,
    /// Newest first.
    pub changes: Vec<Recorded>,
}

/// `palisade worker show`: the worker, its organizations, and its latest `changes` changes.
pub async fn worker(pool: &PgPool, id: Uuid, changes: i64) -> anyhow::Result<WorkerShown> {
    let worker = store::audit::worker(pool, id)
        .await?
        .ok_or_else(|| exit::not_found(format!("not_found: no worker {id}")))?;
    let changes = store::audit::recent(pool, Some(id), None, &[], changes).await?;
    Ok(WorkerShown { worker, changes })
}

/// `palisade org show`: the organization, its workers and clients, and the latest `changes`
/// changes of its limits, its assignments and its clients.
pub async fn organization(
    pool: &PgPool,
    id: Uuid,
    changes: i64,
) -> anyhow::Result<OrganizationShown> {
    let organization = store::audit::organization(pool, id)
        .await?
        .ok_or_else(|| exit::not_found(format!("not_found: no organization {id}")))?;
    let changes =
        store::audit::recent(pool, None, Some(id), &organization.client_ids, changes).await?;
    Ok(OrganizationShown {
        organization,
        changes,
    })
}

/// `palisade worker show` as text.
pub fn worker_text(shown: &WorkerShown) -> String {
    let worker = &shown.worker;
    let state = match worker.revoked_at {
        None if worker.enabled => "enabled".to_owned(),
        None => "revoked".to_owned(),
        Some(at) => format!("revoked at {}: {}", instant(&at), worker.revocation_reason),
    };
    let assignments = assignments_text(&worker.organizations, "organization", "organization_id");
    [
        field("worker", format!("{} ({})", worker.id, worker.name)),
        field("state", state),
        field(
            "capacity",
            format!("{}, {} live leases", worker.capacity, worker.live_leases),
        ),
        field("declares", or_dash(&worker.capabilities.join(","))),
        field(
            "may declare",
            worker
                .allowed_capabilities
                .as_ref()
                .map_or_else(|| "anything".to_owned(), |allowed| allowed.join(",")),
        ),
        field("enrolled", if worker.enrolled { "yes" } else { "no" }),
        field("version", or_dash(&worker.software_version)),
        field("last hello", instant_or_dash(worker.last_seen_at.as_ref())),
        field("created", instant(&worker.created_at)),
        format!("\n{assignments}"),
        format!("\n{}", changes_text(&shown.changes)),
    ]
    .join("\n")
}

/// `palisade org show` as text.
pub fn organization_text(shown: &OrganizationShown) -> String {
    let organization = &shown.organization;
    let limit = |limit: Option<i32>| limit.map_or_else(|| "none".to_owned(), |n| n.to_string());
    let workers = assignments_text(&organization.workers, "worker", "worker_id");
    let clients = table(
        &format!(
            "{:<24} {:<20} {:<20} why revoked",
            "client", "name", "revoked"
        ),
        rows(&organization.clients, |entry| {
            format!(
                "{:<24} {:<20} {:<20} {}",
                text(&entry["id"]),
                text(&entry["name"]),
                json_instant(&entry["revoked_at"]),
                text(&entry["revocation_reason"])
            )
        }),
    );
    [
        field(
            "org",
            format!("{} ({})", organization.id, organization.name),
        ),
        field(
            "quota",
            format!("{} scans an hour", limit(organization.hourly_scan_quota)),
        ),
        field(
            "in flight",
            format!(
                "{} tasks, at most {}",
                organization.tasks_in_flight,
                limit(organization.max_running_tasks)
            ),
        ),
        field("schedules", organization.schedules),
        field("created", instant(&organization.created_at)),
        format!("\n{workers}"),
        format!("\n{clients}"),
        format!("\n{}", changes_text(&shown.changes)),
    ]
    .join("\n")
}

/// The changes as a table, newest first.
fn changes_text(changes: &[Recorded]) -> String {
    table(
        &format!(
            "{:<20} {:<16} {:<24} {:<36} why",
            "changed", "by", "action", "of"
        ),
        changes.iter().map(|change| {
            let of = change
                .worker_id
                .map(|id| format!("worker {id}"))
                .or_else(|| change.client_id.as_ref().map(|id| format!("client {id}")))
                .or_else(|| change.organization_id.map(|id| format!("org {id}")))
                .unwrap_or_default();
            let line = format!(
                "{:<20} {:<16} {:<24} {:<36} {}",
                instant(&change.at),
                change.actor,
                change.action,
                of,
                change.reason
            );
            line.trim_end().to_owned()
        }),
    )
}

/// Assignments of workers to organizations as a table: a worker's (each named by its
/// `organization_id`) or an organization's (by `worker_id`).
fn assignments_text(assignments: &serde_json::Value, named: &str, id_key: &str) -> String {
    table(
        &format!(
            "{named:<36} {:<8} {:<20} {:<20} why revoked",
            "state", "assigned", "revoked"
        ),
        rows(assignments, |entry| {
            format!(
                "{:<36} {:<8} {:<20} {:<20} {}",
                text(&entry[id_key]),
                if entry["enabled"] == true {
                    "enabled"
                } else {
                    "revoked"
                },
                json_instant(&entry["assigned_at"]),
                json_instant(&entry["revoked_at"]),
                text(&entry["revocation_reason"])
            )
        }),
    )
}

/// Each entry of a JSON array (`organizations`, `workers`, `clients`) as a line.
fn rows<'a>(
    array: &'a serde_json::Value,
    line: impl Fn(&serde_json::Value) -> String + 'a,
) -> impl Iterator<Item = String> + 'a {
    array.as_array().into_iter().flatten().map(line)
}

/// A JSON string as it is, anything else as JSON, `-` for null or empty.
fn text(value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) => or_dash(text),
        serde_json::Value::Null => "-".to_owned(),
        value => value.to_string(),
    }
}

/// A timestamp PostgreSQL wrote into JSON, as text output prints instants; `-` for null.
fn json_instant(value: &serde_json::Value) -> String {
    value
        .as_str()
        .and_then(|at| chrono::DateTime::parse_from_rfc3339(at).ok())
        .map_or_else(
            || text(value),
            |at| instant(&at.with_timezone(&chrono::Utc)),
        )
}

fn or_dash(text: &str) -> String {
    if text.is_empty() {
        "-".to_owned()
    } else {
        text.to_owned()
    }
}
