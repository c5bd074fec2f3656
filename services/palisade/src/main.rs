//! The `palisade` command: run everything for development, migrate, submit and inspect scans,
//! administer workers, run the demo and the benchmark, probe a service's readiness (`health`).

use std::time::Duration;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use palisade::bench::{self, BenchOptions, Scenario};
use palisade::demo::{self, DemoOptions};
use palisade::probe;
use palisade::system::{self, System, SystemSettings};
use palisade::{exit, migrate, scans};
use runtime::CommonSettings;
use tracing::Instrument as _;
use uuid::Uuid;

/// palisade: durable security scans on remote workers over NATS JetStream and PostgreSQL.
///
/// Connection settings come from the environment: DATABASE_URL (default
/// postgres://postgres@127.0.0.1:5432/palisade), NATS_URL (default nats://127.0.0.1:4222),
/// PALISADE_SUBJECT_PREFIX (default palisade).
///
/// One-shot commands print only their answer on standard output and log to standard error at
/// `warn` (`-v` info, `-vv` debug, `-vvv` trace; RUST_LOG, when set, decides instead). Exit
/// status: 0 done, 1 failed, 2 wrong command line, 3 not found, 4 refused, 5 the scan did not
/// complete or the gate did not pass, 6 migrations pending (`migrate --check`).
#[derive(Debug, Parser)]
#[command(name = "palisade", version)]
struct Cli {
    /// Log more on standard error: -v info, -vv debug, -vvv trace.
    #[arg(short, long, action = clap::ArgAction::Count, global = true)]
    verbose: u8,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Migrate, provision, and run all five services and N reference workers in one process.
    Dev {
        #[arg(long, default_value_t = 2)]
        workers: usize,
        #[arg(long, default_value_t = 8)]
        capacity: u32,
    },
    /// Create the database if needed and apply every pending migration, after a preflight that
    /// changes nothing and refuses (exit 4) a PostgreSQL too old, a role that may not create
    /// in the schema, or a schema newer than this build.
    Migrate {
        /// Change nothing: exit 0 when the database is up to date, 6 when migrations are
        /// pending (listed on standard output), 4 when `migrate` would be refused.
        #[arg(long)]
        check: bool,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Run everything in-process against a fresh database and submit a realistic load.
    Demo {
        #[arg(long, default_value_t = 1_000)]
        scans: usize,
        #[arg(long, default_value_t = 4)]
        workers: usize,
        #[arg(long, default_value_t = 32)]
        capacity: u32,
        #[arg(long, default_value_t = 128)]
        concurrency: usize,
        #[arg(long, default_value_t = 10)]
        duplicate_percent: usize,
        #[arg(long, default_value_t = 5)]
        conflict_percent: usize,
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// Keep the demo database afterwards (it is dropped by default).
        #[arg(long)]
        keep_database: bool,
    },
    /// Measure throughput, latency and cost per scan in-process against a fresh database,
    /// next to the fenced-step ceiling of the same PostgreSQL; prints a table, then JSON.
    Bench {
        /// Scenarios to run (all by default).
        #[arg(long, value_enum, value_delimiter = ',')]
        only: Vec<Scenario>,
        /// Scans of the one-plugin burn-down.
        #[arg(long, default_value_t = 2_000)]
        scans: usize,
        /// Scans of the three-plugin burn-down (default: --scans).
        #[arg(long)]
        profile_scans: Option<usize>,
        /// Offered load of the steady scenario, scans per second.
        #[arg(long, default_value_t = 50.0)]
        rate: f64,
        /// Seconds the steady load is offered.
        #[arg(long, default_value_t = 10.0)]
        duration: f64,
        #[arg(long, default_value_t = 4)]
        workers: usize,
        #[arg(long, default_value_t = 64)]
        capacity: u32,
        /// Requests awaiting their PubAck at once in a burn-down.
        #[arg(long, default_value_t = 256)]
        in_flight: usize,
        /// Connections running the fenced step at once.
        #[arg(long, default_value_t = 16)]
        ceiling_connections: usize,
        /// Seconds the fenced step runs.
        #[arg(long, default_value_t = 3.0)]
        ceiling_secs: f64,
        /// Give up waiting for a scenario's scans after this long.
        #[arg(long, default_value_t = 600)]
        timeout_secs: u64,
        /// Also write the JSON document to this file.
        #[arg(long)]
        json: Option<std::path::PathBuf>,
        /// Keep the benchmark's database afterwards (it is dropped by default).
        #[arg(long)]
        keep_database: bool,
        /// Completed one-plugin scans of history written before the scenarios run, to
        /// measure against full tables (e.g. 1000000).
        #[arg(long, default_value_t = 0)]
        history: usize,
    },
    /// Organizations (tenants).
    #[command(subcommand)]
    Org(OrgCommand),
    /// Scans.
    #[command(subcommand)]
    Scan(ScanCommand),
    /// Tasks (one plugin execution each).
    #[command(subcommand)]
    Task(TaskCommand),
    /// Workers.
    #[command(subcommand)]
    Worker(WorkerCommand),
    /// Clients: services that submit scans for the organizations they are bound to.
    #[command(subcommand)]
    Client(ClientCommand),
    /// Identity on NATS: the authority that issues every credential, and revocations.
    #[command(subcommand)]
    Nats(NatsCommand),
    /// The local CVE table enrichment reads.
    #[command(subcommand)]
    Cve(CveCommand),
    /// Findings: read them, set their dispositions, delete them.
    #[command(subcommand)]
    Finding(FindingCommand),
    /// Artifacts: files plugins uploaded as evidence of a scan (an SBOM, a report).
    #[command(subcommand)]
    Artifact(ArtifactCommand),
    /// The unfinished tasks by organization, plugin and state: how many, how many due, how long
    /// the oldest due one has waited.
    Queue {
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Messages a consumer gave up on after their last delivery: list, read, replay, discard.
    #[command(subcommand)]
    DeadLetter(palisade::dead_letters::DeadLetterCommand),
    /// Recurring scans: add, list, show, pause, resume, delete.
    #[command(subcommand)]
    Schedule(palisade::schedules::ScheduleCommand),
    /// Ask a service's /readyz once (the container health check): exits 0 when ready, 1 with
    /// the failing checks otherwise.
    Health {
        /// What to ask; by default /readyz at PALISADE_HTTP_ADDR over loopback.
        #[arg(long)]
        url: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum CveCommand {
    /// Import NVD JSON 2.0 files (data feeds such as nvdcve-2.0-2024.json, .json.gz too, or
    /// saved API pages) into the local CVE table, for sites without internet; a file or a
    /// folder of them. Prints a line per file on stderr, then a JSON summary.
    Import { path: std::path::PathBuf },
    /// The local CVE table: how many ids it holds, where the NVD sync stands, and the upstream
    /// records stored sanitised or set aside (quarantined), most recently seen first; JSON.
    Status {
        /// Quarantined records listed at most.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(1..=1000))]
        limit: i64,
    },
}

#[derive(Debug, Subcommand)]
enum OrgCommand {
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
    /// Prints the organization's limits before and after, as JSON.
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
    },
    /// An organization: its limits, workers, clients and schedules, and the latest changes of
    /// its access and limits (who and why), as JSON.
    Show {
        id: Uuid,
        /// How many changes to show, newest first.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..=1000))]
        changes: i64,
    },
}

#[derive(Debug, Subcommand)]
enum ScanCommand {
    /// Submit a scan request and print admission's answer.
    Submit {
        #[arg(long)]
        org: Uuid,
        #[arg(long)]
        target: String,
        /// Comma-separated plugins, run in order.
        #[arg(long, value_delimiter = ',')]
        plugins: Vec<String>,
        #[arg(long, default_value = "cli")]
        client: String,
        /// Idempotency key; a fresh one when omitted.
        #[arg(long)]
        key: Option<String>,
        #[arg(long, default_value_t = 0)]
        priority: i32,
        #[arg(long, default_value_t = 0)]
        deadline_secs: u32,
        /// Follow the scan to its end (progress on standard error; reads it from PostgreSQL,
        /// so DATABASE_URL too), then print it as `scan show` does: exits 0 when it
        /// completed, 5 when it failed or was cancelled.
        #[arg(long)]
        wait: bool,
        /// With --wait: give up (exit 1) after this long; the scan goes on.
        #[arg(long, default_value_t = 3_600, requires = "wait")]
        timeout_secs: u64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Show a scan, its plugin jobs and its findings.
    Show {
        scan_id: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Scans newest first by admission, filtered; a page at a time (`--after` the last id of
    /// the previous page gives the next).
    List {
        #[arg(long)]
        org: Option<Uuid>,
        /// The target, exactly as submitted.
        #[arg(long)]
        target: Option<String>,
        /// pending, running, completed, failed or cancelled (as `scan show` reports it).
        #[arg(long)]
        state: Option<String>,
        /// Scans whose profile runs this plugin.
        #[arg(long)]
        plugin: Option<String>,
        /// Admitted at or after this instant (RFC 3339, e.g. 2026-12-01T00:00:00Z).
        #[arg(long)]
        since: Option<chrono::DateTime<chrono::Utc>>,
        /// Admitted before this instant (RFC 3339).
        #[arg(long)]
        until: Option<chrono::DateTime<chrono::Utc>>,
        /// Requested by this client id.
        #[arg(long)]
        client: Option<String>,
        #[arg(long)]
        after: Option<Uuid>,
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(i64).range(1..=1000))]
        limit: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Cancel a scan: its unfinished tasks end now, a running worker stops at its next renew.
    Cancel {
        scan_id: Uuid,
        #[arg(long, default_value = "cancelled from the command line")]
        reason: String,
    },
    /// Ask for a completed scan's enrichment: prints {scan_id, job_id, status, outcome,
    /// message} as JSON. A failed job is requeued with a fresh retry budget; a pending,
    /// running or completed one is left as it is.
    Enrich { scan_id: Uuid },
    /// The scan's finding summary and gate: its state, whether it is complete (every plugin
    /// completed with its evidence), and whether the gate passes (complete, and no open or
    /// needs_review finding at or above --threshold); exits 5 when it does not.
    Gate {
        scan_id: Uuid,
        #[arg(long, default_value = "high", value_parser = parse_severity)]
        threshold: store::states::Severity,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
}

#[derive(Debug, Subcommand)]
enum ArtifactCommand {
    /// A scan's artifacts, in the order they were committed.
    List {
        #[arg(long)]
        scan: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Downloads an artifact, checking its size and sha256 against what was verified when it
    /// was committed (a difference is an error and nothing is written).
    Get {
        id: Uuid,
        /// Where to write it; `-` (the default) is standard output.
        #[arg(long, default_value = "-")]
        out: std::path::PathBuf,
    },
}

/// How a command prints its answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
}

fn parse_severity(text: &str) -> Result<store::states::Severity, String> {
    store::states::Severity::parse(text).ok_or_else(|| {
        format!(
            "{text:?} is not a severity: {}",
            store::states::Severity::NAMES.join(", ")
        )
    })
}

fn parse_status(text: &str) -> Result<store::states::FindingStatus, String> {
    store::states::FindingStatus::parse(text).ok_or_else(|| {
        format!(
            "{text:?} is not a disposition: {}",
            store::states::FindingStatus::NAMES.join(", ")
        )
    })
}

#[derive(Debug, Subcommand)]
enum FindingCommand {
    /// A page of a scan's findings in finding-key order, with the collection revision it was
    /// read at (pass it to `set --collection-revision` to refuse a change if any finding of the
    /// scan changed since).
    List {
        #[arg(long)]
        scan: Uuid,
        /// Only these dispositions (comma-separated).
        #[arg(long, value_delimiter = ',', value_parser = parse_status)]
        status: Vec<store::states::FindingStatus>,
        /// Only these severities (comma-separated).
        #[arg(long, value_delimiter = ',', value_parser = parse_severity)]
        severity: Vec<store::states::Severity>,
        /// The finding key after which the page starts (the previous page's `next_after`).
        #[arg(long, default_value = "")]
        after: String,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// One finding with its history and its occurrences in the target's scans.
    Show {
        finding_id: Uuid,
        #[arg(long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Set a finding's disposition: open, needs_review, gate_exempt, accepted_risk, ignore,
    /// false_positive or fixed (the last five need --reason). --revision is the finding's
    /// revision you decided on; a stale one is refused (revision_conflict).
    Set {
        #[arg(long, value_parser = parse_status)]
        status: store::states::FindingStatus,
        #[command(flatten)]
        change: ChangeArgs,
    },
    /// Delete a finding (its history stays); refused while its scan is pending or running.
    Delete {
        #[command(flatten)]
        change: ChangeArgs,
    },
}

/// What names a change of a finding (`finding set`, `finding delete`).
#[derive(Debug, clap::Args)]
struct ChangeArgs {
    finding_id: Uuid,
    /// The finding's revision you decided on.
    #[arg(long)]
    revision: i32,
    /// Also refuse unless the scan's findings are still at this collection revision.
    #[arg(long)]
    collection_revision: Option<i32>,
    #[arg(long, default_value = "")]
    reason: String,
    /// Who decides (recorded in the history); by default $USER.
    #[arg(long, env = "USER")]
    actor: String,
    #[arg(long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

impl ChangeArgs {
    /// The change, of any organization (the operator's command).
    fn change(&self) -> store::findings::Change {
        store::findings::Change {
            finding_id: self.finding_id,
            organization_id: None,
            expected_revision: self.revision,
            expected_collection_revision: self.collection_revision,
            reason: self.reason.clone(),
            actor: self.actor.clone(),
        }
    }
}

#[derive(Debug, Subcommand)]
enum TaskCommand {
    /// Cancel one task (and with it its scan).
    Cancel {
        task_id: Uuid,
        #[arg(long, default_value = "cancelled from the command line")]
        reason: String,
    },
}

#[derive(Debug, Subcommand)]
enum WorkerCommand {
    /// Register a worker identity; prints its id (give it to the worker as PALISADE_WORKER_ID).
    /// With PALISADE_NATS_AUTHORITY set, also issues its NATS credentials (to --creds, or a
    /// JWT for the --public-key it generated); running it again for an --id replaces them.
    Add {
        #[arg(long)]
        name: String,
        #[arg(long, default_value_t = 4)]
        capacity: i32,
        #[arg(long)]
        id: Option<Uuid>,
        #[command(flatten)]
        credentials: CredentialsArgs,
    },
    /// Let a worker serve an organization.
    Assign {
        #[arg(long)]
        worker: Uuid,
        #[arg(long)]
        org: Uuid,
        #[command(flatten)]
        why: Why,
    },
    /// Revoke a worker (or, with --org, one assignment): no new lease from now on. Its
    /// active leases are voided and their tasks re-offered, unless --let-finish.
    Revoke {
        #[arg(long)]
        worker: Uuid,
        #[arg(long)]
        org: Option<Uuid>,
        #[arg(long)]
        let_finish: bool,
        #[arg(long, default_value = "revoked from the command line")]
        reason: String,
        /// Who (recorded with the change; default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Re-enable a revoked worker (assignments are re-enabled with `worker assign`).
    Enable {
        #[arg(long)]
        worker: Uuid,
        #[command(flatten)]
        why: Why,
    },
    /// A worker: its registration, its organizations and the latest changes of its access
    /// (who and why), as JSON.
    Show {
        worker: Uuid,
        /// How many changes to show, newest first.
        #[arg(long, default_value_t = 20, value_parser = clap::value_parser!(i64).range(0..=1000))]
        changes: i64,
    },
}

/// Who makes a change and why, recorded with it (`worker show`, `org show`).
#[derive(Debug, clap::Args)]
struct Why {
    /// Why (recorded with the change).
    #[arg(long, default_value = "")]
    reason: String,
    /// Who (default: $USER).
    #[arg(long)]
    by: Option<String>,
}

/// Where a new identity's NATS credentials go.
#[derive(Debug, clap::Args)]
struct CredentialsArgs {
    /// Write a .creds file (JWT and a fresh private seed, mode 0600) here: give it to the
    /// holder as NATS_CREDS.
    #[arg(long, conflicts_with = "public_key")]
    creds: Option<std::path::PathBuf>,
    /// Issue a JWT for this user public key (U…), which the holder generated (`nk -gen user`)
    /// and keeps the seed of; prints the JWT.
    #[arg(long)]
    public_key: Option<String>,
}

#[derive(Debug, Subcommand)]
enum ClientCommand {
    /// Register a client bound to organizations and issue its NATS credentials (with
    /// PALISADE_NATS_AUTHORITY set); running it again replaces its organizations and
    /// credentials.
    Add {
        /// 1..=64 characters of [A-Za-z0-9_-]: the client_id of its requests.
        #[arg(long)]
        id: String,
        #[arg(long, default_value = "")]
        name: String,
        /// An organization it may submit, cancel and read events for (repeat for more).
        #[arg(long = "org", required = true)]
        orgs: Vec<Uuid>,
        #[command(flatten)]
        credentials: CredentialsArgs,
        #[command(flatten)]
        why: Why,
    },
    /// Revoke a client: its NATS connections are closed and refused.
    Revoke {
        #[arg(long)]
        id: String,
        #[arg(long, default_value = "revoked from the command line")]
        reason: String,
        /// Who (recorded with the change; default: $USER).
        #[arg(long)]
        by: Option<String>,
    },
    /// Re-enable a revoked client.
    Enable {
        #[arg(long)]
        id: String,
        #[command(flatten)]
        why: Why,
    },
}

#[derive(Debug, Subcommand)]
enum NatsCommand {
    /// Create the authority (operator, system account and palisade account keys) in --dir,
    /// with the server configuration that trusts it and each service's credentials.
    Init {
        #[arg(long)]
        dir: std::path::PathBuf,
        /// Where the NATS servers keep pushed account updates (the `full` resolver's
        /// directory, on each server's disk).
        #[arg(long, default_value = "/data/nats/jwt")]
        resolver_dir: std::path::PathBuf,
    },
    /// Push palisade's account and every worker's and client's account, with the revocations
    /// recorded in PostgreSQL, to NATS again (after a push that failed, to a server that was
    /// away, or after an upgrade that changed what palisade's account exports).
    Push,
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    match run().await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("palisade: {error:#}");
            std::process::ExitCode::from(exit::Status::of(&error).code())
        }
    }
}

async fn run() -> anyhow::Result<()> {
    let cli = Cli::parse();
    if let Command::Health { url } = cli.command {
        // Before telemetry: a probe every few seconds must not start an exporter each time.
        return health(url).await;
    }
    let mut telemetry_settings =
        telemetry::TelemetrySettings::from_env().context("invalid telemetry settings")?;
    // Long-running commands log like the services; the others answer on standard output
    // (ids, tables), so their logs go to standard error.
    telemetry_settings.to_stderr = !matches!(
        cli.command,
        Command::Dev { .. } | Command::Demo { .. } | Command::Bench { .. }
    );
    if matches!(cli.command, Command::Demo { .. } | Command::Bench { .. }) {
        // The demo and the benchmark print their own progress; per-task logs would drown it,
        // and so would sqlx's slow-statement warnings under a load meant to saturate.
        telemetry_settings.default_filter = "warn,sqlx::query=error".into();
    }
    // One-shot commands log only warnings unless asked (their answer is what matters);
    // `-v` raises any command's level. RUST_LOG, when set, decides instead.
    match cli.verbose {
        0 if telemetry_settings.to_stderr => telemetry_settings.default_filter = "warn".into(),
        0 => {}
        1 => telemetry_settings.default_filter = "info".into(),
        2 => telemetry_settings.default_filter = "debug".into(),
        _ => telemetry_settings.default_filter = "trace".into(),
    }
    let _telemetry = telemetry::init("palisade", &telemetry_settings)?;
    let common = CommonSettings::from_env().context("invalid settings")?;
    match cli.command {
        Command::Dev { workers, capacity } => dev(common, workers, capacity).await,
        Command::Migrate { check, output } => {
            let requirements = store::schema::Requirements::default();
            let answer = if check {
                migrate::check(&common.database, &requirements).await?
            } else {
                migrate::apply(&common.database, &requirements)
                    .await
                    .context("failed to migrate the database")?
            };
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&answer)?),
                Output::Text => println!("{}", answer.text()),
            }
            answer.status()
        }
        Command::Demo {
            scans,
            workers,
            capacity,
            concurrency,
            duplicate_percent,
            conflict_percent,
            timeout_secs,
            keep_database,
        } => {
            let options = DemoOptions {
                scans,
                workers,
                worker_capacity: capacity,
                duplicate_percent,
                conflict_percent,
                concurrency,
                timeout: Duration::from_secs(timeout_secs),
                keep_database,
            };
            let report = demo::run(common, options).await?;
            if demo::print_report(&report) {
                Ok(())
            } else {
                anyhow::bail!("the demo's checks did not all hold (see the table above)")
            }
        }
        Command::Bench {
            only,
            scans,
            profile_scans,
            rate,
            duration,
            workers,
            capacity,
            in_flight,
            ceiling_connections,
            ceiling_secs,
            timeout_secs,
            json,
            keep_database,
            history,
        } => {
            let seconds = |name: &str, value: f64| {
                Duration::try_from_secs_f64(value)
                    .with_context(|| format!("--{name} {value} is not a duration in seconds"))
            };
            let options = BenchOptions {
                scenarios: if only.is_empty() {
                    vec![
                        Scenario::Ceiling,
                        Scenario::BurnDown,
                        Scenario::Profile,
                        Scenario::Steady,
                    ]
                } else {
                    only
                },
                scans,
                profile_scans: profile_scans.unwrap_or(scans),
                rate,
                duration: seconds("duration", duration)?,
                workers,
                worker_capacity: capacity,
                in_flight,
                ceiling_connections,
                ceiling_duration: seconds("ceiling-secs", ceiling_secs)?,
                timeout: Duration::from_secs(timeout_secs),
                keep_database,
                json,
                history,
            };
            let report = bench::run(common, &options).await?;
            let held = bench::print_report(&report);
            bench::emit_json(&report, options.json.as_deref())?;
            if held {
                Ok(())
            } else {
                anyhow::bail!("the benchmark's checks did not all hold (see the table above)")
            }
        }
        Command::Org(OrgCommand::Add {
            name,
            hourly_quota,
            id,
        }) => {
            let pool = store::connect(&common.database).await?;
            let id = id.unwrap_or_else(Uuid::now_v7);
            store::admin::create_organization(&pool, id, &name, hourly_quota).await?;
            println!("{id}");
            Ok(())
        }
        Command::Org(OrgCommand::Set {
            id,
            hourly_quota,
            no_hourly_quota,
            max_running_tasks,
            no_max_running_tasks,
            why,
        }) => {
            let by = palisade::commands::actor(why.by);
            let change = store::audit::Change::new(&by, why.reason.trim());
            let quota = (hourly_quota.is_some() || no_hourly_quota).then_some(hourly_quota);
            let cap =
                (max_running_tasks.is_some() || no_max_running_tasks).then_some(max_running_tasks);
            if quota.is_none() && cap.is_none() {
                return Err(palisade::exit::refused(
                    "nothing_to_set: give --hourly-quota <n> or --no-hourly-quota, --max-running-tasks <n> or --no-max-running-tasks",
                ));
            }
            let pool = store::connect(&common.database).await?;
            let missing =
                |()| palisade::exit::not_found(format!("not_found: no organization {id}"));
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
            println!("{answer}");
            Ok(())
        }
        Command::Scan(ScanCommand::Submit {
            org,
            target,
            plugins,
            client,
            key,
            priority,
            deadline_secs,
            wait,
            timeout_secs,
            output,
        }) => {
            // With --wait, PostgreSQL is checked before anything is submitted.
            let pool = if wait {
                Some(store::connect(&common.database).await?)
            } else {
                None
            };
            let bus = palisade::commands::operator_bus(&common).await?;
            let client = client::Client::new(bus, client);
            let key = key.unwrap_or_else(|| Uuid::new_v4().to_string());
            let plugin_names: Vec<&str> = plugins.iter().map(String::as_str).collect();
            let mut request = client.request(&org.to_string(), &target, &plugin_names, &key);
            request.priority = priority;
            request.execution_deadline_seconds = deadline_secs;
            let timeout = Duration::from_secs(timeout_secs);
            // The command's span is the root of the scan's trace: its id is printed with the
            // answer, for the tracing UI.
            let span = tracing::info_span!(
                "scan submit",
                otel.name = "palisade scan submit",
                palisade.service = "cli",
            );
            let trace_id = bus::trace::trace_id_of(&span);
            let reply = match client
                .submit_or_queue(&request)
                .instrument(span.clone())
                .await?
            {
                client::Submitted::Answered(reply) => reply,
                client::Submitted::Queued { reason } if wait => {
                    eprintln!(
                        "queued {key}: admission did not answer ({reason}); asking again until it does"
                    );
                    tokio::time::timeout(timeout, async {
                        loop {
                            match client.submit(&request).instrument(span.clone()).await {
                                Err(client::ClientError::NoAnswer { .. }) => continue,
                                answered => return answered,
                            }
                        }
                    })
                    .await
                    .with_context(|| {
                        format!("admission did not answer within {timeout_secs} s; the request {key} stays queued")
                    })??
                }
                client::Submitted::Queued { reason } => {
                    let message = format!(
                        "queued {key}: admission did not answer ({reason}); the request is on the \
                         durable stream and will be decided once admission can; run the same \
                         command with `--key {key}` to see its scan (a replay answers with it)"
                    );
                    match output {
                        Output::Json => println!(
                            "{}",
                            serde_json::json!({ "queued": true, "idempotency_key": key, "message": message, "trace_id": trace_id })
                        ),
                        Output::Text => println!("{message}"),
                    }
                    return Ok(());
                }
            };
            if let Some(error) = reply.error {
                return Err(exit::refused(format!(
                    "refused: {} ({})",
                    error.message, error.code
                )));
            }
            if let Some(pool) = pool {
                let scan_id: Uuid = reply
                    .scan_id
                    .parse()
                    .context("admission answered with a scan id that is not a UUID")?;
                let detail =
                    scans::follow(&pool, scan_id, timeout, |line| eprintln!("{line}")).await?;
                match output {
                    Output::Json => println!("{}", serde_json::to_string_pretty(&detail)?),
                    Output::Text => println!("{} {}", detail.scan.id, detail.scan.state),
                }
                return scans::outcome(&detail);
            }
            // A replay's scan is in the trace of the request that created it (`scan show`).
            let trace_id = trace_id.filter(|_| !reply.deduplicated);
            match output {
                Output::Json => println!(
                    "{}",
                    serde_json::json!({
                        "scan_id": reply.scan_id,
                        "state": reply.state,
                        "deduplicated": reply.deduplicated,
                        "trace_id": trace_id,
                    })
                ),
                Output::Text => {
                    let note = match &trace_id {
                        _ if reply.deduplicated => {
                            " (replay: the original scan; `scan show` names its trace)".to_owned()
                        }
                        Some(trace_id) => format!(" trace {trace_id}"),
                        None => String::new(),
                    };
                    println!("{} {}{note}", reply.scan_id, reply.state);
                }
            }
            Ok(())
        }
        Command::Scan(ScanCommand::Show { scan_id, output }) => {
            show_scan(&common, scan_id, output).await
        }
        Command::Scan(ScanCommand::List {
            org,
            target,
            state,
            plugin,
            since,
            until,
            client,
            after,
            limit,
            output,
        }) => {
            let state = state
                .map(|state| {
                    store::states::ScanState::parse(&state).ok_or_else(|| {
                        palisade::exit::refused(format!(
                            "invalid_field: --state {state:?} is not one of pending, running, completed, failed, cancelled"
                        ))
                    })
                })
                .transpose()?;
            let filter = store::admin::ScanFilter {
                organization_id: org,
                target,
                state,
                plugin,
                admitted_from: since,
                admitted_before: until,
                client_id: client,
                after,
                limit,
            };
            let pool = store::connect(&common.database).await?;
            let scans = store::admin::scans(&pool, &filter).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&scans)?),
                Output::Text => {
                    println!(
                        "{:<36} {:<10} {:>8} {:<25} {:<24} target",
                        "id", "state", "findings", "admitted", "plugins"
                    );
                    for scan in &scans {
                        println!(
                            "{:<36} {:<10} {:>8} {:<25} {:<24} {}",
                            scan.id,
                            scan.state,
                            scan.finding_count,
                            scan.created_at.format("%Y-%m-%dT%H:%M:%SZ"),
                            scan.plugins.join(","),
                            scan.target
                        );
                    }
                }
            }
            Ok(())
        }
        Command::Scan(ScanCommand::Cancel { scan_id, reason }) => {
            cancel(&common, store::cancel::CancelTarget::Scan(scan_id), &reason).await
        }
        Command::Scan(ScanCommand::Enrich { scan_id }) => enrich(&common, scan_id).await,
        Command::Scan(ScanCommand::Gate {
            scan_id,
            threshold,
            output,
        }) => {
            let pool = store::connect(&common.database).await?;
            let gate = palisade::commands::scan_gate(&pool, scan_id, threshold).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&gate)?),
                Output::Text => println!(
                    "scan {scan_id}: {} ({}), {} of {} plugins complete; gate at {}: {} ({} blocking; counted {:?}, exempt {}, suppressed {})",
                    gate.scan_state,
                    if gate.complete {
                        "complete"
                    } else {
                        "incomplete"
                    },
                    gate.plugins_complete,
                    gate.plugins,
                    gate.threshold,
                    if gate.gate_passed {
                        "passed"
                    } else {
                        "not passed"
                    },
                    gate.blocking,
                    gate.gate_counted,
                    gate.gate_exempt,
                    gate.suppressed
                ),
            }
            if gate.gate_passed {
                Ok(())
            } else {
                Err(exit::failure(
                    exit::Status::NotPassed,
                    format!(
                        "gate not passed: {} blocking finding(s) at or above {}, or the scan is incomplete",
                        gate.blocking, gate.threshold
                    ),
                ))
            }
        }
        Command::Finding(command) => finding(&common, command).await,
        Command::Artifact(command) => artifact(&common, command).await,
        Command::DeadLetter(command) => palisade::dead_letters::run(&common, command).await,
        Command::Schedule(command) => palisade::schedules::run(&common, command).await,
        Command::Queue { output } => {
            let pool = store::connect(&common.database).await?;
            let backlog = store::observability::backlog(&pool).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&backlog)?),
                Output::Text => {
                    println!(
                        "{:<36} {:<16} {:<10} {:>8} {:>8} {:>16}",
                        "organization", "plugin", "state", "tasks", "due", "oldest due (s)"
                    );
                    for row in &backlog {
                        println!(
                            "{:<36} {:<16} {:<10} {:>8} {:>8} {:>16.1}",
                            row.organization_id,
                            row.plugin,
                            row.state,
                            row.tasks,
                            row.due,
                            row.oldest_due_age_seconds
                        );
                    }
                }
            }
            Ok(())
        }
        Command::Task(TaskCommand::Cancel { task_id, reason }) => {
            cancel(&common, store::cancel::CancelTarget::Task(task_id), &reason).await
        }
        Command::Worker(WorkerCommand::Revoke {
            worker,
            org,
            let_finish,
            reason,
            by,
        }) => {
            let pool = store::connect(&common.database).await?;
            let by = palisade::commands::actor(by);
            let change = store::audit::Change::new(&by, &reason);
            let active = if let_finish {
                store::revoke::ActiveLeases::LetFinish
            } else {
                store::revoke::ActiveLeases::Cancel
            };
            let outcome = match org {
                Some(org) => {
                    store::revoke::revoke_assignment(
                        &pool,
                        &common.subjects,
                        org,
                        worker,
                        &change,
                        active,
                    )
                    .await?
                }
                None => {
                    store::revoke::revoke_worker(&pool, &common.subjects, worker, &change, active)
                        .await?
                }
            };
            match outcome {
                store::revoke::RevokeOutcome::Revoked { leases_cancelled } => {
                    println!(
                        "revoked; {leases_cancelled} active leases voided and their tasks re-offered"
                    );
                    if org.is_some() {
                        // It still serves its other organizations: its bus access stays.
                        Ok(())
                    } else {
                        push_accounts(
                            &common,
                            &pool,
                            Some(&store::bus_identities::Holder::Worker(worker)),
                        )
                        .await
                    }
                }
                store::revoke::RevokeOutcome::NotFound => Err(exit::not_found(
                    "no such worker (or assignment): see `palisade worker add` / `worker assign`",
                )),
            }
        }
        Command::Worker(WorkerCommand::Enable { worker, why }) => {
            let pool = store::connect(&common.database).await?;
            let by = palisade::commands::actor(why.by);
            let change = store::audit::Change::new(&by, why.reason.trim());
            if !store::revoke::enable_worker(&pool, worker, &change).await? {
                return Err(exit::not_found(format!("no worker {worker}")));
            }
            println!("worker {worker} enabled");
            push_accounts(
                &common,
                &pool,
                Some(&store::bus_identities::Holder::Worker(worker)),
            )
            .await
        }
        Command::Worker(WorkerCommand::Add {
            name,
            capacity,
            id,
            credentials,
        }) => {
            let pool = store::connect(&common.database).await?;
            let id = id.unwrap_or_else(Uuid::new_v4);
            store::admin::register_worker(&pool, id, &name, capacity).await?;
            println!("{id}");
            issue_credentials(
                &common,
                &pool,
                &messages::Identity::Worker { worker_id: id },
                store::bus_identities::Holder::Worker(id),
                &credentials,
            )
            .await
        }
        Command::Client(ClientCommand::Add {
            id,
            name,
            orgs,
            credentials,
            why,
        }) => {
            messages::subjects::token("client id", &id)?;
            let pool = store::connect(&common.database).await?;
            let by = palisade::commands::actor(why.by);
            let change = store::audit::Change::new(&by, why.reason.trim());
            store::bus_identities::register_client(&pool, &id, &name, &orgs, &change).await?;
            println!("client {id} acts for {} organization(s)", orgs.len());
            issue_credentials(
                &common,
                &pool,
                &messages::Identity::Client {
                    client_id: id.clone(),
                    organizations: orgs,
                },
                store::bus_identities::Holder::Client(id),
                &credentials,
            )
            .await
        }
        Command::Client(ClientCommand::Revoke { id, reason, by }) => {
            let pool = store::connect(&common.database).await?;
            let by = palisade::commands::actor(by);
            let change = store::audit::Change::new(&by, &reason);
            if !store::bus_identities::revoke_client(&pool, &id, &change).await? {
                return Err(exit::not_found(format!(
                    "no client {id}: see `palisade client add`"
                )));
            }
            println!("client {id} revoked");
            push_accounts(
                &common,
                &pool,
                Some(&store::bus_identities::Holder::Client(id)),
            )
            .await
        }
        Command::Client(ClientCommand::Enable { id, why }) => {
            let pool = store::connect(&common.database).await?;
            let by = palisade::commands::actor(why.by);
            let change = store::audit::Change::new(&by, why.reason.trim());
            if !store::bus_identities::enable_client(&pool, &id, &change).await? {
                return Err(exit::not_found(format!(
                    "no client {id}: see `palisade client add`"
                )));
            }
            println!("client {id} enabled");
            push_accounts(
                &common,
                &pool,
                Some(&store::bus_identities::Holder::Client(id)),
            )
            .await
        }
        Command::Cve(CveCommand::Import { path }) => import_cves(&common, &path).await,
        Command::Cve(CveCommand::Status { limit }) => cve_status(&common, limit).await,
        Command::Nats(NatsCommand::Init { dir, resolver_dir }) => {
            nats_init(&common, &dir, &resolver_dir)
        }
        Command::Nats(NatsCommand::Push) => {
            let pool = store::connect(&common.database).await?;
            if authority()?.is_none() {
                anyhow::bail!(
                    "PALISADE_NATS_AUTHORITY is not set: name the directory `palisade nats init` wrote"
                );
            }
            push_accounts(&common, &pool, None).await
        }
        Command::Worker(WorkerCommand::Assign { worker, org, why }) => {
            let pool = store::connect(&common.database).await?;
            let by = palisade::commands::actor(why.by);
            let change = store::audit::Change::new(&by, why.reason.trim());
            store::admin::assign_worker(&pool, org, worker, &change).await?;
            println!("worker {worker} now serves organization {org}");
            Ok(())
        }
        Command::Worker(WorkerCommand::Show { worker, changes }) => {
            let pool = store::connect(&common.database).await?;
            let shown = palisade::tenants::worker(&pool, worker, changes).await?;
            println!("{}", serde_json::to_string_pretty(&shown)?);
            Ok(())
        }
        Command::Org(OrgCommand::Show { id, changes }) => {
            let pool = store::connect(&common.database).await?;
            let shown = palisade::tenants::organization(&pool, id, changes).await?;
            println!("{}", serde_json::to_string_pretty(&shown)?);
            Ok(())
        }
        Command::Health { .. } => unreachable!("answered before telemetry starts"),
    }
}

async fn health(url: Option<String>) -> anyhow::Result<()> {
    let url = match url {
        Some(url) => url,
        None => match runtime::health::http_addr_from_env()? {
            Some(addr) => probe::readyz_url(addr),
            None => anyhow::bail!(
                "PALISADE_HTTP_ADDR is off, so there is no /readyz to ask: set it, or pass --url"
            ),
        },
    };
    let answer = probe::probe(&url).await?;
    if !answer.is_ready() {
        anyhow::bail!("not ready ({}): {}", answer.status, answer.body);
    }
    println!("{}", answer.body);
    Ok(())
}

/// The environment variable naming the authority's directory.
const AUTHORITY_VAR: &str = "PALISADE_NATS_AUTHORITY";

/// The authority `palisade nats init` wrote, when `PALISADE_NATS_AUTHORITY` names it.
fn authority() -> anyhow::Result<Option<identity::Authority>> {
    match runtime::env::optional_string(AUTHORITY_VAR) {
        Some(dir) => Ok(Some(identity::Authority::read(std::path::Path::new(&dir))?)),
        None => Ok(None),
    }
}

/// Issues `identity` its NATS credentials and records their public key; says so when no
/// authority is configured (an open server needs none).
async fn issue_credentials(
    common: &CommonSettings,
    pool: &store::PgPool,
    identity: &messages::Identity,
    holder: store::bus_identities::Holder,
    args: &CredentialsArgs,
) -> anyhow::Result<()> {
    let Some(authority) = authority()? else {
        eprintln!(
            "no NATS credentials issued: {AUTHORITY_VAR} is not set, so this identity can only use a NATS server without authentication"
        );
        return Ok(());
    };
    match (&args.creds, &args.public_key) {
        (Some(path), _) => {
            let credentials = authority.issue(&common.subjects, identity);
            store::bus_identities::record_credential(pool, &holder, &credentials.public_key)
                .await?;
            identity::write_secret(path, &credentials.file)?;
            eprintln!(
                "NATS credentials written to {} (user {}): give the file to the holder as NATS_CREDS",
                path.display(),
                credentials.public_key
            );
        }
        (None, Some(public_key)) => {
            let jwt = authority.issue_for_key(&common.subjects, identity, public_key)?;
            store::bus_identities::record_credential(pool, &holder, public_key).await?;
            println!("{jwt}");
        }
        (None, None) => anyhow::bail!(
            "{AUTHORITY_VAR} is set: give --creds <file> (a new key pair) or --public-key <U…> (a key the holder generated)"
        ),
    }
    // Its account, with a credential it replaced refused from now on.
    push_accounts(common, pool, Some(&holder)).await
}

/// Signs the NATS account of `holder` (with `None`: of every worker and client, and palisade's
/// own) from what PostgreSQL records, its refused credentials included, and pushes it to NATS,
/// when an authority is configured.
async fn push_accounts(
    common: &CommonSettings,
    pool: &store::PgPool,
    holder: Option<&store::bus_identities::Holder>,
) -> anyhow::Result<()> {
    let Some(authority) = authority()? else {
        eprintln!(
            "NATS not told: {AUTHORITY_VAR} is not set (an open NATS server has no accounts or credentials to revoke)"
        );
        return Ok(());
    };
    let pushed = palisade::accounts::push(
        &authority,
        &common.subjects,
        &common.nats_url,
        &common.nats_tls,
        pool,
        holder,
    )
    .await?;
    eprintln!(
        "NATS has {} account(s) from PostgreSQL; it refuses {} credential(s) of them from now on, and their open connections were closed",
        pushed.accounts, pushed.refused
    );
    Ok(())
}

/// Writes a new authority, the server configuration that trusts it, and each service's (and
/// the operator's) credentials.
fn nats_init(
    common: &CommonSettings,
    dir: &std::path::Path,
    resolver_dir: &std::path::Path,
) -> anyhow::Result<()> {
    if identity::Authority::read(dir).is_ok() {
        anyhow::bail!(
            "{} already holds an authority; issuing from a new one would orphan every credential",
            dir.display()
        );
    }
    let authority = identity::Authority::generate();
    authority.write(dir)?;
    let config = dir.join("nats-server-auth.conf");
    std::fs::write(
        &config,
        authority.server_config(&common.subjects, resolver_dir),
    )
    .with_context(|| format!("cannot write {}", config.display()))?;
    let mut identities: Vec<messages::Identity> = messages::Service::ALL
        .into_iter()
        .map(messages::Identity::Service)
        .collect();
    identities.push(messages::Identity::Operator);
    for identity in &identities {
        let name = match identity {
            messages::Identity::Service(service) => service.name(),
            _ => "operator",
        };
        let path = dir.join(format!("{name}.creds"));
        identity::write_secret(&path, &authority.issue(&common.subjects, identity).file)?;
    }
    println!(
        "authority written to {dir}: keep its *.nk seeds secret (a Kubernetes secret), never in PostgreSQL",
        dir = dir.display()
    );
    println!(
        "NATS: include {} in each server's configuration (JetStream on); it trusts this authority and keeps pushed accounts in {}",
        config.display(),
        resolver_dir.display()
    );
    println!(
        "services: NATS_CREDS={}/<service>.creds for admission, dispatch, ingestion, enrichment, reaper; the palisade command: NATS_CREDS={}/operator.creds and {AUTHORITY_VAR}={}",
        dir.display(),
        dir.display(),
        dir.display()
    );
    Ok(())
}

/// Cancels in PostgreSQL, as dispatch's cancel does (the operator may cancel any
/// organization's scan); the event goes out through a running service's outbox relay.
async fn cancel(
    common: &CommonSettings,
    target: store::cancel::CancelTarget,
    reason: &str,
) -> anyhow::Result<()> {
    use store::cancel::CancelOutcome;
    let pool = store::connect(&common.database).await?;
    match store::cancel::cancel(&pool, &common.subjects, None, target, reason).await? {
        CancelOutcome::Cancelled { scan_id } => println!("scan {scan_id}: cancelled (cancelled)"),
        CancelOutcome::AlreadyTerminal { scan_id, state } => {
            println!("scan {scan_id}: {state} (already_terminal)")
        }
        CancelOutcome::NotFound => return Err(exit::not_found("no such scan or task")),
    }
    Ok(())
}

/// `palisade scan enrich`: the answer a client gets on the wire, for any organization's scan.
async fn enrich(common: &CommonSettings, scan_id: Uuid) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    println!("{}", palisade::commands::enrich(&pool, scan_id).await?);
    Ok(())
}

async fn finding(common: &CommonSettings, command: FindingCommand) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    match command {
        FindingCommand::List {
            scan,
            status,
            severity,
            after,
            limit,
            output,
        } => {
            let filter = store::findings::Filter {
                statuses: status,
                severities: severity,
            };
            let page =
                palisade::commands::list_findings(&pool, scan, &filter, &after, limit).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&page)?),
                Output::Text => {
                    println!(
                        "scan {scan} ({}), collection revision {}",
                        page.scan_state, page.collection_revision
                    );
                    for finding in &page.findings {
                        println!(
                            "{}  r{}  {:<14} {:<8} {}  {}",
                            finding.id,
                            finding.revision,
                            finding.status,
                            finding.severity,
                            finding.title,
                            finding.resource
                        );
                    }
                    if let Some(next) = &page.next_after {
                        println!("more: --after {next}");
                    }
                }
            }
        }
        FindingCommand::Show { finding_id, output } => {
            let detail = palisade::commands::show_finding(&pool, finding_id).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&detail)?),
                Output::Text => {
                    let finding = &detail.finding;
                    println!(
                        "{} [{}] {}\n  {} at revision {} (collection revision {}){}\n  {} {} {}",
                        finding.id,
                        finding.severity,
                        finding.title,
                        finding.status,
                        finding.revision,
                        detail.collection_revision,
                        if finding.status_reason.is_empty() {
                            String::new()
                        } else {
                            format!(": {}", finding.status_reason)
                        },
                        finding.plugin,
                        finding.rule_id,
                        finding.resource
                    );
                    for entry in &detail.history {
                        println!(
                            "  {} r{} {} -> {} by {} at {}: {}",
                            entry.action,
                            entry.revision,
                            entry.from_status,
                            entry.to_status,
                            entry.actor,
                            entry.changed_at,
                            entry.reason
                        );
                    }
                    println!(
                        "  occurrences in this target's scans: {}",
                        detail.occurrences.len()
                    );
                }
            }
        }
        FindingCommand::Set { status, change } => {
            let answer =
                palisade::commands::set_finding_status(&pool, &change.change(), status).await?;
            let text = format!("finding {} is {status}", change.finding_id);
            print_answer(change.output, &answer, &text);
        }
        FindingCommand::Delete { change } => {
            let answer = palisade::commands::delete_finding(&pool, &change.change()).await?;
            let text = format!("finding {} deleted", change.finding_id);
            print_answer(change.output, &answer, &text);
        }
    }
    Ok(())
}

fn print_answer(output: Output, answer: &serde_json::Value, text: &str) {
    match output {
        Output::Json => println!("{answer}"),
        Output::Text => println!("{text}: {answer}"),
    }
}

async fn import_cves(common: &CommonSettings, path: &std::path::Path) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let summary = palisade::commands::import_cves(&pool, path, |line| eprintln!("{line}")).await?;
    println!("{summary}");
    Ok(())
}

async fn cve_status(common: &CommonSettings, limit: i64) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let status = store::cves::status(&pool, limit).await?;
    println!("{}", serde_json::to_string_pretty(&status)?);
    Ok(())
}

async fn dev(common: CommonSettings, workers: usize, capacity: u32) -> anyhow::Result<()> {
    let bus_notice = system::bus_notice(&common);
    let settings = SystemSettings::from_common(common).context("invalid settings")?;
    let mut system = System::start(settings).await?;
    let organization_id = Uuid::from_u128(0x0000_0000_0000_7000_8000_0000_0000_0001);
    store::admin::create_organization(&system.connections.pool, organization_id, "dev", None)
        .await?;
    system
        .spawn_workers(organization_id, workers, capacity)
        .await?;
    println!("palisade dev: five services and {workers} workers running; Ctrl-C stops them");
    println!("{bus_notice}");
    println!("organization `dev`: {organization_id}");
    println!(
        "try: palisade scan submit --org {organization_id} --target http://127.0.0.1:8080 --plugins tcp_connect,http_headers"
    );
    system.run_until(runtime::shutdown_on_signal()).await
}

async fn artifact(common: &CommonSettings, command: ArtifactCommand) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    match command {
        ArtifactCommand::List { scan, output } => {
            let artifacts = palisade::commands::list_artifacts(&pool, scan).await?;
            match output {
                Output::Json => println!("{}", serde_json::to_string_pretty(&artifacts)?),
                Output::Text => {
                    println!(
                        "{:<36} {:>10} {:<64} {:<30} name",
                        "id", "bytes", "sha256", "content type"
                    );
                    for artifact in &artifacts {
                        println!(
                            "{:<36} {:>10} {:<64} {:<30} {}",
                            artifact.id,
                            artifact.size_bytes.unwrap_or_default(),
                            artifact.sha256,
                            artifact.content_type,
                            artifact.original_name
                        );
                    }
                }
            }
        }
        ArtifactCommand::Get { id, out } => {
            let bus = palisade::commands::operator_bus(common).await?;
            let store = runtime::artifacts::Artifacts::open(&bus, &common.artifact_store).await?;
            let (artifact, bytes) = palisade::commands::get_artifact(&pool, &store, id).await?;
            if out.as_os_str() == "-" {
                use std::io::Write as _;
                std::io::stdout().write_all(&bytes)?;
            } else {
                std::fs::write(&out, &bytes)
                    .with_context(|| format!("cannot write {}", out.display()))?;
            }
            eprintln!(
                "{} ({} bytes, sha256 {} verified)",
                artifact.original_name,
                bytes.len(),
                artifact.sha256
            );
        }
    }
    Ok(())
}

async fn show_scan(common: &CommonSettings, scan_id: Uuid, output: Output) -> anyhow::Result<()> {
    let pool = store::connect(&common.database).await?;
    let detail = scans::show(&pool, scan_id).await?;
    if output == Output::Json {
        println!("{}", serde_json::to_string_pretty(&detail)?);
        return Ok(());
    }
    let scan = &detail.scan;
    println!("scan        {}", scan.id);
    println!("state       {}", scan.state);
    println!("target      {}", scan.target);
    println!("profile     {}", scan.plugins.join(" -> "));
    println!("client/key  {} / {}", scan.client_id, scan.idempotency_key);
    println!("admitted    {}", scan.created_at);
    if let Some(started) = scan.started_at {
        println!("started     {started}");
    }
    if let Some(finished) = scan.finished_at {
        println!("finished    {finished}");
    }
    if !scan.failure_code.is_empty() {
        println!("failure     {}: {}", scan.failure_code, scan.failure_reason);
    }
    if let Some(trace_id) = &scan.trace_id {
        println!("trace       {trace_id}");
    }
    println!(
        "\n{:<4} {:<16} {:<10} {:<16} {:>8} {:>9} {:>7}",
        "#", "plugin", "job", "task", "attempts", "findings", "assets"
    );
    for job in &detail.jobs {
        println!(
            "{:<4} {:<16} {:<10} {:<16} {:>8} {:>9} {:>7}",
            job.position,
            job.plugin,
            job.state,
            job.task_state.as_deref().unwrap_or_default(),
            job.attempt_count.unwrap_or_default(),
            job.finding_count,
            job.asset_count
        );
        if let Some(task_id) = job.task_id {
            println!("     task {task_id}");
        }
        if !job.error_code.is_empty() {
            println!("     error {}: {}", job.error_code, job.error_message);
        }
    }
    let findings = &detail.findings;
    println!("\n{} findings", findings.len());
    for finding in findings.iter().take(50) {
        println!(
            "  [{:<8}] {:<14} {:<32} {}",
            finding.severity, finding.plugin, finding.rule_id, finding.resource
        );
    }
    Ok(())
}
