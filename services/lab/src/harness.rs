//! What `palisade demo` and `palisade bench` share: the whole system and its workers running
//! in-process against a fresh database and subject prefix, a tally of the scan outcome events
//! a client sees, progress lines while a load runs, a local web application to scan, and the
//! per-lane cost table.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use futures::StreamExt as _;
use runtime::CommonSettings;
use telemetry::cost::LaneCost;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::system::{System, SystemSettings};

/// A running in-process palisade with its own database, subject prefix, organization and
/// workers, and a client to submit scans with. [`Harness::finish`] stops it and drops the
/// database.
pub struct Harness {
    /// A pool on the harness's database (the services' pool).
    pub pool: sqlx::PgPool,
    /// Submits as client id `label`.
    pub client: client::Client,
    /// The services' NATS connection.
    pub bus: bus::Bus,
    pub organization_id: Uuid,
    /// The settings the system runs with (database URL and subject prefix of its own).
    pub common: CommonSettings,
    pub worker_stats: Vec<Arc<worker::WorkerStats>>,
    stop: CancellationToken,
    system_task: JoinHandle<anyhow::Result<()>>,
}

impl Harness {
    /// Creates a database `palisade_{label}_…` and subject prefix `{label}-…` (fresh for every
    /// run), starts the five services and `workers` workers of `capacity` leases each, and an
    /// organization they serve.
    pub async fn start(
        common: CommonSettings,
        label: &str,
        workers: usize,
        capacity: u32,
    ) -> anyhow::Result<Self> {
        let mut common = common;
        let stamp = Uuid::now_v7().simple().to_string();
        let database = format!("palisade_{label}_{}", &stamp[stamp.len() - 12..]);
        anyhow::ensure!(
            common.database.url.contains("://"),
            "DATABASE_URL has no scheme"
        );
        common.database.url = store::with_database(&common.database.url, &database);
        common.subjects =
            messages::Subjects::new(&format!("{label}-{}", &stamp[stamp.len() - 8..]))?;
        println!(
            "{label}: database {database}, subject prefix {}",
            common.subjects.prefix()
        );
        println!("{label}: {}", crate::system::bus_notice(&common));

        let mut settings = SystemSettings::from_common(common.clone())?;
        // A measurement, not a deployment: nothing probes it, and it may run beside `palisade dev`.
        settings.http_addr = None;
        let mut system = System::start(settings).await?;
        let pool = system.connections.pool.clone();
        let organization_id = Uuid::now_v7();
        store::admin::create_organization(&pool, organization_id, label, None).await?;
        let worker_stats = system
            .spawn_workers(organization_id, workers, capacity)
            .await?;
        let bus = system.connections.bus.clone();
        let client = client::Client::new(bus.clone(), label);
        let stop = CancellationToken::new();
        let system_stop = stop.clone();
        let system_task = tokio::spawn(async move { system.run_until(system_stop).await });
        Ok(Self {
            pool,
            client,
            bus,
            organization_id,
            common,
            worker_stats,
            stop,
            system_task,
        })
    }

    /// Stops the system and, unless `keep_database`, drops its database.
    pub async fn finish(self, keep_database: bool) -> anyhow::Result<()> {
        for stats in &self.worker_stats {
            tracing::debug!(stats = ?stats.snapshot(), "worker");
        }
        self.stop.cancel();
        let stopped = self.system_task.await.context("system task panicked");
        self.pool.close().await;
        if !keep_database {
            store::drop_database(&self.common.database.url)
                .await
                .context("failed to drop the run's database")?;
        }
        stopped?
    }
}

/// What the outcome events said so far about the scans this run submitted (events for other
/// idempotency keys are ignored).
pub struct Tally {
    /// When each request was sent, by idempotency key (register before sending).
    pub submitted_at: HashMap<String, Instant>,
    /// Completion events per scan id (more than one is a repeated event).
    pub completed: HashMap<String, u32>,
    pub failed: HashMap<String, u32>,
    pub rejected: usize,
    pub findings: u64,
    /// Request-to-completion-event latencies, in microseconds.
    pub latencies: hdrhistogram::Histogram<u64>,
    /// When the first completion event of each scan arrived, by idempotency key.
    pub completed_seen_at: HashMap<String, DateTime<Utc>>,
    /// When the last scan finished (completed, failed or cancelled).
    pub last_finished: Option<Instant>,
}

impl Tally {
    fn new() -> Self {
        Self {
            submitted_at: HashMap::new(),
            completed: HashMap::new(),
            failed: HashMap::new(),
            rejected: 0,
            findings: 0,
            latencies: hdrhistogram::Histogram::new(3).expect("3 significant digits is valid"),
            completed_seen_at: HashMap::new(),
            last_finished: None,
        }
    }

    fn record(&mut self, outcome: client::Outcome) {
        let key = match &outcome {
            client::Outcome::Completed(event) => &event.idempotency_key,
            client::Outcome::Failed(event) => &event.idempotency_key,
            client::Outcome::Cancelled(event) => &event.idempotency_key,
            client::Outcome::Rejected(event) => &event.idempotency_key,
        };
        if !self.submitted_at.contains_key(key) {
            return;
        }
        match outcome {
            client::Outcome::Completed(event) => {
                let count = self.completed.entry(event.scan_id.clone()).or_default();
                *count += 1;
                if *count == 1 {
                    self.findings += u64::from(event.finding_count);
                    if let Some(at) = self.submitted_at.get(&event.idempotency_key) {
                        let _ = self.latencies.record(at.elapsed().as_micros() as u64);
                    }
                    self.completed_seen_at
                        .insert(event.idempotency_key, Utc::now());
                    self.last_finished = Some(Instant::now());
                }
            }
            client::Outcome::Failed(event) => self.record_failure(event.scan_id),
            client::Outcome::Cancelled(event) => self.record_failure(event.scan_id),
            client::Outcome::Rejected(_) => self.rejected += 1,
        }
    }

    fn record_failure(&mut self, scan_id: String) {
        *self.failed.entry(scan_id).or_default() += 1;
        self.last_finished = Some(Instant::now());
    }

    /// Scans that ended, one way or the other.
    pub fn finished(&self) -> usize {
        self.completed.len() + self.failed.len()
    }

    /// Requests with an answer: scans that ended, and requests refused by an event (only
    /// requests sent with [`client::Client::publish`] are refused that way).
    pub fn answered(&self) -> usize {
        self.finished() + self.rejected
    }

    /// Scans whose completion event arrived more than once.
    pub fn completion_events_repeated(&self) -> usize {
        self.completed.values().filter(|count| **count > 1).count()
    }

    /// The request-to-completion latency at quantile `q`, in milliseconds.
    pub fn latency_ms(&self, q: f64) -> f64 {
        self.latencies.value_at_quantile(q) as f64 / 1_000.0
    }
}

/// The outcome events of one client, read into a [`Tally`] from the moment it is created
/// until it is dropped.
pub struct Outcomes {
    tally: Arc<Mutex<Tally>>,
    /// Signalled after every outcome the reader records.
    recorded: Arc<tokio::sync::Notify>,
    reader: JoinHandle<()>,
}

impl Outcomes {
    /// Starts following the scan outcome events of `organization_id` (from now on).
    pub async fn follow(client: &client::Client, organization_id: &Uuid) -> anyhow::Result<Self> {
        let mut outcomes = Box::pin(
            client
                .outcomes(organization_id)
                .await
                .context("cannot follow scan outcome events")?,
        );
        let tally = Arc::new(Mutex::new(Tally::new()));
        let recorded = Arc::new(tokio::sync::Notify::new());
        let reader = tokio::spawn({
            let tally = tally.clone();
            let recorded = recorded.clone();
            async move {
                while let Some(outcome) = outcomes.next().await {
                    tally.lock().expect("not poisoned").record(outcome);
                    recorded.notify_waiters();
                }
            }
        });
        Ok(Self {
            tally,
            recorded,
            reader,
        })
    }

    /// The tally so far.
    pub fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().expect("not poisoned")
    }

    /// Notes that the request with `key` is being sent now (events only count for such keys).
    pub fn submitting(&self, key: &str) {
        self.tally()
            .submitted_at
            .insert(key.to_owned(), Instant::now());
    }

    /// Waits until `count` of the tally (e.g. [`Tally::finished`]) reaches `expected` or
    /// `timeout` passes; returns whether it did.
    pub async fn wait_for(
        &self,
        count: fn(&Tally) -> usize,
        expected: usize,
        timeout: Duration,
    ) -> bool {
        let reached = async {
            loop {
                // Registered before the check, so an outcome recorded in between still wakes us.
                let recorded = self.recorded.notified();
                if count(&self.tally()) >= expected {
                    return;
                }
                recorded.await;
            }
        };
        tokio::time::timeout(timeout, reached).await.is_ok()
    }

    /// Prints a progress line every second until the returned [`Progress`] is stopped.
    pub fn report_progress(
        &self,
        label: String,
        submitted: Arc<AtomicU64>,
        total_requests: usize,
        started: Instant,
    ) -> Progress {
        let stop = CancellationToken::new();
        let task = tokio::spawn(print_progress(
            label,
            self.tally.clone(),
            submitted,
            total_requests,
            started,
            stop.clone(),
        ));
        Progress { stop, task }
    }
}

impl Drop for Outcomes {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

/// Progress lines being printed; [`Progress::stop`] ends them.
pub struct Progress {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Progress {
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

async fn print_progress(
    label: String,
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
            "{label}: {:>5.1}s  requests sent {}/{}  scans completed {}  failed {}  ({:.0} scans/s)",
            elapsed,
            submitted.load(Ordering::Relaxed),
            total_requests,
            completed,
            failed,
            completed as f64 / elapsed.max(0.001)
        );
    }
}

/// A local web application for the plugins to scan: it answers every path without the
/// usual security headers, so http_headers has something to report. Runs until the token
/// is cancelled.
pub async fn start_local_web_app() -> anyhow::Result<(SocketAddr, CancellationToken)> {
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

/// The sum over every lane.
pub fn total_cost(cost: &BTreeMap<&'static str, LaneCost>) -> LaneCost {
    cost.values()
        .fold(LaneCost::default(), |total, lane| LaneCost {
            statements: total.statements + lane.statements,
            commits: total.commits + lane.commits,
            messages_sent: total.messages_sent + lane.messages_sent,
            messages_received: total.messages_received + lane.messages_received,
        })
}

/// Prints statements, commits and messages per completed scan, by lane and in all (idle
/// polling included: the figure is what the run cost, divided by what it completed). Lanes
/// whose every figure is under 0.05 per scan are summed into the total only.
pub fn print_cost(cost: &BTreeMap<&'static str, LaneCost>, completed: usize, width: usize) {
    if completed == 0 {
        return;
    }
    let per_scan = |count: u64| count as f64 / completed as f64;
    let row = |name: &str, cost: &LaneCost| {
        println!(
            "  {name:<20} {:>10.1} {:>8.1} {:>10.1} {:>10.1}",
            per_scan(cost.statements),
            per_scan(cost.commits),
            per_scan(cost.messages_sent),
            per_scan(cost.messages_received)
        );
    };
    println!(
        "{:<22} {:>10} {:>8} {:>10} {:>10}",
        "cost per completed scan", "statements", "commits", "msgs sent", "msgs recv"
    );
    for (lane, lane_cost) in cost {
        let figures = [
            lane_cost.statements,
            lane_cost.commits,
            lane_cost.messages_sent,
            lane_cost.messages_received,
        ];
        if figures.into_iter().any(|count| per_scan(count) >= 0.05) {
            row(lane, lane_cost);
        }
    }
    row("all lanes", &total_cost(cost));
    println!("{}", "-".repeat(width));
}
