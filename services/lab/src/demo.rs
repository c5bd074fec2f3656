//! `palisade demo`: everything in one process against a fresh database, a realistic load of
//! scans (with replayed and conflicting requests) through a three-plugin profile, progress
//! while it runs, and a table at the end.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use messages::{ErrorCode, v1};
use runtime::CommonSettings;
use telemetry::cost::LaneCost;
use uuid::Uuid;

use crate::harness::{Harness, Outcomes, Tally, print_cost, start_local_web_app};

/// The profile every demo scan runs: discovery, then a check of what was discovered, then a
/// synthetic plugin standing in for a slower scanner.
pub const DEMO_PROFILE: [&str; 3] = ["tcp_connect", "http_headers", "synthetic"];

/// How the demo runs.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub scans: usize,
    pub workers: usize,
    pub worker_capacity: u32,
    /// Share of scans whose request is sent again unchanged (must return the same scan).
    pub duplicate_percent: usize,
    /// Share of scans whose key is reused with another payload (must be refused).
    pub conflict_percent: usize,
    /// Requests in flight at once.
    pub concurrency: usize,
    /// Give up waiting for completions after this long.
    pub timeout: Duration,
    pub keep_database: bool,
}

// `palisade demo`'s arguments (its help is the `Demo` command's, in the `palisade` command).
#[derive(Debug, clap::Args)]
pub struct DemoArgs {
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
}

impl From<DemoArgs> for DemoOptions {
    fn from(args: DemoArgs) -> Self {
        Self {
            scans: args.scans,
            workers: args.workers,
            worker_capacity: args.capacity,
            duplicate_percent: args.duplicate_percent,
            conflict_percent: args.conflict_percent,
            concurrency: args.concurrency,
            timeout: Duration::from_secs(args.timeout_secs),
            keep_database: args.keep_database,
        }
    }
}

/// `palisade demo`: runs the demo, prints its table, and fails unless every check held.
pub async fn command(mut common: CommonSettings, args: DemoArgs) -> anyhow::Result<()> {
    let _nats = crate::private_nats::ensure(&mut common).await?;
    let report = run(common, args.into()).await?;
    if print_report(&report) {
        Ok(())
    } else {
        anyhow::bail!("the demo's checks did not all hold (see the table above)")
    }
}

/// What the demo measured.
#[derive(Debug, Clone, Default)]
pub struct DemoReport {
    pub requests: usize,
    pub admitted: usize,
    pub deduplicated: usize,
    pub deduplicated_to_other_scan: usize,
    pub conflicts: usize,
    pub other_refusals: usize,
    pub completed: usize,
    pub failed: usize,
    pub completion_events_repeated: usize,
    pub findings: u64,
    pub p50_ms: u64,
    pub p99_ms: u64,
    pub elapsed: Duration,
    pub scans_per_second: f64,
    pub database_completed: i64,
    pub database_scans: i64,
    /// What each lane spent from the first request to the last completion (every service and
    /// the workers run in this process, so the counters see all of it).
    pub cost: BTreeMap<&'static str, LaneCost>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RequestKind {
    Original,
    Duplicate,
    Conflict,
}

/// Runs the demo against the database and NATS in `common`, in a fresh database and subject
/// prefix of its own.
pub async fn run(common: CommonSettings, options: DemoOptions) -> anyhow::Result<DemoReport> {
    let harness = Harness::start(common, "demo", options.workers, options.worker_capacity).await?;
    let (http_address, http_stop) = start_local_web_app().await?;
    let report = load(&harness, http_address, &options).await;
    http_stop.cancel();
    harness.finish(options.keep_database).await?;
    report
}

/// A request the demo sent and what it was answered.
type Answer = (
    RequestKind,
    v1::ScanRequest,
    Result<v1::ScanRequestReply, client::ClientError>,
);

/// Sends the demo's requests and waits for their scans.
async fn load(
    harness: &Harness,
    http_address: SocketAddr,
    options: &DemoOptions,
) -> anyhow::Result<DemoReport> {
    let client = &harness.client;
    let outcomes = Outcomes::follow(client, &harness.organization_id).await?;
    let requests = demo_requests(client, harness.organization_id, http_address, options);
    let total_requests = requests.len();

    let cost_before = telemetry::cost::snapshot();
    let started = Instant::now();
    let submitted = Arc::new(AtomicU64::new(0));
    let progress =
        outcomes.report_progress("demo".into(), submitted.clone(), total_requests, started);
    let answers = submit(client, &outcomes, requests, &submitted, options.concurrency).await;
    let mut report = DemoReport {
        requests: total_requests,
        ..Default::default()
    };
    count_answers(&answers, &mut report)?;

    outcomes
        .wait_for(Tally::finished, report.admitted, options.timeout)
        .await;
    report.elapsed = started.elapsed();
    report.cost = telemetry::cost::spent(&cost_before, &telemetry::cost::snapshot());
    progress.stop().await;

    {
        let tally = outcomes.tally();
        report.completed = tally.completed.len();
        report.failed = tally.failed.len();
        report.completion_events_repeated = tally.completion_events_repeated();
        report.findings = tally.findings;
        report.p50_ms = tally.latency_ms(0.50) as u64;
        report.p99_ms = tally.latency_ms(0.99) as u64;
    }
    report.scans_per_second = report.completed as f64 / report.elapsed.as_secs_f64().max(0.001);
    let (database_scans, database_completed): (i64, i64) =
        store::admin::scan_counts(&harness.pool).await?;
    report.database_scans = database_scans;
    report.database_completed = database_completed;
    Ok(report)
}

/// Submits every request over request/reply, `concurrency` at a time, counting each sent in
/// `submitted`; originals are noted in `outcomes` first, so their events count.
async fn submit(
    client: &client::Client,
    outcomes: &Outcomes,
    requests: Vec<(RequestKind, v1::ScanRequest)>,
    submitted: &AtomicU64,
    concurrency: usize,
) -> Vec<Answer> {
    futures::stream::iter(requests)
        .map(|(kind, request)| async move {
            if kind == RequestKind::Original {
                outcomes.submitting(&request.idempotency_key);
            }
            let reply = client.submit(&request).await;
            submitted.fetch_add(1, Ordering::Relaxed);
            (kind, request, reply)
        })
        .buffer_unordered(concurrency)
        .collect()
        .await
}

/// Counts the answers into `report`: admitted, deduplicated (and whether each replay got its
/// original's scan), conflicts and other refusals. A submission that failed fails the demo.
fn count_answers(answers: &[Answer], report: &mut DemoReport) -> anyhow::Result<()> {
    let mut scan_by_key: HashMap<String, String> = HashMap::new();
    let mut replays: Vec<(String, String)> = Vec::new();
    for (_kind, request, reply) in answers {
        let reply = reply
            .as_ref()
            .map_err(|error| anyhow::anyhow!("submission failed: {error}"))?;
        match reply.error.as_ref().and_then(v1::Error::error_code) {
            None if reply.deduplicated => {
                report.deduplicated += 1;
                replays.push((request.idempotency_key.clone(), reply.scan_id.clone()));
            }
            None => {
                report.admitted += 1;
                scan_by_key.insert(request.idempotency_key.clone(), reply.scan_id.clone());
            }
            Some(ErrorCode::IdempotencyConflict) => report.conflicts += 1,
            Some(_) => report.other_refusals += 1,
        }
    }
    report.deduplicated_to_other_scan = replays
        .iter()
        .filter(|(key, scan_id)| scan_by_key.get(key) != Some(scan_id))
        .count();
    Ok(())
}

/// Originals, replays and conflicting reuses, interleaved the way real clients send them.
fn demo_requests(
    client: &client::Client,
    organization_id: Uuid,
    http_address: SocketAddr,
    options: &DemoOptions,
) -> Vec<(RequestKind, v1::ScanRequest)> {
    let mut requests = Vec::new();
    for index in 0..options.scans {
        let target = format!("http://{http_address}/app/{index}");
        let key = format!("demo-scan-{index}");
        let original = client.request(&organization_id.to_string(), &target, &DEMO_PROFILE, &key);
        requests.push((RequestKind::Original, original.clone()));
        if options.duplicate_percent > 0 && index % (100 / options.duplicate_percent.min(100)) == 0
        {
            requests.push((RequestKind::Duplicate, original.clone()));
        }
        if options.conflict_percent > 0 && index % (100 / options.conflict_percent.min(100)) == 1 {
            let mut conflicting = original;
            conflicting.priority += 1;
            requests.push((RequestKind::Conflict, conflicting));
        }
    }
    requests
}

/// Prints the report as a table; returns whether every check held.
pub fn print_report(report: &DemoReport) -> bool {
    let rows = [
        ("requests sent", report.requests.to_string()),
        ("admitted", report.admitted.to_string()),
        (
            "deduplicated (original scan returned)",
            report.deduplicated.to_string(),
        ),
        (
            "conflicts (idempotency_conflict)",
            report.conflicts.to_string(),
        ),
        ("other refusals", report.other_refusals.to_string()),
        ("completed", report.completed.to_string()),
        ("failed", report.failed.to_string()),
        ("findings", report.findings.to_string()),
        ("p50 request-to-completion", format!("{} ms", report.p50_ms)),
        ("p99 request-to-completion", format!("{} ms", report.p99_ms)),
        ("elapsed", format!("{:.1} s", report.elapsed.as_secs_f64())),
        (
            "throughput",
            format!("{:.1} scans/s", report.scans_per_second),
        ),
    ];
    println!();
    println!("{:<40} {:>14}", "palisade demo", "");
    println!("{}", "-".repeat(55));
    for (name, value) in rows {
        println!("{name:<40} {value:>14}");
    }
    println!("{}", "-".repeat(55));
    print_cost(&report.cost, report.completed, 64);
    let checks = [
        (
            "every admitted scan completed exactly once",
            report.completed == report.admitted
                && report.failed == 0
                && report.completion_events_repeated == 0
                && report.database_completed == report.admitted as i64
                && report.database_scans == report.admitted as i64,
        ),
        (
            "every replay returned its original scan",
            report.deduplicated_to_other_scan == 0,
        ),
        (
            "every conflicting reuse was refused",
            report.other_refusals == 0,
        ),
    ];
    let mut all = true;
    for (name, held) in checks {
        println!("{:<46} {}", name, if held { "yes" } else { "NO" });
        all &= held;
    }
    all
}
