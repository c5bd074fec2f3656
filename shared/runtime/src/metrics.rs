//! `GET /metrics`: the process-wide registry of `bus::metrics` (message-path counters,
//! handler latency, refusals, leader status) plus database gauges computed on scrape.
//!
//! The database gauges come from one statement (`store::observability::snapshot`, every
//! part index-served) and are reused for [`DATABASE_REFRESH_AGE_MAX`], so a scrape storm
//! costs PostgreSQL one query per refresh. A failed refresh keeps the previous values and
//! counts in `palisade_metrics_refresh_failures_total`.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use bus::metrics::prometheus_client::encoding::EncodeLabelSet;
use bus::metrics::prometheus_client::metrics::counter::Counter;
use bus::metrics::prometheus_client::metrics::family::Family;
use bus::metrics::prometheus_client::metrics::gauge::Gauge;
use store::PgPool;
use store::observability::Snapshot;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::LeaseSettings;

/// Database gauges are reused for this long.
pub const DATABASE_REFRESH_AGE_MAX: Duration = Duration::from_secs(5);
/// One refresh may take this long before it counts as failed.
pub const DATABASE_REFRESH_TIME_MAX: Duration = Duration::from_secs(2);
/// A worker seen within this long counts in `palisade_workers_live`: two lease TTLs.
pub const WORKER_SEEN_WITHIN: Duration = LeaseSettings::TTL_DEFAULT.saturating_mul(2);
/// The content type of the OpenMetrics text format `prometheus-client` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

type SecondsGauge = Gauge<f64, AtomicU64>;

/// The database gauges, registered once per process in the `bus::metrics` registry.
#[derive(Debug)]
struct DatabaseGauges {
    tasks_due: Family<StateLabels, Gauge>,
    tasks_due_oldest_age_seconds: SecondsGauge,
    attempts_live: Gauge,
    lease_renewal_age_max_seconds: SecondsGauge,
    outbox_unpublished: Gauge,
    outbox_oldest_age_seconds: SecondsGauge,
    last_completed_scan_age_seconds: SecondsGauge,
    workers_live: Gauge,
    enrichment_jobs_pending: Gauge,
    refresh_failures: Counter,
}

static DATABASE_GAUGES: LazyLock<DatabaseGauges> = LazyLock::new(|| {
    let gauges = DatabaseGauges {
        tasks_due: Family::default(),
        tasks_due_oldest_age_seconds: SecondsGauge::default(),
        attempts_live: Gauge::default(),
        lease_renewal_age_max_seconds: SecondsGauge::default(),
        outbox_unpublished: Gauge::default(),
        outbox_oldest_age_seconds: SecondsGauge::default(),
        last_completed_scan_age_seconds: SecondsGauge::default(),
        workers_live: Gauge::default(),
        enrichment_jobs_pending: Gauge::default(),
        refresh_failures: Counter::default(),
    };
    for state in ["pending", "retry_wait"] {
        let _ = gauges.tasks_due.get_or_create(&StateLabels { state });
    }
    let mut registry = bus::metrics::registry();
    registry.register(
        "tasks_due",
        "Tasks due now (available_at passed), by state (pending, retry_wait)",
        gauges.tasks_due.clone(),
    );
    registry.register(
        "tasks_due_oldest_age_seconds",
        "Seconds since the oldest due task became due; 0 when none is due",
        gauges.tasks_due_oldest_age_seconds.clone(),
    );
    registry.register(
        "attempts_live",
        "Task attempts leased or running",
        gauges.attempts_live.clone(),
    );
    registry.register(
        "lease_renewal_age_max_seconds",
        "Seconds since the stalest live lease was renewed (or started); 0 when none is live",
        gauges.lease_renewal_age_max_seconds.clone(),
    );
    registry.register(
        "outbox_unpublished",
        "Outbox rows not yet published",
        gauges.outbox_unpublished.clone(),
    );
    registry.register(
        "outbox_oldest_age_seconds",
        "Seconds since the oldest unpublished outbox row was written; 0 when none",
        gauges.outbox_oldest_age_seconds.clone(),
    );
    registry.register(
        "last_completed_scan_age_seconds",
        "Seconds since the newest completed scan finished; -1 before the first",
        gauges.last_completed_scan_age_seconds.clone(),
    );
    registry.register(
        "workers_live",
        "Workers seen within two lease TTLs",
        gauges.workers_live.clone(),
    );
    registry.register(
        "enrichment_jobs_pending",
        "Enrichment jobs waiting to run",
        gauges.enrichment_jobs_pending.clone(),
    );
    registry.register(
        "metrics_refresh_failures",
        "Database gauge refreshes that failed or timed out (previous values kept)",
        gauges.refresh_failures.clone(),
    );
    gauges
});

impl DatabaseGauges {
    fn set(&self, snapshot: &Snapshot) {
        self.tasks_due
            .get_or_create(&StateLabels { state: "pending" })
            .set(snapshot.tasks_due_pending);
        self.tasks_due
            .get_or_create(&StateLabels {
                state: "retry_wait",
            })
            .set(snapshot.tasks_due_retry_wait);
        self.tasks_due_oldest_age_seconds
            .set(snapshot.oldest_due_task_age_seconds);
        self.attempts_live.set(snapshot.live_attempts);
        self.lease_renewal_age_max_seconds
            .set(snapshot.stalest_lease_age_seconds);
        self.outbox_unpublished.set(snapshot.outbox_unpublished);
        self.outbox_oldest_age_seconds
            .set(snapshot.outbox_oldest_age_seconds);
        self.last_completed_scan_age_seconds
            .set(snapshot.last_completed_scan_age_seconds.unwrap_or(-1.0));
        self.workers_live.set(snapshot.workers_live);
        self.enrichment_jobs_pending
            .set(snapshot.enrichment_pending);
    }
}

/// What `/metrics` reads, and when it last refreshed the database gauges.
#[derive(Debug)]
pub(crate) struct MetricsSource {
    pool: PgPool,
    /// The lock also makes concurrent scrapes wait for one refresh instead of each running
    /// their own.
    refreshed_at: Mutex<Option<Instant>>,
}

impl MetricsSource {
    pub(crate) fn new(pool: PgPool) -> Self {
        Self {
            pool,
            refreshed_at: Mutex::new(None),
        }
    }

    /// The registry as text, after refreshing the database gauges if they are stale.
    pub(crate) async fn render(&self) -> String {
        self.refresh_if_stale().await;
        bus::metrics::encode_text()
    }

    async fn refresh_if_stale(&self) {
        let gauges = &*DATABASE_GAUGES;
        let mut refreshed_at = self.refreshed_at.lock().await;
        if refreshed_at.is_some_and(|at| at.elapsed() < DATABASE_REFRESH_AGE_MAX) {
            return;
        }
        let snapshot = tokio::time::timeout(
            DATABASE_REFRESH_TIME_MAX,
            store::observability::snapshot(&self.pool, WORKER_SEEN_WITHIN),
        )
        .await;
        match snapshot {
            Ok(Ok(snapshot)) => gauges.set(&snapshot),
            Ok(Err(error)) => {
                gauges.refresh_failures.inc();
                tracing::warn!(%error, "metrics database refresh failed; serving previous values");
            }
            Err(_) => {
                gauges.refresh_failures.inc();
                tracing::warn!(
                    time_max_ms = DATABASE_REFRESH_TIME_MAX.as_millis() as u64,
                    "metrics database refresh timed out; serving previous values"
                );
            }
        }
        // A failure also waits a full period, so an outage is not hammered by scrapes.
        *refreshed_at = Some(Instant::now());
    }
}
