//! `palisade org`: organizations (tenants): add one, change its limits, show it, list them.

use runtime::CommonSettings;
use uuid::Uuid;

use crate::cli_support::{Json, Output, PageArgs, Why, print};

/// `palisade org …`.
#[derive(Debug, clap::Subcommand)]
pub enum OrgCommand {
    /// Create an organization; prints its id.
    Add {
        #[arg(long)]
        name: String,
        /// Scans admitted per rolling hour.
        #[arg(long)]
        hourly_quota: Option<i32>,
        #[arg(long)]
        id: Option<Uuid>,
    },
    /// Change a live organization's limits; admission applies the quota from its next decision,
    /// dispatch the cap on tasks in flight from its next grant.
    /// Prints the limits it changed, before and after (with `--output json`, on one line).
    Set {
        id: Uuid,
        /// Scans admitted per rolling hour (0 admits none).
        #[arg(long, conflicts_with = "no_hourly_quota", value_parser = clap::value_parser!(i32).range(0..))]
        hourly_quota: Option<i32>,
        /// No hourly quota.
        #[arg(long)]
        no_hourly_quota: bool,
        /// Tasks of the organization in flight (leased or running) at once, over every worker
        /// (0 leases none).
        #[arg(long, conflicts_with = "no_max_running_tasks", value_parser = clap::value_parser!(i32).range(0..))]
        max_running_tasks: Option<i32>,
        /// No cap on tasks in flight.
        #[arg(long)]
        no_max_running_tasks: bool,
        #[command(flatten)]
        why: Why,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// An organization: its limits, workers, clients and schedules, and the latest changes of
    /// its access and limits (who and why).
    Show {
        id: Uuid,
        /// How many changes to show, newest first.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..=1000))]
        changes: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Organizations in id order, a page at a time: their limits and how many workers serve
    /// them, clients act for them and schedules they have.
    List(PageArgs),
}

/// Runs one `palisade org` command.
pub async fn run(common: &CommonSettings, command: OrgCommand) -> anyhow::Result<()> {
    match command {
        OrgCommand::Add {
            name,
            hourly_quota,
            id,
        } => {
            let pool = store::connect(&common.database).await?;
            let id = id.unwrap_or_else(Uuid::now_v7);
            store::admin::create_organization(&pool, id, &name, hourly_quota).await?;
            println!("{id}");
            Ok(())
        }
        OrgCommand::Set {
            id,
            hourly_quota,
            no_hourly_quota,
            max_running_tasks,
            no_max_running_tasks,
            why,
            output,
        } => {
            let quota = (hourly_quota.is_some() || no_hourly_quota).then_some(hourly_quota);
            let cap =
                (max_running_tasks.is_some() || no_max_running_tasks).then_some(max_running_tasks);
            let answer = set(common, id, quota, cap, why).await?;
            print(output, Json::Line, &answer, set_text)
        }
        OrgCommand::Show {
            id,
            changes,
            output,
        } => {
            let pool = store::connect(&common.database).await?;
            let shown = crate::tenants::organization(&pool, id, changes).await?;
            // Through a `serde_json::Value`: its keys in alphabetical order, as it always printed.
            print(output, Json::Pretty, &serde_json::to_value(&shown)?, |_| {
                crate::tenants::organization_text(&shown)
            })
        }
        OrgCommand::List(page) => {
            let pool = store::connect(&common.database).await?;
            let organizations = store::admin::organizations(&pool, page.after, page.limit).await?;
            print_list(page.output, &organizations, page.limit)
        }
    }
}

/// `palisade org list` as text or JSON.
fn print_list(
    output: Output,
    organizations: &[store::admin::OrganizationSummary],
    limit: i64,
) -> anyhow::Result<()> {
    let limit_text = |limit: Option<i32>| limit.map_or_else(|| "-".to_owned(), |n| n.to_string());
    crate::cli_support::print_page(
        output,
        organizations,
        limit,
        &format!(
            "{:<36} {:>12} {:>11} {:>7} {:>7} {:>9} {:<20} name",
            "id", "hourly quota", "max running", "workers", "clients", "schedules", "created"
        ),
        |organization| {
            format!(
                "{:<36} {:>12} {:>11} {:>7} {:>7} {:>9} {:<20} {}",
                organization.id,
                limit_text(organization.hourly_scan_quota),
                limit_text(organization.max_running_tasks),
                organization.workers,
                organization.clients,
                organization.schedules,
                crate::cli_support::instant(&organization.created_at),
                organization.name
            )
        },
        |organization| organization.id.to_string(),
    )
}

/// `palisade org set`: `None` leaves a limit as it is, `Some(None)` removes it. The answer:
/// `{id, hourly_quota: {before, after}, max_running_tasks: {before, after}}`, each limit only
/// when it was set.
async fn set(
    common: &CommonSettings,
    id: Uuid,
    quota: Option<Option<i32>>,
    cap: Option<Option<i32>>,
    why: Why,
) -> anyhow::Result<serde_json::Value> {
    let by = crate::commands::actor(why.by);
    let change = store::audit::Change::new(&by, why.reason.trim());
    if quota.is_none() && cap.is_none() {
        return Err(crate::exit::refused(
            "nothing_to_set: give --hourly-quota <n> or --no-hourly-quota, --max-running-tasks <n> or --no-max-running-tasks",
        ));
    }
    let pool = store::connect(&common.database).await?;
    let missing = |()| crate::exit::not_found(format!("not_found: no organization {id}"));
    let mut answer = serde_json::json!({ "id": id });
    if let Some(quota) = quota {
        let previous = store::admin::set_hourly_quota(&pool, id, quota, &change)
            .await?
            .map_err(missing)?;
        answer["hourly_quota"] = serde_json::json!({"before": previous, "after": quota});
    }
    if let Some(cap) = cap {
        let previous = store::admin::set_max_running_tasks(&pool, id, cap, &change)
            .await?
            .map_err(missing)?;
        answer["max_running_tasks"] = serde_json::json!({"before": previous, "after": cap});
    }
    Ok(answer)
}

/// `palisade org set` as text: `organization <id>: hourly quota 7 -> none, max running tasks
/// none -> 3`.
fn set_text(answer: &serde_json::Value) -> String {
    let limit = |value: &serde_json::Value| match value {
        serde_json::Value::Null => "none".to_owned(),
        value => value.to_string(),
    };
    let changed: Vec<String> = [
        ("hourly quota", "hourly_quota"),
        ("max running tasks", "max_running_tasks"),
    ]
    .into_iter()
    .filter(|(_, key)| answer.get(key).is_some())
    .map(|(name, key)| {
        format!(
            "{name} {} -> {}",
            limit(&answer[key]["before"]),
            limit(&answer[key]["after"])
        )
    })
    .collect();
    format!(
        "organization {}: {}",
        answer["id"].as_str().unwrap_or_default(),
        changed.join(", ")
    )
}
