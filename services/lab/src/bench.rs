//! `palisade bench`: throughput, latency and cost of the whole system in one process, against
//! a fresh database and subject prefix, next to a ceiling the same PostgreSQL sets.
//!
//! Four scenarios, all run by default (`--only` picks some):
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
//! - **profile**: the same with the demo's three-plugin profile (`tcp_connect → http_headers →
//!   synthetic` against a local web app; admission refuses a plugin twice in a profile, so
//!   three `synthetic` stages are not possible).
//! - **steady**: a fixed offered load for a while; achieved scans/s, latency, pickup, and where
//!   the time went per stage, from the timestamps PostgreSQL holds after the run.
//!
//! Requests go through the durable path (`client.publish`: JetStream PubAck, admission consumes
//! the request stream), and completion is what a client sees: the `scan.completed` events of
//! `client.outcomes()`.

mod cpu;

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

use crate::harness::{Harness, Outcomes, Tally, print_cost, start_local_web_app, total_cost};

/// The scenarios `--only` can pick.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum)]
pub enum Scenario {
    /// The fenced-step ceiling of this PostgreSQL.
    Ceiling,
    /// N one-plugin scans at once, with their cost per scan.
    BurnDown,
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
        })
    }
}

/// `palisade bench`: runs the scenarios, prints the table and the JSON document, and fails
/// unless every check held.
pub async fn command(common: CommonSettings, args: BenchArgs) -> anyhow::Result<()> {
    let options = BenchOptions::try_from(args)?;
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

/// What the ceiling measured.
#[derive(Debug, Clone, Default)]
pub struct Ceiling {
    pub connections: usize,
    pub seconds: f64,
    pub steps: u64,
    pub steps_per_second: f64,
    /// Fenced UPDATEs that did not match their (live, correctly tokened) lease row.
    pub fence_misses: u64,
    /// Whether an UPDATE with a stale token matched nothing.
    pub stale_token_refused: bool,
    /// Result and outbox rows in the scratch tables afterwards (both phases).
    pub result_rows: i64,
    pub outbox_rows: i64,
    /// The batched phase: [`CEILING_BATCH`] fenced steps per commit, for as long again.
    pub batched: BatchedCeiling,
}

/// What the ceiling's batched phase measured.
#[derive(Debug, Clone, Copy, Default)]
pub struct BatchedCeiling {
    pub per_commit: usize,
    pub seconds: f64,
    pub steps: u64,
    pub steps_per_second: f64,
    /// Fenced steps of a batch that did not match their lease row.
    pub fence_misses: u64,
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
    let cpu_before = cpu::sample();
    let mut run = run.await?;
    run.cpu = cpu_before
        .zip(cpu::sample())
        .and_then(|(before, after)| cpu::split(&before, &after));
    settle(harness).await?;
    run.writes = writes_between(&before, &table_writes(harness).await?);
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
        for line in bus::metrics::encode_text().lines() {
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

/// One stage of a scan's life, over the scans of the steady scenario.
#[derive(Debug, Clone)]
pub struct Stage {
    pub name: &'static str,
    pub span: &'static str,
    pub samples: usize,
    pub ms: Quantiles,
}

/// Where a scenario's time went: pickup and the stages of its scans' lives.
#[derive(Debug, Clone, Default)]
pub struct Stages {
    /// Request to the first attempt of the first task.
    pub pickup_ms: Quantiles,
    pub stages: Vec<Stage>,
    /// Scans lacking a timestamp a stage needs.
    pub incomplete_timestamps: usize,
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
            ceiling(
                &harness.common.database.url,
                options.ceiling_connections,
                options.ceiling_duration,
            )
            .await
            .context("the ceiling failed")?,
        );
    }
    if wants(Scenario::BurnDown) {
        report.burn_down = Some(
            burn_down_writing(
                harness,
                burn_down(
                    harness,
                    "burn-down",
                    &BURN_DOWN_PROFILE,
                    options.scans,
                    |index| format!("synthetic://bench/burn-down/{index}?duration_ms=0&findings=1"),
                    options,
                ),
            )
            .await?,
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
        stages: stages(harness, name, &requested_at, &ended.seen_at).await?,
        cost,
        consumers,
        ..BurnDown::default()
    })
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
        stages: stages(harness, STEADY, &requested_at, &ended.seen_at).await?,
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

/// A scan's timestamps as PostgreSQL recorded them (`now()`: the start of the transaction
/// that wrote each).
type ScanTimes = (
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

/// The stages of a scan's life, each a name and the span it measures, in the order
/// [`stage_samples`] measures them.
const STAGES: [(&str, &str); 7] = [
    ("admission", "request sent → scans.created_at"),
    (
        "acquire",
        "scans.created_at → first attempt created_at (leased)",
    ),
    (
        "result",
        "leased → first worker_result_batches.persisted_at",
    ),
    ("completion", "first result persisted → scans.finished_at"),
    ("event", "scans.finished_at → client saw scan.completed"),
    (
        "event.publish",
        "scans.finished_at → scan.completed stored on the stream",
    ),
    (
        "event.read",
        "stored → the client's events request answered it",
    ),
];

/// Pickup and the time per stage of scenario `name`'s scans, from PostgreSQL's timestamps,
/// the time each request was sent and the time its completion event arrived.
async fn stages(
    harness: &Harness,
    name: &str,
    requested_at: &HashMap<String, DateTime<Utc>>,
    seen_at: &HashMap<String, DateTime<Utc>>,
) -> anyhow::Result<Stages> {
    let rows = scan_times(harness, name).await?;
    let stored_at = completions_stored_at(harness, name).await?;
    let (pickup, spans, incomplete) = stage_samples(rows, requested_at, &stored_at, seen_at);
    // Requests whose scan PostgreSQL does not hold lack every timestamp.
    let missing = requested_at.len().saturating_sub(pickup.len() + incomplete);
    Ok(Stages {
        pickup_ms: Quantiles::of(&pickup),
        stages: STAGES
            .into_iter()
            .zip(spans)
            .map(|((name, span), samples)| Stage {
                name,
                span,
                samples: samples.len(),
                ms: Quantiles::of(&samples),
            })
            .collect(),
        incomplete_timestamps: incomplete + missing,
    })
}

/// The timestamps PostgreSQL holds for each of scenario `name`'s scans.
async fn scan_times(harness: &Harness, name: &str) -> anyhow::Result<Vec<ScanTimes>> {
    // There is no `leased_at`: an attempt row is created by the transaction that grants the
    // lease, so its `created_at` is the lease time.
    sqlx::query_as(
        "SELECT s.idempotency_key, s.created_at, min(a.created_at) AS leased_at,
                min(b.persisted_at) AS first_result_at, s.finished_at
           FROM scans s
           LEFT JOIN worker_tasks t ON t.scan_id = s.id
           LEFT JOIN worker_task_attempts a ON a.task_id = t.id
           LEFT JOIN worker_result_batches b ON b.task_id = t.id
          WHERE s.client_id = $1 AND s.idempotency_key LIKE $2
          GROUP BY s.id",
    )
    .bind(harness.client.client_id())
    .bind(format!("{name}-%"))
    .fetch_all(&harness.pool)
    .await
    .context("cannot read the scans' timestamps")
}

/// Each scan's pickup and its time in each of the [`STAGES`], in milliseconds, from its
/// timestamps and when its request was sent, its completion stored and seen; and how many
/// scans lacked one of those and were left out.
fn stage_samples(
    rows: Vec<ScanTimes>,
    requested_at: &HashMap<String, DateTime<Utc>>,
    stored_at: &HashMap<String, DateTime<Utc>>,
    seen_at: &HashMap<String, DateTime<Utc>>,
) -> (Vec<f64>, [Vec<f64>; STAGES.len()], usize) {
    let ms = |from: DateTime<Utc>, to: DateTime<Utc>| {
        (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1_000.0
    };
    let mut pickup = Vec::new();
    let mut spans: [Vec<f64>; STAGES.len()] = Default::default();
    let mut incomplete = 0;
    for (key, created_at, leased_at, first_result_at, finished_at) in rows {
        let (
            Some(requested),
            Some(leased),
            Some(first_result),
            Some(finished),
            Some(stored),
            Some(seen),
        ) = (
            requested_at.get(&key).copied(),
            leased_at,
            first_result_at,
            finished_at,
            stored_at.get(&key).copied(),
            seen_at.get(&key).copied(),
        )
        else {
            incomplete += 1;
            continue;
        };
        pickup.push(ms(requested, leased));
        for (samples, (from, to)) in spans.iter_mut().zip([
            (requested, created_at),
            (created_at, leased),
            (leased, first_result),
            (first_result, finished),
            (finished, seen),
            (finished, stored),
            (stored, seen),
        ]) {
            samples.push(ms(from, to));
        }
    }
    (pickup, spans, incomplete)
}

/// When each `scan.completed` of scenario `name` was stored on the events stream (the stream's
/// own timestamp), by idempotency key: read back after the run with an ordered consumer.
async fn completions_stored_at(
    harness: &Harness,
    name: &str,
) -> anyhow::Result<HashMap<String, DateTime<Utc>>> {
    use bus::async_nats::jetstream::consumer::pull::OrderedConfig;
    use prost::Message as _;

    let subjects = harness.bus.subjects();
    let stream = harness
        .bus
        .jetstream()
        .get_stream(subjects.events_stream())
        .await
        .context("cannot open the events stream")?;
    let mut stored_at = HashMap::new();
    if stream.cached_info().state.messages == 0 {
        return Ok(stored_at);
    }
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: subjects
                .tenant_event(&harness.organization_id, messages::EventKind::ScanCompleted),
            ..OrderedConfig::default()
        })
        .await
        .context("cannot read the events stream back")?;
    let mut messages = consumer
        .messages()
        .await
        .context("cannot read the events stream back")?;
    let prefix = format!("{name}-");
    // Ends at the last stored completion, or after a quiet second (none stored at all).
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_secs(1), messages.next()).await
    {
        let message = message.context("reading the events stream back")?;
        let info = message
            .info()
            .map_err(|error| anyhow::anyhow!("a stream message without its info: {error}"))?;
        let pending = info.pending;
        let published = DateTime::<Utc>::from_timestamp_nanos(
            i64::try_from(info.published.unix_timestamp_nanos()).unwrap_or(i64::MAX),
        );
        if let Ok(event) = messages::v1::ScanCompleted::decode(message.payload.as_ref())
            && event.idempotency_key.starts_with(&prefix)
        {
            stored_at.entry(event.idempotency_key).or_insert(published);
        }
        if pending == 0 {
            break;
        }
    }
    Ok(stored_at)
}

/// The statements that set up the ceiling's scratch tables, shaped like palisade's own:
/// a lease row with a token and an expiry, result rows unique per (lease, sequence), an outbox
/// with a partial index on what is unpublished.
const CEILING_SCHEMA: [&str; 4] = [
    "CREATE TABLE bench_leases (
        id BIGINT PRIMARY KEY,
        token TEXT NOT NULL,
        expires_at TIMESTAMPTZ NOT NULL,
        renewed_at TIMESTAMPTZ NULL,
        steps BIGINT NOT NULL DEFAULT 0)",
    "CREATE TABLE bench_results (
        id BIGSERIAL PRIMARY KEY,
        lease_id BIGINT NOT NULL REFERENCES bench_leases(id),
        sequence BIGINT NOT NULL,
        payload JSONB NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        UNIQUE (lease_id, sequence))",
    "CREATE TABLE bench_outbox (
        id BIGSERIAL PRIMARY KEY,
        subject TEXT NOT NULL,
        payload BYTEA NOT NULL,
        created_at TIMESTAMPTZ NOT NULL DEFAULT now(),
        published_at TIMESTAMPTZ NULL)",
    "CREATE INDEX bench_outbox_unpublished ON bench_outbox (id) WHERE published_at IS NULL",
];

/// Statements of one fenced step as the cost counter counts them: UPDATE, two INSERTs and
/// COMMIT (sqlx does not report `BEGIN`).
const CEILING_STATEMENTS_PER_STEP: u64 = 4;

/// Fenced steps per commit in the ceiling's batched phase: about what palisade's consumers
/// decide per transaction under load.
pub const CEILING_BATCH: usize = 100;

/// Where the batched phase's lease rows begin, after the one-step phase's.
const CEILING_BATCH_LEASES_FROM: i64 = 1_000_000;

/// `connections` connections each repeating the fenced step on a lease row of its own for
/// `duration`, then the same batched, then the checks of what they wrote.
async fn ceiling(
    database_url: &str,
    connections: usize,
    duration: Duration,
) -> anyhow::Result<Ceiling> {
    anyhow::ensure!(connections > 0, "--ceiling-connections must be at least 1");
    let mut settings = store::DatabaseSettings::new(database_url);
    settings.max_connections = connections as u32;
    let pool = store::connect(&settings).await?;
    create_ceiling_tables(&pool, connections).await?;
    let (steps, fence_misses, seconds) = fenced_in_parallel(
        connections,
        duration,
        "a fenced stepper",
        |connection, deadline| {
            let pool = pool.clone();
            async move { fenced_steps(&pool, connection + 1, deadline).await }
        },
    )
    .await?;
    // The same, batched: each connection fences its own CEILING_BATCH leases per commit.
    let (batched_steps, batched_misses, batched_seconds) = fenced_in_parallel(
        connections,
        duration,
        "a batched fenced stepper",
        |connection, deadline| {
            let pool = pool.clone();
            let first = CEILING_BATCH_LEASES_FROM + connection * CEILING_BATCH as i64;
            async move { fenced_batches(&pool, first, deadline).await }
        },
    )
    .await?;
    let stale_token_refused = sqlx::query(
        "UPDATE bench_leases SET renewed_at = now()
          WHERE id = 1 AND token = 'stale' AND expires_at > now()",
    )
    .execute(&pool)
    .await?
    .rows_affected()
        == 0;
    let (result_rows, outbox_rows) = sqlx::query_as::<_, (i64, i64)>(
        "SELECT (SELECT count(*) FROM bench_results), (SELECT count(*) FROM bench_outbox)",
    )
    .fetch_one(&pool)
    .await?;
    pool.close().await;
    Ok(Ceiling {
        connections,
        seconds,
        steps,
        steps_per_second: steps as f64 / seconds.max(0.001),
        fence_misses,
        stale_token_refused,
        result_rows,
        outbox_rows,
        batched: BatchedCeiling {
            per_commit: CEILING_BATCH,
            seconds: batched_seconds,
            steps: batched_steps,
            steps_per_second: batched_steps as f64 / batched_seconds.max(0.001),
            fence_misses: batched_misses,
        },
    })
}

/// The ceiling's scratch tables, and the lease rows of both phases: one per connection for
/// the one-step phase, [`CEILING_BATCH`] per connection for the batched one.
async fn create_ceiling_tables(pool: &sqlx::PgPool, connections: usize) -> anyhow::Result<()> {
    for statement in CEILING_SCHEMA {
        sqlx::query(statement)
            .execute(pool)
            .await
            .context("cannot create the ceiling's scratch tables")?;
    }
    sqlx::query(
        "INSERT INTO bench_leases (id, token, expires_at)
         SELECT g, md5(g::text), now() + interval '1 hour' FROM generate_series(1, $1) g
         UNION ALL
         SELECT g, md5(g::text), now() + interval '1 hour'
         FROM generate_series($2, $2 + $1 * $3 - 1) g",
    )
    .bind(connections as i64)
    .bind(CEILING_BATCH_LEASES_FROM)
    .bind(CEILING_BATCH as i64)
    .execute(pool)
    .await
    .context("cannot create the ceiling's leases")?;
    Ok(())
}

/// One phase of the ceiling: `stepper` run once per connection (given its index, from 0, and
/// the deadline `duration` from now), all at once. Returns the steps and the fence misses they
/// counted, and the seconds until the last ended; `stepper` names them when one panics.
async fn fenced_in_parallel<F>(
    connections: usize,
    duration: Duration,
    stepper: &str,
    start: impl Fn(i64, Instant) -> F,
) -> anyhow::Result<(u64, u64, f64)>
where
    F: std::future::Future<Output = anyhow::Result<(u64, u64)>> + Send + 'static,
{
    let started = Instant::now();
    let deadline = started + duration;
    let mut steppers = JoinSet::new();
    for connection in 0..connections as i64 {
        steppers.spawn(start(connection, deadline));
    }
    let (mut steps, mut misses) = (0, 0);
    while let Some(stepped) = steppers.join_next().await {
        let (stepped, missed) = stepped.with_context(|| format!("{stepper} panicked"))??;
        steps += stepped;
        misses += missed;
    }
    Ok((steps, misses, started.elapsed().as_secs_f64()))
}

/// The fenced step on lease row `lease` until `deadline`: returns the steps committed and the
/// fenced UPDATEs that matched nothing (rolled back; there should be none).
async fn fenced_steps(
    pool: &sqlx::PgPool,
    lease: i64,
    deadline: Instant,
) -> anyhow::Result<(u64, u64)> {
    let token: String = sqlx::query_scalar("SELECT token FROM bench_leases WHERE id = $1")
        .bind(lease)
        .fetch_one(pool)
        .await?;
    let finding = json!({
        "rule_id": "bench-0",
        "severity": "medium",
        "resource": "bench://ceiling",
        "title": "a result row the size of one finding",
    });
    let outbox_payload = vec![0x5a_u8; 160];
    let (mut steps, mut misses) = (0_u64, 0_u64);
    while Instant::now() < deadline {
        let mut transaction = pool.begin().await?;
        let fenced = sqlx::query(
            "UPDATE bench_leases SET renewed_at = now(), steps = steps + 1
              WHERE id = $1 AND token = $2 AND expires_at > now()",
        )
        .bind(lease)
        .bind(&token)
        .execute(&mut *transaction)
        .await?
        .rows_affected();
        if fenced != 1 {
            misses += 1;
            transaction.rollback().await?;
            continue;
        }
        sqlx::query("INSERT INTO bench_results (lease_id, sequence, payload) VALUES ($1, $2, $3)")
            .bind(lease)
            .bind(steps as i64)
            .bind(&finding)
            .execute(&mut *transaction)
            .await?;
        sqlx::query("INSERT INTO bench_outbox (subject, payload) VALUES ($1, $2)")
            .bind("bench.v1.event.result")
            .bind(&outbox_payload)
            .execute(&mut *transaction)
            .await?;
        transaction.commit().await?;
        steps += 1;
    }
    Ok((steps, misses))
}

/// The fenced step set-wise on the [`CEILING_BATCH`] lease rows from `first` until `deadline`:
/// one UPDATE fencing all of them by id and token, one INSERT of their results, one of their
/// outbox rows, COMMIT. Returns the steps committed and the leases a batch's UPDATE did not
/// match (the batch is rolled back; there should be none).
async fn fenced_batches(
    pool: &sqlx::PgPool,
    first: i64,
    deadline: Instant,
) -> anyhow::Result<(u64, u64)> {
    let ids: Vec<i64> = (first..first + CEILING_BATCH as i64).collect();
    let tokens: Vec<String> = sqlx::query_scalar(
        "SELECT l.token FROM UNNEST($1::bigint[]) WITH ORDINALITY AS i(id, position)
         JOIN bench_leases l ON l.id = i.id ORDER BY i.position",
    )
    .bind(&ids)
    .fetch_all(pool)
    .await?;
    let findings: Vec<serde_json::Value> = (0..CEILING_BATCH)
        .map(|index| {
            json!({
                "rule_id": format!("bench-{index}"),
                "severity": "medium",
                "resource": "bench://ceiling",
                "title": "a result row the size of one finding",
            })
        })
        .collect();
    let subjects = vec!["bench.v1.event.result"; CEILING_BATCH];
    let outbox_payloads = vec![vec![0x5a_u8; 160]; CEILING_BATCH];
    let (mut steps, mut misses, mut sequence) = (0_u64, 0_u64, 0_i64);
    while Instant::now() < deadline {
        let mut transaction = pool.begin().await?;
        let fenced = sqlx::query(
            "UPDATE bench_leases l SET renewed_at = now(), steps = l.steps + 1
              FROM UNNEST($1::bigint[], $2::text[]) AS f(id, token)
              WHERE l.id = f.id AND l.token = f.token AND l.expires_at > now()",
        )
        .bind(&ids)
        .bind(&tokens)
        .execute(&mut *transaction)
        .await?
        .rows_affected();
        if fenced != CEILING_BATCH as u64 {
            misses += CEILING_BATCH as u64 - fenced;
            transaction.rollback().await?;
            continue;
        }
        sqlx::query(
            "INSERT INTO bench_results (lease_id, sequence, payload)
             SELECT id, $2, payload FROM UNNEST($1::bigint[], $3::jsonb[]) AS r(id, payload)",
        )
        .bind(&ids)
        .bind(sequence)
        .bind(&findings)
        .execute(&mut *transaction)
        .await?;
        sqlx::query(
            "INSERT INTO bench_outbox (subject, payload)
             SELECT * FROM UNNEST($1::text[], $2::bytea[])",
        )
        .bind(&subjects)
        .bind(&outbox_payloads)
        .execute(&mut *transaction)
        .await?;
        transaction.commit().await?;
        steps += CEILING_BATCH as u64;
        sequence += 1;
    }
    Ok((steps, misses))
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

/// A named check and whether it held.
type Check = (String, bool);

/// Every check of the report.
pub fn checks(report: &BenchReport) -> Vec<Check> {
    let mut checks = Vec::new();
    if let Some(ceiling) = &report.ceiling {
        checks.push((
            "ceiling: every fenced UPDATE matched its lease, a stale token matched none".into(),
            ceiling.fence_misses == 0
                && ceiling.batched.fence_misses == 0
                && ceiling.stale_token_refused,
        ));
        let steps = (ceiling.steps + ceiling.batched.steps) as i64;
        checks.push((
            "ceiling: one result row and one outbox row per committed step".into(),
            ceiling.result_rows == steps && ceiling.outbox_rows == steps,
        ));
    }
    for (name, run) in [
        ("burn-down", &report.burn_down),
        ("profile", &report.profile),
    ] {
        if let Some(run) = run {
            checks.push((
                format!("{name}: every scan completed exactly once"),
                run.completed == run.scans
                    && run.failed == 0
                    && run.rejected == 0
                    && run.completion_events_repeated == 0
                    && run.database_completed == run.scans as i64,
            ));
            checks.push((
                format!("{name}: every scan has every stage's timestamps"),
                run.stages.incomplete_timestamps == 0,
            ));
        }
    }
    if let Some(steady) = &report.steady {
        checks.push((
            "steady: every scan completed exactly once".into(),
            steady.completed == steady.scans
                && steady.failed == 0
                && steady.rejected == 0
                && steady.completion_events_repeated == 0
                && steady.database_completed == steady.scans as i64,
        ));
        checks.push((
            "steady: every scan has every stage's timestamps".into(),
            steady.stages.incomplete_timestamps == 0,
        ));
    }
    checks
}

/// The width of the benchmark's table.
const TABLE_WIDTH: usize = 78;

/// The steps per second of the ceiling's two phases, when it ran: what throughputs are
/// compared with.
type CeilingRates = Option<(f64, f64)>;

/// Prints the report as a table; returns whether every check held.
pub fn print_report(report: &BenchReport) -> bool {
    let ceiling = report
        .ceiling
        .as_ref()
        .map(|ceiling| (ceiling.steps_per_second, ceiling.batched.steps_per_second));
    print_setting(report);
    if let Some(ceiling) = &report.ceiling {
        print_ceiling(ceiling);
    }
    for (name, run) in [
        ("burn-down", &report.burn_down),
        ("profile", &report.profile),
    ] {
        if let Some(run) = run {
            print_burn_down(name, run, ceiling);
        }
    }
    if let Some(steady) = &report.steady {
        print_steady(steady, ceiling);
    }
    println!("total {:.1} s", report.total_seconds);
    let mut all = true;
    for (name, held) in checks(report) {
        println!("{name:<72} {}", if held { "yes" } else { "NO" });
        all &= held;
    }
    all
}

/// A throughput as a ratio to both ceilings (nothing when the ceiling did not run).
fn ratio(per_second: f64, ceiling: CeilingRates) -> String {
    match ceiling {
        Some((steps, batched)) if steps > 0.0 && batched > 0.0 => format!(
            "{:.3} × ceiling, {:.3} × batched",
            per_second / steps,
            per_second / batched
        ),
        _ => String::new(),
    }
}

/// A line across the table.
fn rule() {
    println!("{}", "-".repeat(TABLE_WIDTH));
}

/// The table's head: when, on what, with how many workers and how much history.
fn print_setting(report: &BenchReport) {
    let host = &report.host;
    println!();
    println!("palisade bench, {}", host.date);
    println!(
        "host: {} cores, load average {} before, {} after; PostgreSQL {}, NATS {}",
        host.cores, host.load_before, host.load_after, host.postgresql, host.nats
    );
    println!(
        "everything in one process: five services, {} workers × {} leases; requests by client.publish ({} awaiting PubAck at once)",
        report.workers, report.worker_capacity, report.in_flight
    );
    println!(
        "history: {} completed scans in the tables before the scenarios ran",
        report.history
    );
    rule();
}

/// The ceiling's rows: both phases' steps per second.
fn print_ceiling(ceiling: &Ceiling) {
    println!(
        "{:<46} {:>12.0} steps/s",
        format!(
            "ceiling: fenced step, {} connections, {:.1} s",
            ceiling.connections, ceiling.seconds
        ),
        ceiling.steps_per_second
    );
    println!("  (UPDATE lease WHERE token AND expiry, INSERT result, INSERT outbox, COMMIT)");
    println!(
        "{:<46} {:>12.0} steps/s",
        format!(
            "ceiling, batched: {} steps per commit, {:.1} s",
            ceiling.batched.per_commit, ceiling.batched.seconds
        ),
        ceiling.batched.steps_per_second
    );
    println!("  (the same three statements set-wise over the batch's leases, COMMIT)");
    rule();
}

/// A burn-down's rows: throughput, outcomes, latency, the bound the ceiling sets, the stages,
/// the cost, the writes, the CPU and the consumers' batches.
fn print_burn_down(name: &str, run: &BurnDown, ceiling: CeilingRates) {
    println!(
        "{:<46} {:>12.1} scans/s  {}",
        format!("{name}: {} scans at once", run.scans),
        run.scans_per_second,
        ratio(run.scans_per_second, ceiling)
    );
    println!(
        "  {}: completed {} failed {} refused {} in {:.1} s; {} findings",
        run.profile.join(" → "),
        run.completed,
        run.failed,
        run.rejected,
        run.seconds,
        run.findings
    );
    println!(
        "  request → completion event  p50 {:.0} ms  p95 {:.0} ms  p99 {:.0} ms",
        run.latency_ms.p50, run.latency_ms.p95, run.latency_ms.p99
    );
    let total = total_cost(&run.cost);
    let per_scan = |count: u64| count as f64 / run.completed.max(1) as f64;
    if let Some((steps, _)) = ceiling {
        println!(
            "  bound by the ceiling's PostgreSQL: {:.0} scans/s by statements ({} per step), {:.0} by commits",
            steps * CEILING_STATEMENTS_PER_STEP as f64 / per_scan(total.statements).max(0.001),
            CEILING_STATEMENTS_PER_STEP,
            steps / per_scan(total.commits).max(0.001),
        );
    }
    print_stages(&run.stages);
    print_cost(&run.cost, run.completed, TABLE_WIDTH);
    print_writes(&run.writes, run.completed);
    if let Some(cpu) = &run.cpu {
        println!("  CPU of the machine: {}", cpu.line());
    }
    for (consumer, spent) in &run.consumers {
        println!(
            "  consumer {consumer}: {:.0} batches, {:.1} messages and {:.1} ms each",
            spent.batches,
            spent.messages / spent.batches.max(1.0),
            spent.handler_seconds * 1000.0 / spent.batches.max(1.0),
        );
    }
}

/// The steady scenario's rows: achieved throughput, outcomes, latency and the stages.
fn print_steady(steady: &Steady, ceiling: CeilingRates) {
    println!(
        "{:<46} {:>12.1} scans/s  {}",
        format!(
            "steady: {:.0} scans/s offered for {:.0} s",
            steady.offered_per_second, steady.duration_seconds
        ),
        steady.achieved_per_second,
        ratio(steady.achieved_per_second, ceiling)
    );
    println!(
        "  {} sent in {:.1} s; completed {} failed {} refused {}, the last {:.1} s after the first request",
        steady.scans,
        steady.send_seconds,
        steady.completed,
        steady.failed,
        steady.rejected,
        steady.seconds
    );
    println!(
        "  request → completion event  p50 {:.1} ms  p95 {:.1} ms  p99 {:.1} ms",
        steady.latency_ms.p50, steady.latency_ms.p95, steady.latency_ms.p99
    );
    print_stages(&steady.stages);
    rule();
}

/// Row versions written per completed scan, in all and per table.
fn print_writes(writes: &BTreeMap<String, TableWrites>, completed: usize) {
    let per_scan = |count: i64| count as f64 / completed.max(1) as f64;
    let mut total = TableWrites::default();
    for table in writes.values() {
        total.add(table);
    }
    println!(
        "  row versions per scan {:.1}: inserted {:.1}, updated {:.1} ({:.1} HOT); deleted {:.1}",
        per_scan(total.row_versions()),
        per_scan(total.inserted),
        per_scan(total.updated),
        per_scan(total.hot_updated),
        per_scan(total.deleted),
    );
    for (table, spent) in writes {
        println!(
            "    {table:<28} {:>6.2} = {:.2} inserted + {:.2} updated ({:.2} HOT); {:.2} deleted",
            per_scan(spent.row_versions()),
            per_scan(spent.inserted),
            per_scan(spent.updated),
            per_scan(spent.hot_updated),
            per_scan(spent.deleted),
        );
    }
}

/// Pickup and the stages, as rows of the table.
fn print_stages(stages: &Stages) {
    println!(
        "  pickup (request → leased)   p50 {:.1} ms  p99 {:.1} ms",
        stages.pickup_ms.p50, stages.pickup_ms.p99
    );
    println!(
        "  {:<13} {:>9} {:>9}  from → to (PostgreSQL's now(): the writing transaction's start)",
        "stage", "p50 ms", "p99 ms"
    );
    for stage in &stages.stages {
        println!(
            "  {:<13} {:>9.1} {:>9.1}  {}",
            stage.name, stage.ms.p50, stage.ms.p99, stage.span
        );
    }
    if stages.incomplete_timestamps > 0 {
        println!(
            "  {} scans lack a timestamp and are left out of the stages",
            stages.incomplete_timestamps
        );
    }
}

/// Pickup and the stages as JSON fields.
fn stages_json(stages: &Stages) -> serde_json::Value {
    let by_name: serde_json::Map<String, serde_json::Value> = stages
        .stages
        .iter()
        .map(|stage| {
            (
                stage.name.to_owned(),
                json!({
                    "span": stage.span,
                    "samples": stage.samples,
                    "p50_ms": round(stage.ms.p50),
                    "p99_ms": round(stage.ms.p99),
                }),
            )
        })
        .collect();
    json!({
        "pickup_ms": { "p50": round(stages.pickup_ms.p50), "p99": round(stages.pickup_ms.p99) },
        "stages": by_name,
        "incomplete_timestamps": stages.incomplete_timestamps,
    })
}

/// The report as one JSON document.
pub fn to_json(report: &BenchReport) -> serde_json::Value {
    let ceiling = report.ceiling.as_ref();
    let checks: Vec<serde_json::Value> = checks(report)
        .into_iter()
        .map(|(name, held)| json!({ "name": name, "held": held }))
        .collect();
    let ok = checks.iter().all(|check| check["held"] == true);
    json!({
        "date": report.host.date,
        "host": {
            "cores": report.host.cores,
            "load_average_before": report.host.load_before,
            "load_average_after": report.host.load_after,
            "postgresql": report.host.postgresql,
            "nats": report.host.nats,
            "one_host": true,
        },
        "settings": {
            "workers": report.workers,
            "worker_capacity": report.worker_capacity,
            "submission": "client.publish (durable, JetStream PubAck)",
            "in_flight": report.in_flight,
            "history_completed_scans": report.history,
        },
        "ceiling": ceiling.map(ceiling_json),
        "burn_down": report.burn_down.as_ref().map(|run| burn_down_json(run, ceiling)),
        "profile": report.profile.as_ref().map(|run| burn_down_json(run, ceiling)),
        "steady": report.steady.as_ref().map(|steady| steady_json(steady, ceiling)),
        "total_seconds": round(report.total_seconds),
        "checks": checks,
        "ok": ok,
    })
}

/// `per_second` as a ratio to `steps_per_second`, when that was measured.
fn ratio_to(per_second: f64, steps_per_second: Option<f64>) -> Option<f64> {
    steps_per_second
        .filter(|steps| *steps > 0.0)
        .map(|steps| per_second / steps)
}

/// The ceiling's two phases as JSON.
fn ceiling_json(ceiling: &Ceiling) -> serde_json::Value {
    json!({
        "step": "UPDATE lease WHERE id AND token AND expires_at > now(); INSERT result; INSERT outbox; COMMIT",
        "connections": ceiling.connections,
        "seconds": round(ceiling.seconds),
        "steps": ceiling.steps,
        "steps_per_second": round(ceiling.steps_per_second),
        "batched": {
            "steps_per_commit": ceiling.batched.per_commit,
            "seconds": round(ceiling.batched.seconds),
            "steps": ceiling.batched.steps,
            "steps_per_second": round(ceiling.batched.steps_per_second),
        },
    })
}

/// A burn-down as JSON, its throughput also as ratios to the ceiling's phases.
fn burn_down_json(run: &BurnDown, ceiling: Option<&Ceiling>) -> serde_json::Value {
    let per_scan = |count: i64| round(count as f64 / run.completed.max(1) as f64);
    json!({
        "profile": run.profile,
        "scans": run.scans,
        "completed": run.completed,
        "failed": run.failed,
        "refused": run.rejected,
        "completion_events_repeated": run.completion_events_repeated,
        "database_completed": run.database_completed,
        "findings": run.findings,
        "seconds": round(run.seconds),
        "scans_per_second": round(run.scans_per_second),
        "ratio_to_ceiling": ratio_to(
            run.scans_per_second,
            ceiling.map(|ceiling| ceiling.steps_per_second),
        ),
        "ratio_to_batched_ceiling": ratio_to(
            run.scans_per_second,
            ceiling.map(|ceiling| ceiling.batched.steps_per_second),
        ),
        "latency_ms": run.latency_ms.to_json(),
        "time": stages_json(&run.stages),
        "cost_per_scan": cost_json(&run.cost, run.completed),
        "writes_per_scan": run.writes.iter().map(|(table, spent)| {
            (table.clone(), json!({
                "row_versions": per_scan(spent.row_versions()),
                "inserted": per_scan(spent.inserted),
                "updated": per_scan(spent.updated),
                "hot_updated": per_scan(spent.hot_updated),
                "deleted": per_scan(spent.deleted),
            }))
        }).collect::<serde_json::Map<_, _>>(),
        "cpu": run.cpu.map(cpu::CpuSplit::to_json),
        "consumers": run.consumers.iter().map(|(consumer, spent)| (consumer.clone(), json!({
            "batches": spent.batches,
            "messages_per_batch": round(spent.messages / spent.batches.max(1.0)),
            "ms_per_batch": round(spent.handler_seconds * 1000.0 / spent.batches.max(1.0)),
        }))).collect::<serde_json::Map<_, _>>(),
    })
}

/// What each lane spent per completed scan, and all lanes together, as JSON; lanes that spent
/// nothing left out.
fn cost_json(cost: &BTreeMap<&'static str, LaneCost>, completed: usize) -> serde_json::Value {
    let per_scan = |count: u64| round(count as f64 / completed.max(1) as f64);
    let lane = |cost: &LaneCost| {
        json!({
            "statements": per_scan(cost.statements),
            "commits": per_scan(cost.commits),
            "messages_sent": per_scan(cost.messages_sent),
            "messages_received": per_scan(cost.messages_received),
        })
    };
    let lanes: serde_json::Map<String, serde_json::Value> = cost
        .iter()
        .filter(|(_, cost)| **cost != LaneCost::default())
        .map(|(name, cost)| ((*name).to_owned(), lane(cost)))
        .collect();
    json!({ "lanes": lanes, "total": lane(&total_cost(cost)) })
}

/// The steady scenario as JSON, its throughput also as a ratio to the ceiling.
fn steady_json(steady: &Steady, ceiling: Option<&Ceiling>) -> serde_json::Value {
    json!({
        "offered_per_second": steady.offered_per_second,
        "duration_seconds": steady.duration_seconds,
        "scans": steady.scans,
        "send_seconds": round(steady.send_seconds),
        "completed": steady.completed,
        "failed": steady.failed,
        "refused": steady.rejected,
        "completion_events_repeated": steady.completion_events_repeated,
        "database_completed": steady.database_completed,
        "seconds": round(steady.seconds),
        "achieved_per_second": round(steady.achieved_per_second),
        "ratio_to_ceiling": ratio_to(
            steady.achieved_per_second,
            ceiling.map(|ceiling| ceiling.steps_per_second),
        ),
        "latency_ms": steady.latency_ms.to_json(),
        "time": stages_json(&steady.stages),
    })
}

/// Prints the JSON document after a line `JSON:`, and writes it to `path` when given.
pub fn emit_json(report: &BenchReport, path: Option<&std::path::Path>) -> anyhow::Result<()> {
    let text = serde_json::to_string_pretty(&to_json(report))?;
    if let Some(path) = path {
        std::fs::write(path, format!("{text}\n"))
            .with_context(|| format!("cannot write {}", path.display()))?;
    }
    println!("JSON:");
    println!("{text}");
    Ok(())
}
