//! `palisade demo`: everything in one process against a fresh database, a realistic load of
//! scans (with replayed and conflicting requests) through a three-plugin profile, progress
//! while it runs, and a table at the end.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures::StreamExt as _;
use messages::{ErrorCode, v1};
use runtime::CommonSettings;
use telemetry::cost::LaneCost;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::system::{System, SystemSettings};

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
    let mut common = common;
    let stamp = Uuid::now_v7().simple().to_string();
    let database = format!("palisade_demo_{}", &stamp[stamp.len() - 12..]);
    anyhow::ensure!(
        common.database.url.contains("://"),
        "DATABASE_URL has no scheme"
    );
    common.database.url = store::with_database(&common.database.url, &database);
    common.subjects = messages::Subjects::new(&format!("demo-{}", &stamp[stamp.len() - 8..]))?;
    println!(
        "demo: database {database}, subject prefix {}",
        common.subjects.prefix()
    );

    let mut settings = SystemSettings::from_common(common.clone())?;
    // A measurement, not a deployment: nothing probes it, and it may run beside `palisade dev`.
    settings.http_addr = None;
    let mut system = System::start(settings).await?;
    let pool = system.connections.pool.clone();

    let (http_address, http_stop) = start_demo_http_server().await?;
    let organization_id = Uuid::now_v7();
    store::admin::create_organization(&pool, organization_id, "demo", None).await?;
    let worker_stats = system
        .spawn_workers(organization_id, options.workers, options.worker_capacity)
        .await?;

    let client = client::Client::new(system.connections.bus.clone(), "demo");
    let mut outcomes = Box::pin(client.outcomes().await?);

    let stop = CancellationToken::new();
    let system_stop = stop.clone();
    let system_task = tokio::spawn(async move { system.run_until(system_stop).await });

    let requests = demo_requests(&client, organization_id, http_address, &options);
    let total_requests = requests.len();
    let tally: Arc<Mutex<Tally>> = Arc::new(Mutex::new(Tally::new()));
    let reader = tokio::spawn({
        let tally = tally.clone();
        async move {
            while let Some(outcome) = outcomes.next().await {
                tally.lock().expect("not poisoned").record(outcome);
            }
        }
    });

    let cost_before = telemetry::cost::snapshot();
    let started = Instant::now();
    let submitted = Arc::new(AtomicU64::new(0));
    let progress_stop = CancellationToken::new();
    let progress = tokio::spawn(report_progress(
        tally.clone(),
        submitted.clone(),
        total_requests,
        started,
        progress_stop.clone(),
    ));

    let answers: Vec<(
        RequestKind,
        v1::ScanRequest,
        Result<v1::ScanRequestReply, client::ClientError>,
    )> = futures::stream::iter(requests)
        .map(|(kind, request)| {
            let client = client.clone();
            let tally = tally.clone();
            let submitted = submitted.clone();
            async move {
                if kind == RequestKind::Original {
                    tally
                        .lock()
                        .expect("not poisoned")
                        .submitted_at
                        .insert(request.idempotency_key.clone(), Instant::now());
                }
                let reply = client.submit(&request).await;
                submitted.fetch_add(1, Ordering::Relaxed);
                (kind, request, reply)
            }
        })
        .buffer_unordered(options.concurrency)
        .collect()
        .await;

    let mut report = DemoReport {
        requests: total_requests,
        ..Default::default()
    };
    let mut scan_by_key: HashMap<String, String> = HashMap::new();
    let mut replays: Vec<(String, String)> = Vec::new();
    for (_kind, request, reply) in &answers {
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

    let deadline = Instant::now() + options.timeout;
    loop {
        let finished = tally.lock().expect("not poisoned").finished();
        if finished >= report.admitted || Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    report.elapsed = started.elapsed();
    report.cost = telemetry::cost::spent(&cost_before, &telemetry::cost::snapshot());
    progress_stop.cancel();
    let _ = progress.await;
    reader.abort();

    {
        let tally = tally.lock().expect("not poisoned");
        report.completed = tally.completed.len();
        report.failed = tally.failed.len();
        report.completion_events_repeated =
            tally.completed.values().filter(|count| **count > 1).count();
        report.findings = tally.findings;
        report.p50_ms = tally.latencies.value_at_quantile(0.50);
        report.p99_ms = tally.latencies.value_at_quantile(0.99);
    }
    report.scans_per_second = report.completed as f64 / report.elapsed.as_secs_f64().max(0.001);
    let (database_scans, database_completed): (i64, i64) = store::admin::scan_counts(&pool).await?;
    report.database_scans = database_scans;
    report.database_completed = database_completed;

    for stats in &worker_stats {
        tracing::debug!(stats = ?stats.snapshot(), "worker");
    }
    stop.cancel();
    http_stop.cancel();
    system_task.await.context("system task panicked")??;
    pool.close().await;
    if !options.keep_database {
        store::drop_database(&common.database.url).await?;
    }
    Ok(report)
}

/// What the outcome stream said so far.
struct Tally {
    submitted_at: HashMap<String, Instant>,
    completed: HashMap<String, u32>,
    failed: HashMap<String, u32>,
    findings: u64,
    latencies: hdrhistogram::Histogram<u64>,
}

impl Tally {
    fn new() -> Self {
        Self {
            submitted_at: HashMap::new(),
            completed: HashMap::new(),
            failed: HashMap::new(),
            findings: 0,
            latencies: hdrhistogram::Histogram::new(3).expect("3 significant digits is valid"),
        }
    }

    fn record(&mut self, outcome: client::Outcome) {
        match outcome {
            client::Outcome::Completed(event) => {
                let count = self.completed.entry(event.scan_id.clone()).or_default();
                *count += 1;
                if *count == 1 {
                    self.findings += u64::from(event.finding_count);
                    if let Some(at) = self.submitted_at.get(&event.idempotency_key) {
                        let _ = self.latencies.record(at.elapsed().as_millis() as u64);
                    }
                }
            }
            client::Outcome::Failed(event) => *self.failed.entry(event.scan_id).or_default() += 1,
            client::Outcome::Cancelled(event) => {
                *self.failed.entry(event.scan_id).or_default() += 1
            }
            client::Outcome::Rejected(_) => {}
        }
    }

    fn finished(&self) -> usize {
        self.completed.len() + self.failed.len()
    }
}

async fn report_progress(
    tally: Arc<Mutex<Tally>>,
    submitted: Arc<AtomicU64>,
    total_requests: usize,
    started: Instant,
    stop: CancellationToken,
) {
    let mut ticker = tokio::time::interval(Duration::from_secs(1));
    ticker.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticker.tick() => {}
        }
        let (completed, failed) = {
            let tally = tally.lock().expect("not poisoned");
            (tally.completed.len(), tally.failed.len())
        };
        let elapsed = started.elapsed().as_secs_f64();
        println!(
            "demo: {:>5.1}s  requests sent {}/{}  scans completed {}  failed {}  ({:.0} scans/s)",
            elapsed,
            submitted.load(Ordering::Relaxed),
            total_requests,
            completed,
            failed,
            completed as f64 / elapsed.max(0.001)
        );
    }
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

/// A local web application for the plugins to scan: it answers every path without the
/// usual security headers, so http_headers has something to report.
async fn start_demo_http_server() -> anyhow::Result<(SocketAddr, CancellationToken)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let address = listener.local_addr()?;
    let app = axum::Router::new().fallback(|| async {
        (
            [
                ("server", "demo-app/1.0"),
                ("x-content-type-options", "nosniff"),
            ],
            "hello from the demo app\n",
        )
    });
    let stop = CancellationToken::new();
    let shutdown = stop.clone();
    tokio::spawn(async move {
        let _ = axum::serve(listener, app)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
    });
    Ok((address, stop))
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
    print_cost(report);
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

/// Statements and messages per completed scan, by lane (idle polling included: the figure
/// is what the run cost, divided by what it completed).
fn print_cost(report: &DemoReport) {
    if report.completed == 0 {
        return;
    }
    let per_scan = |count: u64| count as f64 / report.completed as f64;
    println!(
        "{:<22} {:>10} {:>10} {:>10}",
        "cost per completed scan", "statements", "msgs sent", "msgs recv"
    );
    let mut total = LaneCost::default();
    for (lane, cost) in &report.cost {
        if *cost == LaneCost::default() {
            continue;
        }
        println!(
            "  {lane:<20} {:>10.1} {:>10.1} {:>10.1}",
            per_scan(cost.statements),
            per_scan(cost.messages_sent),
            per_scan(cost.messages_received)
        );
        total.statements += cost.statements;
        total.messages_sent += cost.messages_sent;
        total.messages_received += cost.messages_received;
    }
    println!(
        "  {:<20} {:>10.1} {:>10.1} {:>10.1}",
        "all lanes",
        per_scan(total.statements),
        per_scan(total.messages_sent),
        per_scan(total.messages_received)
    );
    println!("{}", "-".repeat(55));
}
