//! The `palisade` command: run everything for development, migrate, submit and inspect scans,
//! administer workers, run the demo and the benchmark, probe a service's readiness (`health`).

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use lab::bench::BenchArgs;
use lab::demo::DemoArgs;
use lab::system::{self, System, SystemSettings};
use palisade::artifact::ArtifactCommand;
use palisade::cli_support::{Json, Output};
use palisade::client::ClientCommand;
use palisade::cve::CveCommand;
use palisade::finding::FindingCommand;
use palisade::nats::NatsCommand;
use palisade::org::OrgCommand;
use palisade::scan::ScanCommand;
use palisade::target::TargetCommand;
use palisade::task::TaskCommand;
use palisade::worker::WorkerCommand;
use palisade::{exit, migrate};
use runtime::CommonSettings;
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
    /// Enrichment reads the local CVE table (`palisade cve import`) unless PALISADE_CVE_SOURCE
    /// says otherwise.
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
    Demo(DemoArgs),
    /// Measure throughput, latency and cost per scan in-process against a fresh database,
    /// next to the fenced-step ceiling of the same PostgreSQL; prints a table, then JSON.
    Bench(BenchArgs),
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
    /// Targets: what their scans checked and found over time.
    #[command(subcommand)]
    Target(TargetCommand),
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
    /// Ask a service's /readyz once (the container health check), or until it is ready within
    /// --wait: exits 0 when ready, 1 with the failing checks otherwise.
    Health {
        /// What to ask; by default /readyz at PALISADE_HTTP_ADDR over loopback.
        #[arg(long)]
        url: Option<String>,
        /// Ask again once a second for up to this many seconds while the answer is not ready
        /// (0: ask once).
        #[arg(long, default_value_t = 0)]
        wait: u64,
    },
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
    if let Command::Health { url, wait } = cli.command {
        // Before telemetry: a probe every few seconds must not start an exporter each time.
        return palisade::health::run(url, std::time::Duration::from_secs(wait)).await;
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
        Command::Migrate { check, output } => migrate(&common, check, output).await,
        Command::Demo(args) => lab::demo::command(common, args).await,
        Command::Bench(args) => lab::bench::command(common, args).await,
        Command::Org(command) => palisade::org::run(&common, command).await,
        Command::Scan(command) => palisade::scan::run(&common, command).await,
        Command::Task(command) => palisade::task::run(&common, command).await,
        Command::Worker(command) => palisade::worker::run(&common, command).await,
        Command::Client(command) => palisade::client::run(&common, command).await,
        Command::Nats(command) => palisade::nats::run(&common, command).await,
        Command::Cve(command) => palisade::cve::run(&common, command).await,
        Command::Finding(command) => palisade::finding::run(&common, command).await,
        Command::Target(command) => palisade::target::run(&common, command).await,
        Command::Artifact(command) => palisade::artifact::run(&common, command).await,
        Command::Queue { output } => palisade::queue::run(&common, output).await,
        Command::DeadLetter(command) => palisade::dead_letters::run(&common, command).await,
        Command::Schedule(command) => palisade::schedules::run(&common, command).await,
        Command::Health { .. } => unreachable!("answered before telemetry starts"),
    }
}

/// `palisade migrate`.
async fn migrate(common: &CommonSettings, check: bool, output: Output) -> anyhow::Result<()> {
    let requirements = store::schema::Requirements::default();
    let answer = if check {
        migrate::check(&common.database, &requirements).await?
    } else {
        let mut answer = migrate::apply(&common.database, &requirements)
            .await
            .context("failed to migrate the database")?;
        answer.streams = Some(migrate::provision_streams(common).await?);
        answer
    };
    palisade::cli_support::print(output, Json::Pretty, &answer, migrate::Answer::text)?;
    answer.status()
}

async fn dev(mut common: CommonSettings, workers: usize, capacity: u32) -> anyhow::Result<()> {
    let private_nats = lab::private_nats::ensure(&mut common).await?;
    // The suggested command must reach the same NATS: a private one is not on the default URL.
    let nats_url = if private_nats.is_some() {
        format!("NATS_URL={} ", common.nats_url)
    } else {
        String::new()
    };
    let bus_notice = system::bus_notice(&common);
    let mut settings = SystemSettings::from_common(common).context("invalid settings")?;
    // A development runtime answers this machine only, unless told otherwise.
    if std::env::var_os(runtime::health::HTTP_ADDR_VAR).is_none() {
        settings.http_addr = Some(DEV_HTTP_ADDR);
    }
    // A development machine may have no internet: with NVD, every enrichment job would fail.
    let cve_defaulted = std::env::var_os(CVE_SOURCE_VAR).is_none();
    if cve_defaulted {
        settings.enrichment.cve.source = enrichment::cve::CveSource::Local;
    }
    let mut system = System::start(settings).await?;
    let organization_id = Uuid::from_u128(0x0000_0000_0000_7000_8000_0000_0000_0001);
    store::admin::create_organization(&system.connections.pool, organization_id, "dev", None)
        .await?;
    system
        .spawn_workers(organization_id, workers, capacity)
        .await?;
    // Something to scan, as the demo has: a local web application, served until dev stops.
    let (target, target_stop) = lab::harness::start_local_web_app().await?;
    println!("palisade dev: five services and {workers} workers running; Ctrl-C stops them");
    println!("{bus_notice}");
    if let Some(health) = system.health_addr() {
        println!("health: http://{health}/readyz, metrics: http://{health}/metrics");
    }
    if cve_defaulted {
        println!(
            "enrichment reads the local CVE table (palisade cve import fills it); set {CVE_SOURCE_VAR}=nvd to sync from NVD"
        );
    }
    println!("organization `dev`: {organization_id}");
    println!("a local web application to scan: http://{target}/");
    println!(
        "try: {nats_url}palisade scan submit --org {organization_id} --target http://{target}/ --plugins tcp_connect,http_headers --wait"
    );
    let ended = system.run_until(runtime::shutdown_on_signal()).await;
    target_stop.cancel();
    drop(private_nats);
    ended
}

/// Where enrichment's CVE data comes from; `palisade dev` chooses `local` when it is unset.
const CVE_SOURCE_VAR: &str = "PALISADE_CVE_SOURCE";

/// Where `palisade dev` serves `/healthz`, `/readyz` and `/metrics` unless
/// `PALISADE_HTTP_ADDR` says otherwise: loopback, not every interface.
const DEV_HTTP_ADDR: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9090);
