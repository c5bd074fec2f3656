//! `palisade schedule` (issue 27, item 1): recurring scans an organization's scan request is
//! submitted by, at every slot of a cron expression in a time zone or of an interval. The
//! reaper's leader fires each slot once, through the admission script (`store::schedules` says
//! how, and the catch-up rule); these commands create, read, pause, resume and delete them,
//! recording who changed one and why. Each answers as text, or as JSON with `--output json`.

use std::time::Duration;

use chrono::Utc;
use store::PgPool;
use store::schedules::{self, Created, FireRow, ScheduleRow};
use store::states::ScheduleOverlap;
use uuid::Uuid;

use crate::cli_support::{ChangeArgs, Json, Output, field, instant, print, table};
use crate::exit;

/// `palisade schedule …`.
#[derive(Debug, clap::Subcommand)]
pub enum ScheduleCommand {
    /// Creates a schedule: its scan request, when it fires (`--cron` or `--every`) and what a
    /// slot does while the target still has an active scan (`--overlap`).
    Add(Box<AddArgs>),
    /// Schedules in creation order, of one organization or all.
    List {
        #[arg(long)]
        org: Option<Uuid>,
        /// The next page: the last id of the previous one.
        #[arg(long)]
        after: Option<Uuid>,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=1000))]
        limit: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// One schedule, its next slot and its latest fired slots (what admission answered).
    Show {
        id: Uuid,
        /// How many fired slots to show, newest first.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..=1000))]
        fires: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Stops firing a schedule until it is resumed.
    Pause(ChangeArgs),
    /// Fires a paused schedule again from its first slot after now (slots that passed while it
    /// was paused never fire).
    Resume(ChangeArgs),
    /// Removes a schedule and its fire records; the scans it submitted stay.
    Delete {
        id: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

/// `palisade schedule add`.
#[derive(Debug, clap::Args)]
pub struct AddArgs {
    #[arg(long)]
    pub org: Uuid,
    /// Unique in the organization.
    #[arg(long)]
    pub name: String,
    #[arg(long)]
    pub target: String,
    /// Comma-separated plugins, run in order.
    #[arg(long, value_delimiter = ',', required = true)]
    pub plugins: Vec<String>,
    /// Five fields (minute hour day-of-month month day-of-week) or a nickname (`@daily`), read
    /// in --time-zone.
    #[arg(long, required_unless_present = "every", conflicts_with = "every")]
    pub cron: Option<String>,
    /// An interval (`15m`, `6h`, `1day`; at least a minute): slots at its multiples since
    /// 1970-01-01T00:00Z, so `--every 1h` fires on the hour.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub every: Option<Duration>,
    /// The IANA time zone --cron is read in.
    #[arg(long, default_value = "UTC")]
    pub time_zone: String,
    /// Each slot fires up to this much late (a delay fixed per slot), so schedules on the same
    /// minute do not all start at once.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0s")]
    pub jitter: Duration,
    /// While the target still has an active scan: `skip` records the slot skipped; `queue`
    /// fires it once the target is free.
    #[arg(long, value_enum, default_value_t = Overlap::Skip)]
    pub overlap: Overlap,
    #[arg(long, default_value_t = 0)]
    pub priority: i32,
    #[arg(long, default_value_t = 0)]
    pub deadline_secs: u32,
    /// The client its scans are requested as (a registered client that is revoked has them
    /// refused).
    #[arg(long, default_value = "schedules")]
    pub client: String,
    /// Create it paused.
    #[arg(long)]
    pub paused: bool,
    /// Why (kept with it).
    #[arg(long, default_value = "")]
    pub reason: String,
    /// Who (default: $USER).
    #[arg(long)]
    pub by: Option<String>,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
}

/// `--overlap`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Overlap {
    Skip,
    Queue,
}

impl From<Overlap> for ScheduleOverlap {
    fn from(overlap: Overlap) -> Self {
        match overlap {
            Overlap::Skip => ScheduleOverlap::Skip,
            Overlap::Queue => ScheduleOverlap::Queue,
        }
    }
}

/// Runs one `palisade schedule` command.
pub async fn run(common: &runtime::CommonSettings, command: ScheduleCommand) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    match command {
        ScheduleCommand::Add(args) => print_schedule(args.output, &add(&pool, &args).await?),
        ScheduleCommand::List {
            org,
            after,
            limit,
            output,
        } => print_list(
            output,
            &schedules::list(&pool, org, after, limit).await?,
            limit,
        ),
        ScheduleCommand::Show { id, fires, output } => {
            let schedule = read(&pool, id).await?;
            let fires = schedules::fires(&pool, id, fires).await?;
            print_shown(output, &schedule, &fires)
        }
        ScheduleCommand::Pause(change) => {
            print_schedule(change.output, &set_paused(&pool, &change, true).await?)
        }
        ScheduleCommand::Resume(change) => {
            print_schedule(change.output, &set_paused(&pool, &change, false).await?)
        }
        ScheduleCommand::Delete { id, output } => {
            let schedule = read(&pool, id).await?;
            if !schedules::delete(&pool, id).await? {
                return Err(not_found(id));
            }
            print(
                output,
                Json::Pretty,
                &serde_json::json!({ "deleted": schedule }),
                |_| {
                    format!(
                        "schedule {id} ({}) deleted; the scans it submitted stay",
                        schedule.name
                    )
                },
            )
        }
    }
}

/// A schedule as `add`, `pause` and `resume` answer.
fn print_schedule(output: Output, schedule: &ScheduleRow) -> anyhow::Result<()> {
    print(
        output,
        Json::Pretty,
        &serde_json::to_value(schedule)?,
        |_| schedule_text(schedule),
    )
}

/// `palisade schedule show`: the schedule, then its latest fired slots, newest first.
fn print_shown(output: Output, schedule: &ScheduleRow, fires: &[FireRow]) -> anyhow::Result<()> {
    let mut shown = serde_json::to_value(schedule)?;
    shown["fires"] = serde_json::to_value(fires)?;
    print(output, Json::Pretty, &shown, |_| {
        let fired = table(
            &format!(
                "{:<20} {:<20} {:<18} {:<36} {:>6} detail",
                "slot", "fired", "outcome", "scan", "missed"
            ),
            fires.iter().map(|fire| {
                format!(
                    "{:<20} {:<20} {:<18} {:<36} {:>6} {}",
                    instant(&fire.slot),
                    instant(&fire.fired_at),
                    fire.outcome,
                    fire.scan_id.map(|id| id.to_string()).unwrap_or_default(),
                    fire.missed_before,
                    fire.detail
                )
            }),
        );
        format!("{}\n\n{fired}", schedule_text(schedule))
    })
}

/// `palisade schedule list` as text or JSON.
fn print_list(output: Output, listed: &[ScheduleRow], limit: i64) -> anyhow::Result<()> {
    crate::cli_support::print_page(
        output,
        listed,
        limit,
        &format!(
            "{:<36} {:<24} {:<7} {:<20} {:<32} target",
            "id", "name", "state", "next slot", "when"
        ),
        |schedule| {
            format!(
                "{:<36} {:<24} {:<7} {:<20} {:<32} {}",
                schedule.id,
                schedule.name,
                state(schedule),
                instant(&schedule.next_slot),
                when(schedule),
                schedule.target
            )
        },
        |schedule| schedule.id.to_string(),
    )
}

/// A schedule as text, a field a line.
fn schedule_text(schedule: &ScheduleRow) -> String {
    let changed = if schedule.update_reason.is_empty() {
        format!(
            "{} by {}",
            instant(&schedule.updated_at),
            schedule.updated_by
        )
    } else {
        format!(
            "{} by {}: {}",
            instant(&schedule.updated_at),
            schedule.updated_by,
            schedule.update_reason
        )
    };
    [
        field("schedule", format!("{} ({})", schedule.id, schedule.name)),
        field("org", schedule.organization_id),
        field("state", state(schedule)),
        field(
            "when",
            format!(
                "{}, jitter {} s, overlap {}",
                when(schedule),
                schedule.jitter_seconds,
                schedule.overlap
            ),
        ),
        field("next slot", instant(&schedule.next_slot)),
        field("target", &schedule.target),
        field("profile", schedule.plugins.join(" -> ")),
        field(
            "client",
            format!("{}, priority {}", schedule.client_id, schedule.priority),
        ),
        field(
            "created",
            format!(
                "{} by {}",
                instant(&schedule.created_at),
                schedule.created_by
            ),
        ),
        field("changed", changed),
    ]
    .join("\n")
}

/// `active` or `paused`.
fn state(schedule: &ScheduleRow) -> &'static str {
    if schedule.paused { "paused" } else { "active" }
}

/// `cron 0 3 * * * Europe/Berlin` or `every 6h`.
fn when(schedule: &ScheduleRow) -> String {
    match (&schedule.cron, schedule.interval_seconds) {
        (Some(cron), _) => format!("cron {cron} {}", schedule.time_zone),
        (None, Some(seconds)) => format!(
            "every {}",
            humantime::format_duration(Duration::from_secs(seconds.unsigned_abs()))
        ),
        (None, None) => "never".to_owned(),
    }
}

/// `palisade schedule add`: the request is checked as admission checks one off the wire, the
/// timing by `store::schedules`; exit 4 with what to fix when either is refused.
pub async fn add(pool: &PgPool, args: &AddArgs) -> anyhow::Result<ScheduleRow> {
    let (schedule, _) = admission::schedules::check(admission::schedules::Definition {
        organization_id: args.org,
        name: args.name.clone(),
        target: args.target.clone(),
        plugins: args.plugins.clone(),
        priority: args.priority,
        execution_deadline_seconds: args.deadline_secs,
        client_id: args.client.clone(),
        cron: args.cron.clone(),
        every_seconds: args
            .every
            .map(|every| i64::try_from(every.as_secs()).unwrap_or(i64::MAX)),
        time_zone: args.time_zone.clone(),
        jitter_seconds: i64::try_from(args.jitter.as_secs()).unwrap_or(i64::MAX),
        overlap: args.overlap.into(),
        paused: args.paused,
    })
    .map_err(|error| exit::refused(format!("{}: {}", error.code, error.message)))?;
    let by = crate::commands::actor(args.by.clone());
    let created = schedules::create(pool, &schedule, Utc::now(), &by, args.reason.trim())
        .await?
        .map_err(|invalid| exit::refused(format!("invalid_field: {invalid}")))?;
    match created {
        Created::Created(id) => read(pool, id).await,
        Created::UnknownOrganization => Err(exit::refused(format!(
            "unknown_organization: no organization {}; create it with palisade org add",
            args.org
        ))),
        Created::TooMany => Err(exit::refused(format!(
            "quota_exceeded: organization {} has {} schedules, the most it may have; delete one first",
            args.org,
            schedules::SCHEDULES_PER_ORGANIZATION_MAX
        ))),
        Created::NameTaken => Err(exit::refused(format!(
            "name_taken: organization {} has a schedule named {:?} already; choose another \
             name, or delete that one (palisade schedule list --org {})",
            args.org, schedule.name, args.org
        ))),
    }
}

async fn set_paused(
    pool: &PgPool,
    change: &ChangeArgs,
    paused: bool,
) -> anyhow::Result<ScheduleRow> {
    let reason = change.reason.trim();
    if reason.is_empty() {
        return Err(exit::refused(
            "invalid_field: say why with --reason (it is kept with the schedule)",
        ));
    }
    let by = crate::commands::actor(change.by.clone());
    schedules::set_paused(pool, change.id, paused, Utc::now(), &by, reason)
        .await?
        .ok_or_else(|| not_found(change.id))
}

async fn read(pool: &PgPool, id: Uuid) -> anyhow::Result<ScheduleRow> {
    schedules::get(pool, id).await?.ok_or_else(|| not_found(id))
}

fn not_found(id: Uuid) -> anyhow::Error {
    exit::not_found(format!("not_found: no schedule {id}"))
}
