//! `palisade bench`: throughput, latency and cost of the whole system in one process, against
//! a fresh database and subject prefix, next to a ceiling the same PostgreSQL sets.
//!
//! Five scenarios, all run by default (`--only` picks some):
//!
//! - **ceiling**: a *fenced step* done by the benchmark itself, without palisade: in a scratch
//!   table of the run's database, each of N connections repeats one transaction (UPDATE of a
//!   lease row guarded by its token and expiry, INSERT of a result row, INSERT of an outbox
//!   row, COMMIT). It is the least a worker's result costs PostgreSQL, so steps/s is the
//!   throughput no scan path built on fenced leases can beat on this machine; every other
//!   throughput is also given as a ratio to it. Then the same steps batched, as palisade's
//!   consumers batch them ([`CEILING_BATCH`] leases per commit, set-wise statements): what
//!   deciding in sets can reach on the same PostgreSQL.
//! - **burn-down**: N scans of one `synthetic` plugin (no delay, one finding) sent at once;
//!   scans/s from the first request to the last completion event, request-to-completion
//!   latency, where the time went per stage (as for steady), and what each lane spent per scan
//!   (statements, commits, messages).
//! - **growth**: the burn-down again with ten times the scans (`--large-scans`), after it: the
//!   ratio of the two rates is what a scan's cost grows with the backlog (1.0 is flat).
//! - **profile**: the same with the demo's three-plugin profile (`tcp_connect → http_headers →
//!   synthetic` against a local web app; admission refuses a plugin twice in a profile, so
//!   three `synthetic` stages are not possible).
//! - **steady**: a fixed offered load for a while; achieved scans/s, latency, pickup, and where
//!   the time went per stage, from the timestamps PostgreSQL holds after the run.
//!
//! Requests go through the durable path (`client.publish`: JetStream PubAck, admission consumes
//! the request stream), and completion is what a client sees: the `scan.completed` events of
//! `client.outcomes()`.

mod ceiling;
mod cpu;
mod report;
mod stages;
mod statements;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};
use uuid::Uuid;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use runtime::CommonSettings;
use serde_json::json;
use telemetry::cost::LaneCost;
use tokio::task::JoinSet;

pub use ceiling::{BatchedCeiling, CEILING_BATCH, Ceiling};
pub use report::{checks, emit_json, print_report, to_json};
pub use stages::{Stage, Stages};

use crate::harness::{Harness, Outcomes, Tally, start_local_web_app};

/// The scenarios `--only` can pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Scenario {
    /// The fenced-step ceiling of this PostgreSQL.
    Ceiling,
    /// N one-plugin scans at once, with their cost per scan.
    BurnDown,
    /// The burn-down again with ten times the scans, and the ratio of their rates.
    Growth,
    /// N three-plugin scans at once, with their cost per scan.
    Profile,
    /// A fixed offered load, with latency, pickup and the time per stage.
    Steady,
}

/// How the benchmark runs.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub scenarios: Vec<Scenario>,
    /// Scans of the burn-down.
    pub scans: usize,
    /// Scans of the growth scenario's large burn-down.
    pub large_scans: usize,
    /// Scans of the three-plugin burn-down.
    pub profile_scans: usize,
    /// Offered load of the steady scenario, scans per second.
    pub rate: f64,
    /// How long the steady load is offered.
    pub duration: Duration,
    pub workers: usize,
    pub worker_capacity: u32,
    /// Requests awaiting their PubAck at once during a burn-down.
    pub in_flight: usize,
    pub ceiling_connections: usize,
    pub ceiling_duration: Duration,
    /// Give up waiting for a scenario's scans after this long.
    pub timeout: Duration,
    pub keep_database: bool,
    /// Where to write the JSON document too.
    pub json: Option<PathBuf>,
    /// Completed scans of history written before the scenarios run.
    pub history: usize,
}

// `palisade bench`'s arguments (its help is the `Bench` command's, in the `palisade` command).
#[derive(Debug, clap::Args)]
pub struct BenchArgs {
    /// Scenarios to run (all by default).
    #[arg(long, value_enum, value_delimiter = ',')]
    only: Vec<Scenario>,
    /// Scans of the one-plugin burn-down.
    #[arg(long, default_value_t = 2_000)]
    scans: usize,
    /// Scans of the growth scenario's large burn-down (default: ten times --scans).
    #[arg(long)]
    large_scans: Option<usize>,
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
}

impl TryFrom<BenchArgs> for BenchOptions {
    type Error = anyhow::Error;

    fn try_from(args: BenchArgs) -> anyhow::Result<Self> {
        let BenchArgs {
            only,
            scans,
            large_scans,
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
        } = args;
        let seconds = |name: &str, value: f64| {
            Duration::try_from_secs_f64(value)
                .with_context(|| format!("--{name} {value} is not a duration in seconds"))
        };
        Ok(Self {
            scenarios: if only.is_empty() {
                vec![
                    Scenario::Ceiling,
                    Scenario::BurnDown,
                    Scenario::Growth,
                    Scenario::Profile,
                    Scenario::Steady,
                ]
            } else {
                only
            },
            scans,
            large_scans: large_scans.unwrap_or(scans.saturating_mul(10)),
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
        })
    }
}

/// `palisade bench`: runs the scenarios, prints the table and the JSON document, and fails
/// unless every check held.
pub async fn command(mut common: CommonSettings, args: BenchArgs) -> anyhow::Result<()> {
    let options = BenchOptions::try_from(args)?;
    let _nats = crate::private_nats::ensure(&mut common).await?;
    // One client sends every burn-down's scans at once: its quota of waiting requests (fitted
    // to at most 10,000) would refuse a larger burn-down, so unless it is set, the benchmark's
    // installation lets its one client have them all waiting (its requests are small).
    if std::env::var_os("PALISADE_QUOTA_REQUESTS_WAITING").is_none() {
        let all = options
            .scans
            .max(options.profile_scans)
            .max(options.large_scans) as i64;
        let quotas = &mut common.streams.quotas;
        quotas.requests_waiting_per_client =
            bus::WaitingQuota::Set(all.max(bus::StreamQuotas::REQUESTS_WAITING_PER_CLIENT_DEFAULT));
    }
    let report = run(common, &options).await?;
    let held = print_report(&report);
    emit_json(&report, options.json.as_deref())?;
    if held {
        Ok(())
    } else {
        anyhow::bail!("the benchmark's checks did not all hold (see the table above)")
    }
}

/// p50, p95 and p99 of a sample, in milliseconds.
#[derive(Debug, Clone, Copy, Default)]
pub struct Quantiles {
    pub p50: f64,
    pub p95: f64,
    pub p99: f64,
}

impl Quantiles {
    /// Nearest-rank quantiles of `values` (any order).
    fn of(values: &[f64]) -> Self {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let at = |q: f64| {
            if sorted.is_empty() {
                return 0.0;
            }
            let rank = (q * sorted.len() as f64).ceil() as usize;
            sorted[rank.clamp(1, sorted.len()) - 1]
        };
        Self {
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
        }
    }

    fn from_tally(tally: &Tally) -> Self {
        Self {
            p50: tally.latency_ms(0.50),
            p95: tally.latency_ms(0.95),
            p99: tally.latency_ms(0.99),
        }
    }

    fn to_json(self) -> serde_json::Value {
        json!({ "p50": round(self.p50), "p95": round(self.p95), "p99": round(self.p99) })
    }
}

/// What a burn-down measured.
#[derive(Debug, Clone, Default)]
pub struct BurnDown {
    pub profile: Vec<&'static str>,
    pub scans: usize,
    pub completed: usize,
    pub failed: usize,
    pub rejected: usize,
    pub completion_events_repeated: usize,
    pub database_completed: i64,
    pub findings: u64,
    /// From the first request to the last completion event.
    pub seconds: f64,
    pub scans_per_second: f64,
    pub latency_ms: Quantiles,
    pub stages: Stages,
    /// What each lane spent from the first request to the last completion event.
    pub cost: BTreeMap<&'static str, LaneCost>,
    /// Per durable consumer: the batches its handler decided in that window.
    pub consumers: BTreeMap<String, ConsumerBatches>,
    /// Per table: the rows written from before the first request to after the run's tail
    /// (outbox, enrichment) settled, from `pg_stat_user_tables`.
    pub writes: BTreeMap<String, TableWrites>,
    /// Where the machine's CPU went while it ran; `None` where `/proc` cannot be read.
    pub cpu: Option<cpu::CpuSplit>,
    /// PostgreSQL's time per statement from the first request until the run's tail settled.
    pub statements: Option<statements::Statements>,
    /// Of the first attempts of every plugin after a scan's first: how many were leased with
    /// their predecessor's completion (granted under its attempt's id), and how many there were.
    pub handed_on: (i64, i64),
    /// Workers' publishes JetStream refused at their quota of waiting results, each published
    /// again later (a wait, not a loss).
    pub quota_refused: u64,
}

/// What was written to one table, from PostgreSQL's counters (`pg_stat_user_tables`): every
/// insert and update writes a row version; a HOT update writes no index entry.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, sqlx::FromRow)]
pub struct TableWrites {
    pub inserted: i64,
    pub updated: i64,
    pub hot_updated: i64,
    pub deleted: i64,
}

impl TableWrites {
    /// Row versions written: inserts and updates.
    pub fn row_versions(&self) -> i64 {
        self.inserted + self.updated
    }

    fn since(&self, before: &Self) -> Self {
        Self {
            inserted: self.inserted - before.inserted,
            updated: self.updated - before.updated,
            hot_updated: self.hot_updated - before.hot_updated,
            deleted: self.deleted - before.deleted,
        }
    }

    fn add(&mut self, other: &Self) {
        self.inserted += other.inserted;
        self.updated += other.updated;
        self.hot_updated += other.hot_updated;
        self.deleted += other.deleted;
    }
}

/// PostgreSQL 15 publishes a backend's table counters when it goes idle, but at most once a
/// second, else within 10 s: wait this long before reading them.
const STATISTICS_FLUSH: Duration = Duration::from_secs(11);

/// Every table's write counters, once what the backends did until now is published.
async fn table_writes(harness: &Harness) -> anyhow::Result<BTreeMap<String, TableWrites>> {
    tokio::time::sleep(STATISTICS_FLUSH).await;
    let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT relname::text, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del
         FROM pg_stat_user_tables",
    )
    .fetch_all(&harness.pool)
    .await
    .context("cannot read PostgreSQL's table statistics")?;
    Ok(rows
        .into_iter()
        .map(|(table, inserted, updated, hot_updated, deleted)| {
            let writes = TableWrites {
                inserted,
                updated,
                hot_updated,
                deleted,
            };
            (table, writes)
        })
        .collect())
}

/// What each table had written between two readings; tables with nothing written left out.
fn writes_between(
    before: &BTreeMap<String, TableWrites>,
    after: &BTreeMap<String, TableWrites>,
) -> BTreeMap<String, TableWrites> {
    after
        .iter()
        .map(|(table, after)| {
            let before = before.get(table).copied().unwrap_or_default();
            (table.clone(), after.since(&before))
        })
        .filter(|(_, writes)| *writes != TableWrites::default())
        .collect()
}

/// A burn-down with what it wrote to each table: settled before and after, so the previous
/// scenario's tail is not counted and this one's (outbox, enrichment) is.
async fn burn_down_writing(
    harness: &Harness,
    run: impl std::future::Future<Output = anyhow::Result<BurnDown>>,
) -> anyhow::Result<BurnDown> {
    settle(harness).await?;
    let before = table_writes(harness).await?;
    let statements_before = statements::snapshot(&harness.pool).await;
    let cpu_before = cpu::sample();
    let mut run = run.await?;
    run.cpu = cpu_before
        .zip(cpu::sample())
        .and_then(|(before, after)| cpu::split(&before, &after));
    settle(harness).await?;
    run.writes = writes_between(&before, &table_writes(harness).await?);
    run.statements = Some(statements::between(
        statements_before,
        statements::snapshot(&harness.pool).await,
    ));
    Ok(run)
}

/// What one durable consumer's handler did in a window, from `/metrics`'
/// `palisade_handler_seconds` (one observation per decided batch) and `palisade_messages_total`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ConsumerBatches {
    pub batches: f64,
    pub messages: f64,
    pub handler_seconds: f64,
}

impl ConsumerBatches {
    /// Every consumer's totals so far, read from the process's metrics.
    fn snapshot() -> BTreeMap<String, ConsumerBatches> {
        let mut consumers: BTreeMap<String, ConsumerBatches> = BTreeMap::new();
        for line in telemetry::metrics::encode_text().lines() {
            let Some((series, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.parse::<f64>() else {
                continue;
            };
            let Some(consumer) = series
                .split_once("consumer=\"")
                .and_then(|(_, rest)| rest.split_once('"'))
                .map(|(consumer, _)| consumer.to_owned())
            else {
                continue;
            };
            let entry = consumers.entry(consumer).or_default();
            if series.starts_with("palisade_handler_seconds_count") {
                entry.batches += value;
            } else if series.starts_with("palisade_handler_seconds_sum") {
                entry.handler_seconds += value;
            } else if series.starts_with("palisade_messages_total") {
                entry.messages += value;
            }
        }
        consumers
    }

    fn since(self, earlier: Self) -> Self {
        Self {
            batches: self.batches - earlier.batches,
            messages: self.messages - earlier.messages,
            handler_seconds: self.handler_seconds - earlier.handler_seconds,
        }
    }

    /// What each consumer decided since the `before` [`snapshot`](Self::snapshot); consumers
    /// that decided no batch left out.
    fn spent_since(before: &BTreeMap<String, Self>) -> BTreeMap<String, Self> {
        Self::snapshot()
            .into_iter()
            .map(|(consumer, now)| {
                let then = before.get(&consumer).copied().unwrap_or_default();
                (consumer, now.since(then))
            })
            .filter(|(_, spent)| spent.batches > 0.0)
            .collect()
    }
}

/// What the steady scenario measured.
#[derive(Debug, Clone, Default)]
pub struct Steady {
    pub offered_per_second: f64,
    pub duration_seconds: f64,
    pub scans: usize,
    /// How long sending every request took (the offered rate actually kept).
    pub send_seconds: f64,
    pub completed: usize,
    pub failed: usize,
    pub rejected: usize,
    pub completion_events_repeated: usize,
    pub database_completed: i64,
    /// From the first request to the last completion event.
    pub seconds: f64,
    pub achieved_per_second: f64,
    pub latency_ms: Quantiles,
    pub stages: Stages,
}

/// The machine and servers the benchmark ran on.
#[derive(Debug, Clone, Default)]
pub struct Host {
    pub date: String,
    pub cores: usize,
    pub load_before: String,
    pub load_after: String,
    pub postgresql: String,
    pub nats: String,
}

/// Everything the benchmark measured.
#[derive(Debug, Clone, Default)]
pub struct BenchReport {
    pub host: Host,
    pub workers: usize,
    pub worker_capacity: u32,
    pub in_flight: usize,
    /// Completed scans of history the tables held before the scenarios ran.
    pub history: usize,
    pub ceiling: Option<Ceiling>,
    pub burn_down: Option<BurnDown>,
    /// The growth scenario's large burn-down, run right after `burn_down`.
    pub large_burn_down: Option<BurnDown>,
    pub profile: Option<BurnDown>,
    pub steady: Option<Steady>,
    pub total_seconds: f64,
}

/// One synthetic plugin: no delay, one finding.
const BURN_DOWN_PROFILE: [&str; 1] = ["synthetic"];
/// The demo's three plugins.
const THREE_PLUGIN_PROFILE: [&str; 3] = crate::demo::DEMO_PROFILE;

/// Runs the scenarios in `options` against the database and NATS in `common`, in a fresh
/// database and subject prefix of its own.
pub async fn run(common: CommonSettings, options: &BenchOptions) -> anyhow::Result<BenchReport> {
    let started = Instant::now();
    let load_before = load_average();
    let harness = Harness::start(common, "bench", options.workers, options.worker_capacity).await?;
    if options.history > 0 {
        let worker_id: Uuid = sqlx::query_scalar(
            "SELECT worker_id FROM organization_workers WHERE organization_id = $1 LIMIT 1",
        )
        .bind(harness.organization_id)
        .fetch_one(&harness.pool)
        .await
        .context("the benchmark has no worker")?;
        let seeding = Instant::now();
        store::history::seed(
            &harness.pool,
            harness.organization_id,
            worker_id,
            options.history,
            |written| {
                println!(
                    "bench history: {written}/{} completed scans written ({:.0} s)",
                    options.history,
                    seeding.elapsed().as_secs_f64()
                );
            },
        )
        .await
        .context("cannot write the benchmark's history")?;
    }
    if let Err(reason) = statements::prepare(&harness.pool).await {
        println!("bench: no per-statement times: {reason}");
    }
    let (web_app, web_app_stop) = start_local_web_app().await?;
    let report = scenarios(&harness, web_app, options).await;
    web_app_stop.cancel();
    harness.finish(options.keep_database).await?;
    let mut report = report?;
    report.host.load_before = load_before;
    report.host.load_after = load_average();
    report.total_seconds = started.elapsed().as_secs_f64();
    Ok(report)
}

async fn scenarios(
    harness: &Harness,
    web_app: SocketAddr,
    options: &BenchOptions,
) -> anyhow::Result<BenchReport> {
    let mut report = BenchReport {
        host: host(harness).await?,
        workers: options.workers,
        worker_capacity: options.worker_capacity,
        in_flight: options.in_flight,
        history: options.history,
        ..BenchReport::default()
    };
    let wants = |scenario| options.scenarios.contains(&scenario);
    if wants(Scenario::Ceiling) {
        println!(
            "bench: ceiling, {} connections for {:.1} s",
            options.ceiling_connections,
            options.ceiling_duration.as_secs_f64()
        );
        report.ceiling = Some(
            ceiling::run(
                &harness.common.database.url,
                options.ceiling_connections,
                options.ceiling_duration,
            )
            .await
            .context("the ceiling failed")?,
        );
    }
    if wants(Scenario::BurnDown) || wants(Scenario::Growth) {
        report.burn_down =
            Some(one_plugin_burn_down(harness, "burn-down", options.scans, options).await?);
    }
    if wants(Scenario::Growth) {
        report.large_burn_down = Some(
            one_plugin_burn_down(harness, "burn-down-large", options.large_scans, options).await?,
        );
    }
    if wants(Scenario::Profile) {
        report.profile = Some(
            burn_down_writing(
                harness,
                burn_down(
                    harness,
                    "profile",
                    &THREE_PLUGIN_PROFILE,
                    options.profile_scans,
                    |index| format!("http://{web_app}/profile/{index}"),
                    options,
                ),
            )
            .await?,
        );
    }
    if wants(Scenario::Steady) {
        settle(harness).await?;
        report.steady = Some(steady(harness, options).await?);
    }
    Ok(report)
}

/// A burn-down of `scans` one-plugin scans named `name`, with what it wrote.
async fn one_plugin_burn_down(
    harness: &Harness,
    name: &'static str,
    scans: usize,
    options: &BenchOptions,
) -> anyhow::Result<BurnDown> {
    burn_down_writing(
        harness,
        burn_down(
            harness,
            name,
            &BURN_DOWN_PROFILE,
            scans,
            |index| format!("synthetic://bench/{name}/{index}?duration_ms=0&findings=1"),
            options,
        ),
    )
    .await
}

/// The machine and the servers the harness runs on (load averages are read around the run).
async fn host(harness: &Harness) -> anyhow::Result<Host> {
    let postgresql: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&harness.pool)
        .await
        .context("cannot read PostgreSQL's version")?;
    Ok(Host {
        date: Utc::now().format("%Y-%m-%d %H:%M:%S UTC").to_string(),
        cores: std::thread::available_parallelism().map_or(0, usize::from),
        postgresql,
        nats: harness.bus.client().server_info().version,
        ..Host::default()
    })
}

/// Longest wait for the previous scenario's tail (outbox, enrichment) before the next starts.
const SETTLE_MAX: Duration = Duration::from_secs(60);

/// Waits until the previous scenario's work is done, so that it does not load the next: no
/// unpublished event and no unfinished enrichment job (or [`SETTLE_MAX`] passed).
async fn settle(harness: &Harness) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let (unpublished, _) = store::outbox::backlog(&harness.pool)
            .await
            .context("cannot tell whether the system is idle")?;
        let enriching: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM enrichment_jobs WHERE state IN ('pending', 'running')",
        )
        .fetch_one(&harness.pool)
        .await
        .context("cannot tell whether the system is idle")?;
        let busy = unpublished + enriching;
        if busy == 0 || started.elapsed() >= SETTLE_MAX {
            if started.elapsed() >= Duration::from_millis(100) {
                println!(
                    "bench: waited {:.1} s for the previous scenario's tail ({busy} events and jobs left)",
                    started.elapsed().as_secs_f64()
                );
            }
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `scans` requests of `profile` sent at once (`in_flight` awaiting their PubAck at a time),
/// then the wait for their completion events.
async fn burn_down(
    harness: &Harness,
    name: &'static str,
    profile: &[&'static str],
    scans: usize,
    target: impl Fn(usize) -> String,
    options: &BenchOptions,
) -> anyhow::Result<BurnDown> {
    println!(
        "bench: {name}, {scans} scans of {} sent at once",
        profile.join(" → ")
    );
    let client = &harness.client;
    let organization = harness.organization_id.to_string();
    let outcomes = Outcomes::follow(client, &harness.organization_id).await?;
    let requests: Vec<_> = (0..scans)
        .map(|index| client.request(&organization, &target(index), profile, &key(name, index)))
        .collect();

    let cost_before = telemetry::cost::snapshot();
    let consumers_before = ConsumerBatches::snapshot();
    let refused_before = quota_refused(harness);
    let started = Instant::now();
    let submitted = Arc::new(AtomicU64::new(0));
    let progress =
        outcomes.report_progress(format!("bench {name}"), submitted.clone(), scans, started);
    let sent = publish_at_once(client, &outcomes, &requests, &submitted, options.in_flight).await;
    let requested_at = match sent {
        Ok(requested_at) => requested_at,
        Err(error) => {
            progress.stop().await;
            return Err(error).context("a request was not accepted by JetStream");
        }
    };
    outcomes
        .wait_for(Tally::answered, scans, options.timeout)
        .await;
    let cost = telemetry::cost::spent(&cost_before, &telemetry::cost::snapshot());
    let consumers = ConsumerBatches::spent_since(&consumers_before);
    let refused = quota_refused(harness) - refused_before;
    progress.stop().await;

    let ended = Ended::read(&outcomes, started);
    Ok(BurnDown {
        profile: profile.to_vec(),
        scans,
        completed: ended.completed,
        failed: ended.failed,
        rejected: ended.rejected,
        completion_events_repeated: ended.completion_events_repeated,
        findings: ended.findings,
        latency_ms: ended.latency_ms,
        seconds: ended.seconds,
        scans_per_second: ended.completed as f64 / ended.seconds.max(0.001),
        database_completed: completed_in_database(harness, name).await?,
        handed_on: handed_on(harness, name).await?,
        quota_refused: refused,
        stages: stages::measure(harness, name, &requested_at, &ended.seen_at).await?,
        cost,
        consumers,
        ..BurnDown::default()
    })
}

/// The workers' publishes refused at their quota of waiting results so far.
fn quota_refused(harness: &Harness) -> u64 {
    harness
        .worker_stats
        .iter()
        .map(|stats| stats.snapshot().quota_refused)
        .sum()
}

/// Publishes every request through the durable path, `in_flight` awaiting their PubAck at a
/// time, counting each sent in `submitted`: when each was sent, by idempotency key, or the
/// first refusal (once every request was tried).
async fn publish_at_once(
    client: &client::Client,
    outcomes: &Outcomes,
    requests: &[messages::v1::ScanRequest],
    submitted: &AtomicU64,
    in_flight: usize,
) -> Result<HashMap<String, DateTime<Utc>>, client::ClientError> {
    let sent: Vec<(String, DateTime<Utc>, Result<(), client::ClientError>)> =
        futures::stream::iter(requests)
            .map(|request| async move {
                outcomes.submitting(&request.idempotency_key);
                let requested_at = Utc::now();
                let sent = client.publish(request).await;
                submitted.fetch_add(1, Ordering::Relaxed);
                (request.idempotency_key.clone(), requested_at, sent)
            })
            .buffer_unordered(in_flight.max(1))
            .collect()
            .await;
    let mut requested_at: HashMap<String, DateTime<Utc>> = HashMap::with_capacity(sent.len());
    let mut failed_send = None;
    for (key, at, sent) in sent {
        requested_at.insert(key, at);
        if let Err(error) = sent {
            failed_send.get_or_insert(error);
        }
    }
    match failed_send {
        Some(error) => Err(error),
        None => Ok(requested_at),
    }
}

/// What a scenario's outcome events said when its wait ended: the figures a burn-down and
/// the steady scenario both report.
struct Ended {
    completed: usize,
    failed: usize,
    rejected: usize,
    completion_events_repeated: usize,
    findings: u64,
    latency_ms: Quantiles,
    /// From the first request to the last scan's end.
    seconds: f64,
    /// When each scan's first completion event arrived, by idempotency key.
    seen_at: HashMap<String, DateTime<Utc>>,
}

impl Ended {
    /// The tally of `outcomes` now, for a scenario whose first request was sent at `started`.
    fn read(outcomes: &Outcomes, started: Instant) -> Self {
        let tally = outcomes.tally();
        let last = tally.last_finished.unwrap_or_else(Instant::now);
        Self {
            completed: tally.completed.len(),
            failed: tally.failed.len(),
            rejected: tally.rejected,
            completion_events_repeated: tally.completion_events_repeated(),
            findings: tally.findings,
            latency_ms: Quantiles::from_tally(&tally),
            seconds: last.duration_since(started).as_secs_f64(),
            seen_at: tally.completed_seen_at.clone(),
        }
    }
}

/// The idempotency key of request `index` of scenario `name`.
fn key(name: &str, index: usize) -> String {
    format!("{name}-{index}")
}

/// Scans of scenario `name` that PostgreSQL holds as completed.
async fn completed_in_database(harness: &Harness, name: &str) -> anyhow::Result<i64> {
    sqlx::query_scalar(
        "SELECT count(*) FROM scans WHERE client_id = $1 AND idempotency_key LIKE $2 AND state = 'completed'",
    )
    .bind(harness.client.client_id())
    .bind(format!("{name}-%"))
    .fetch_one(&harness.pool)
    .await
    .with_context(|| format!("cannot count the {name} scans"))
}

/// Of scenario `name`'s first attempts of plugins after a scan's first: how many were leased
/// with their predecessor's completion (their request id is an attempt's id), and how many.
async fn handed_on(harness: &Harness, name: &str) -> anyhow::Result<(i64, i64)> {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM worker_task_attempts p
                                               WHERE p.id = a.acquire_request_id)),
                count(*)
         FROM scans s
         JOIN worker_tasks t ON t.scan_id = s.id AND (t.payload->>'position')::int > 0
         JOIN worker_task_attempts a ON a.task_id = t.id AND a.attempt_number = 1
         WHERE s.client_id = $1 AND s.idempotency_key LIKE $2",
    )
    .bind(harness.client.client_id())
    .bind(format!("{name}-%"))
    .fetch_one(&harness.pool)
    .await
    .with_context(|| format!("cannot count the {name} scans' hand-offs"))
}

/// One request every 1/rate seconds for `duration`, each sent without waiting for the last
/// (an open loop), then the wait for their completion events and the timestamps PostgreSQL
/// recorded for each scan.
async fn steady(harness: &Harness, options: &BenchOptions) -> anyhow::Result<Steady> {
    anyhow::ensure!(
        options.rate > 0.0 && options.rate.is_finite(),
        "--rate must be a positive number"
    );
    let scans = (options.rate * options.duration.as_secs_f64()).round() as usize;
    println!(
        "bench: steady, {:.1} scans/s of synthetic offered for {:.1} s ({scans} scans)",
        options.rate,
        options.duration.as_secs_f64()
    );
    let outcomes = Outcomes::follow(&harness.client, &harness.organization_id).await?;
    let started = Instant::now();
    let submitted = Arc::new(AtomicU64::new(0));
    let progress =
        outcomes.report_progress(format!("bench {STEADY}"), submitted.clone(), scans, started);
    let requested_at = match offer(harness, &outcomes, scans, options.rate, &submitted).await {
        Ok(requested_at) => requested_at,
        Err(error) => {
            progress.stop().await;
            return Err(error);
        }
    };
    let send_seconds = started.elapsed().as_secs_f64();
    outcomes
        .wait_for(Tally::answered, scans, options.timeout)
        .await;
    progress.stop().await;

    let ended = Ended::read(&outcomes, started);
    Ok(Steady {
        offered_per_second: options.rate,
        duration_seconds: options.duration.as_secs_f64(),
        scans,
        send_seconds,
        completed: ended.completed,
        failed: ended.failed,
        rejected: ended.rejected,
        completion_events_repeated: ended.completion_events_repeated,
        latency_ms: ended.latency_ms,
        seconds: ended.seconds,
        achieved_per_second: ended.completed as f64 / ended.seconds.max(0.001),
        database_completed: completed_in_database(harness, STEADY).await?,
        stages: stages::measure(harness, STEADY, &requested_at, &ended.seen_at).await?,
    })
}

/// The steady scenario's name, the prefix of its idempotency keys.
const STEADY: &str = "steady";

/// The steady scenario's open loop: `scans` one-plugin requests, one every 1/`rate` seconds,
/// each published in a task of its own; returns when every publish was answered, with when
/// each request was sent (by idempotency key), or at the first that failed.
async fn offer(
    harness: &Harness,
    outcomes: &Outcomes,
    scans: usize,
    rate: f64,
    submitted: &Arc<AtomicU64>,
) -> anyhow::Result<HashMap<String, DateTime<Utc>>> {
    let client = &harness.client;
    let organization = harness.organization_id.to_string();
    let mut requested_at: HashMap<String, DateTime<Utc>> = HashMap::with_capacity(scans);
    let mut ticker = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    let mut sends = JoinSet::new();
    for index in 0..scans {
        ticker.tick().await;
        let target = format!("synthetic://bench/{STEADY}/{index}?duration_ms=0&findings=1");
        let request = client.request(
            &organization,
            &target,
            &BURN_DOWN_PROFILE,
            &key(STEADY, index),
        );
        outcomes.submitting(&request.idempotency_key);
        requested_at.insert(request.idempotency_key.clone(), Utc::now());
        let client = client.clone();
        let submitted = submitted.clone();
        sends.spawn(async move {
            let sent = client.publish(&request).await;
            submitted.fetch_add(1, Ordering::Relaxed);
            sent
        });
    }
    while let Some(sent) = sends.join_next().await {
        sent.context("a send panicked")?
            .context("a request was not accepted by JetStream")?;
    }
    Ok(requested_at)
}

/// `/proc/loadavg`'s three load averages, or why not.
fn load_average() -> String {
    match std::fs::read_to_string("/proc/loadavg") {
        Ok(text) => text
            .split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        Err(error) => format!("unknown ({error})"),
    }
}

fn round(value: f64) -> f64 {
    (value * 100.0).round() / 100.0
}
