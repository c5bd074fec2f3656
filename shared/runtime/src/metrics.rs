//! `GET /metrics`: the process-wide registry of `telemetry::metrics` (message-path counters,
//! handler latency, refusals, leader status) plus database gauges computed on scrape.
//!
//! The database gauges come from two statements run together (`store::observability::snapshot`,
//! every part index-served, and `backlog`, the unfinished tasks by organization, plugin and
//! state, of which the largest [`BACKLOG_GROUPS_MAX`] groups are named) and are reused for
//! [`MetricsSettings::refresh_age_max`] ([`DATABASE_REFRESH_AGE_MAX`] by default), so a scrape
//! storm costs PostgreSQL two queries per refresh. A failed refresh keeps the previous values and counts in
//! `palisade_metrics_refresh_failures_total`.
//!
//! Two counters mirror counter sequences in the database (`palisade_task_retries_total`,
//! `palisade_tasks_failed_terminal_total`): like the gauges they are global, the same in
//! every process, and never decrease.

use std::sync::LazyLock;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use store::PgPool;
use store::observability::Snapshot;
use telemetry::metrics::prometheus_client::encoding::EncodeLabelSet;
use telemetry::metrics::prometheus_client::metrics::counter::Counter;
use telemetry::metrics::prometheus_client::metrics::family::Family;
use telemetry::metrics::prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::{LeaseSettings, SettingsError};

/// Database gauges are reused for this long unless [`MetricsSettings`] says otherwise.
pub const DATABASE_REFRESH_AGE_MAX: Duration = Duration::from_secs(5);
/// One refresh may take this long before it counts as failed.
pub const DATABASE_REFRESH_TIME_MAX: Duration = Duration::from_secs(2);
/// A worker seen (hello or acquire) within this many lease TTLs counts in
/// `palisade_workers_live`: an idle worker polls far more often, and a dead one drops out
/// soon after its leases expire.
pub const WORKER_SEEN_WITHIN_LEASE_TTLS: u32 = 2;
/// The (organization, plugin) groups with the most unfinished tasks that
/// `palisade_backlog_tasks` names; the others are summed under `other`, so the series stay
/// bounded whatever the tenants and plugin names.
pub const BACKLOG_GROUPS_MAX: usize = 20;
/// The label value of the groups past [`BACKLOG_GROUPS_MAX`].
pub const BACKLOG_OTHER: &str = "other";
/// The content type of the OpenMetrics text format `prometheus-client` writes.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// How `/metrics` computes the database gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetricsSettings {
    /// How recently a worker must have been seen to count in `palisade_workers_live`:
    /// [`WORKER_SEEN_WITHIN_LEASE_TTLS`] lease TTLs.
    pub worker_seen_within: Duration,
    /// How long one refresh of the database gauges is reused ([`DATABASE_REFRESH_AGE_MAX`];
    /// tests shorten it).
    pub refresh_age_max: Duration,
}

impl MetricsSettings {
    /// The live-worker window from `PALISADE_LEASE_TTL_MS`, the TTL dispatch grants leases
    /// with (every process reads it, so every process reports the same gauge).
    pub fn from_env() -> Result<Self, SettingsError> {
        Ok(Self::for_lease_ttl(LeaseSettings::ttl_from_env()?))
    }

    /// The settings for leases granted with `lease_ttl`.
    pub fn for_lease_ttl(lease_ttl: Duration) -> Self {
        Self {
            worker_seen_within: lease_ttl.saturating_mul(WORKER_SEEN_WITHIN_LEASE_TTLS),
            refresh_age_max: DATABASE_REFRESH_AGE_MAX,
        }
    }
}

impl Default for MetricsSettings {
    fn default() -> Self {
        Self::for_lease_ttl(LeaseSettings::TTL_DEFAULT)
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    state: &'static str,
}

/// One series of `palisade_backlog_tasks`.
#[derive(Debug, Clone, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub struct BacklogLabels {
    /// An organization id, or [`BACKLOG_OTHER`].
    pub organization: String,
    /// A plugin name, or [`BACKLOG_OTHER`].
    pub plugin: String,
    pub state: &'static str,
}

/// The series of `palisade_backlog_tasks` for `backlog` (`store::observability::backlog`): the
/// [`BACKLOG_GROUPS_MAX`] (organization, plugin) groups with the most unfinished tasks, by
/// state, and the rest summed under `other`.
pub fn backlog_series(backlog: &[store::observability::Backlog]) -> Vec<(BacklogLabels, i64)> {
    use std::collections::BTreeMap;
    let mut totals: BTreeMap<(String, &str), i64> = BTreeMap::new();
    for row in backlog {
        *totals
            .entry((row.organization_id.to_string(), row.plugin.as_str()))
            .or_default() += row.tasks;
    }
    let mut ranked: Vec<((String, &str), i64)> = totals.into_iter().collect();
    ranked.sort_by(|(a_key, a), (b_key, b)| b.cmp(a).then_with(|| a_key.cmp(b_key)));
    let named: std::collections::BTreeSet<(String, &str)> = ranked
        .into_iter()
        .take(BACKLOG_GROUPS_MAX)
        .map(|(key, _)| key)
        .collect();
    let mut series: BTreeMap<BacklogLabels, i64> = BTreeMap::new();
    for row in backlog {
        let Some(state) = store::states::TaskState::parse(&row.state) else {
            continue;
        };
        let key = (row.organization_id.to_string(), row.plugin.as_str());
        let labels = if named.contains(&key) {
            BacklogLabels {
                organization: key.0,
                plugin: row.plugin.clone(),
                state: state.as_str(),
            }
        } else {
            BacklogLabels {
                organization: BACKLOG_OTHER.to_owned(),
                plugin: BACKLOG_OTHER.to_owned(),
                state: state.as_str(),
            }
        };
        *series.entry(labels).or_default() += row.tasks;
    }
    series.into_iter().collect()
}

type SecondsGauge = Gauge<f64, AtomicU64>;

/// The database gauges, registered once per process in the `telemetry::metrics` registry.
#[derive(Debug)]
struct DatabaseGauges {
    tasks_due: Family<StateLabels, Gauge>,
    tasks_retry_wait: Gauge,
    tasks_due_oldest_age_seconds: SecondsGauge,
    attempts_live: Gauge,
    lease_renewal_age_max_seconds: SecondsGauge,
    outbox_unpublished: Gauge,
    outbox_oldest_age_seconds: SecondsGauge,
    last_completed_scan_age_seconds: SecondsGauge,
    workers_live: Gauge,
    enrichment_jobs_pending: Gauge,
    enrichment_jobs_due_oldest_age_seconds: SecondsGauge,
    enrichment_jobs_running: Gauge,
    enrichment_renewal_age_max_seconds: SecondsGauge,
    task_retries: Counter,
    tasks_failed_terminal: Counter,
    schedules_active: Gauge,
    backlog_tasks: Family<BacklogLabels, Gauge>,
    schedule_next_fire_timestamp_seconds: SecondsGauge,
    refresh_failures: Counter,
}

static DATABASE_GAUGES: LazyLock<DatabaseGauges> = LazyLock::new(|| {
    let gauges = DatabaseGauges {
        tasks_due: Family::default(),
        tasks_retry_wait: Gauge::default(),
        tasks_due_oldest_age_seconds: SecondsGauge::default(),
        attempts_live: Gauge::default(),
        lease_renewal_age_max_seconds: SecondsGauge::default(),
        outbox_unpublished: Gauge::default(),
        outbox_oldest_age_seconds: SecondsGauge::default(),
        last_completed_scan_age_seconds: SecondsGauge::default(),
        workers_live: Gauge::default(),
        enrichment_jobs_pending: Gauge::default(),
        enrichment_jobs_due_oldest_age_seconds: SecondsGauge::default(),
        enrichment_jobs_running: Gauge::default(),
        enrichment_renewal_age_max_seconds: SecondsGauge::default(),
        task_retries: Counter::default(),
        tasks_failed_terminal: Counter::default(),
        schedules_active: Gauge::default(),
        backlog_tasks: Family::default(),
        schedule_next_fire_timestamp_seconds: SecondsGauge::default(),
        refresh_failures: Counter::default(),
    };
    for state in ["pending", "retry_wait"] {
        let _ = gauges.tasks_due.get_or_create(&StateLabels { state });
    }
    let mut registry = telemetry::metrics::registry();
    registry.register(
        "tasks_due",
        "Tasks due now (available_at passed), by state (pending, retry_wait)",
        gauges.tasks_due.clone(),
    );
    registry.register(
        "tasks_retry_wait",
        "Tasks in retry_wait, due or still backing off after a failed or expired attempt",
        gauges.tasks_retry_wait.clone(),
    );
    registry.register(
        "task_retries",
        "Times a task went to retry_wait after a failed or expired attempt (from the database; never decreases, may over-count after an aborted transaction)",
        gauges.task_retries.clone(),
    );
    registry.register(
        "tasks_failed_terminal",
        "Tasks that failed terminally: attempts spent, not retryable, or past their execution deadline (from the database; never decreases, may over-count after an aborted transaction)",
        gauges.tasks_failed_terminal.clone(),
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
        "Workers seen (hello or acquire) within two lease TTLs",
        gauges.workers_live.clone(),
    );
    registry.register(
        "enrichment_jobs_pending",
        "Enrichment jobs waiting to run",
        gauges.enrichment_jobs_pending.clone(),
    );
    registry.register(
        "enrichment_jobs_due_oldest_age_seconds",
        "Seconds since the oldest due enrichment job became due; 0 when none is due",
        gauges.enrichment_jobs_due_oldest_age_seconds.clone(),
    );
    registry.register(
        "enrichment_jobs_running",
        "Enrichment jobs running under a claim",
        gauges.enrichment_jobs_running.clone(),
    );
    registry.register(
        "enrichment_renewal_age_max_seconds",
        "Seconds since the stalest running enrichment job was renewed or checkpointed; 0 when none runs",
        gauges.enrichment_renewal_age_max_seconds.clone(),
    );
    registry.register(
        "backlog_tasks",
        "Unfinished tasks (pending, retry_wait, leased, running) of the 20 (organization, plugin) \
         groups with the most, by state; the rest summed under organization and plugin \"other\"",
        gauges.backlog_tasks.clone(),
    );
    registry.register(
        "schedules_active",
        "Recurring scan schedules not paused",
        gauges.schedules_active.clone(),
    );
    registry.register(
        "schedule_next_fire_timestamp_seconds",
        "When the soonest active schedule fires next (Unix seconds); 0 when none is active. \
         Far behind time(): the reaper's leader is not firing",
        gauges.schedule_next_fire_timestamp_seconds.clone(),
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
        self.tasks_retry_wait.set(snapshot.tasks_retry_wait);
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
        self.enrichment_jobs_due_oldest_age_seconds
            .set(snapshot.enrichment_oldest_due_age_seconds);
        self.enrichment_jobs_running
            .set(snapshot.enrichment_running);
        self.enrichment_renewal_age_max_seconds
            .set(snapshot.enrichment_stalest_heartbeat_age_seconds);
        mirror(&self.task_retries, snapshot.task_retries);
        mirror(&self.tasks_failed_terminal, snapshot.tasks_failed_terminal);
        self.schedules_active.set(snapshot.schedules_active);
        self.schedule_next_fire_timestamp_seconds
            .set(snapshot.schedule_next_fire_timestamp_seconds.unwrap_or(0.0));
    }
}

/// Raises `counter` to the database's `total`. A lower reading (a database restored from an
/// older backup) is ignored, so the exported counter never decreases.
fn mirror(counter: &Counter, total: i64) {
    let total = u64::try_from(total).unwrap_or(0);
    let exported = counter.get();
    if total > exported {
        counter.inc_by(total - exported);
    }
}

/// What `/metrics` reads, and when it last refreshed the database gauges.
#[derive(Debug)]
pub(crate) struct MetricsSource {
    pool: PgPool,
    /// For the stream gauges (`Bus::record_stream_usage`), refreshed with the database's.
    bus: bus::Bus,
    settings: MetricsSettings,
    /// The lock also makes concurrent scrapes wait for one refresh instead of each running
    /// their own.
    refreshed_at: Mutex<Option<Instant>>,
}

impl MetricsSource {
    pub(crate) fn new(pool: PgPool, bus: bus::Bus, settings: MetricsSettings) -> Self {
        Self {
            pool,
            bus,
            settings,
            refreshed_at: Mutex::new(None),
        }
    }

    /// The registry as text, after refreshing the database gauges if they are stale.
    pub(crate) async fn render(&self) -> String {
        self.refresh_if_stale().await;
        // The message path's families are registered on first use; make sure they are there
        // before a scrape that comes before any message.
        let _ = bus::metrics::bus_metrics();
        telemetry::metrics::encode_text()
    }

    async fn refresh_if_stale(&self) {
        let gauges = &*DATABASE_GAUGES;
        let mut refreshed_at = self.refreshed_at.lock().await;
        if refreshed_at.is_some_and(|at| at.elapsed() < self.settings.refresh_age_max) {
            return;
        }
        let (snapshot, backlog, streams) = tokio::join!(
            tokio::time::timeout(
                DATABASE_REFRESH_TIME_MAX,
                store::observability::snapshot(&self.pool, self.settings.worker_seen_within),
            ),
            tokio::time::timeout(
                DATABASE_REFRESH_TIME_MAX,
                store::observability::backlog(&self.pool),
            ),
            tokio::time::timeout(DATABASE_REFRESH_TIME_MAX, self.bus.record_stream_usage())
        );
        match streams {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(error = %telemetry::chain(&error), "metrics stream refresh failed; serving previous values")
            }
            Err(_) => tracing::warn!("metrics stream refresh timed out; serving previous values"),
        }
        match backlog {
            Ok(Ok(backlog)) => {
                // Groups that left the top are dropped, not left at their last value.
                gauges.backlog_tasks.clear();
                for (labels, tasks) in backlog_series(&backlog) {
                    gauges.backlog_tasks.get_or_create(&labels).set(tasks);
                }
            }
            Ok(Err(error)) => {
                gauges.refresh_failures.inc();
                tracing::warn!(%error, "metrics backlog refresh failed; serving previous values");
            }
            Err(_) => {
                gauges.refresh_failures.inc();
                tracing::warn!("metrics backlog refresh timed out; serving previous values");
            }
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backlog_names_the_largest_groups_and_sums_the_rest_under_other() {
        let row = |organization: u128, plugin: &str, state: &str, tasks: i64| {
            store::observability::Backlog {
                organization_id: uuid::Uuid::from_u128(organization),
                plugin: plugin.to_owned(),
                state: state.to_owned(),
                tasks,
                due: 0,
                oldest_due_age_seconds: 0.0,
            }
        };
        // One large group and many small ones: the large is named, past the limit summed.
        let mut backlog = vec![row(1, "sbom", "pending", 500), row(1, "sbom", "running", 7)];
        for organization in 0..(BACKLOG_GROUPS_MAX as u128 + 5) {
            backlog.push(row(100 + organization, "tcp_connect", "pending", 2));
        }
        let series = backlog_series(&backlog);
        let named: std::collections::BTreeSet<&str> = series
            .iter()
            .map(|(labels, _)| labels.organization.as_str())
            .collect();
        assert_eq!(
            named.len(),
            BACKLOG_GROUPS_MAX + 1,
            "the top groups and other"
        );
        let large = uuid::Uuid::from_u128(1).to_string();
        let of = |organization: &str, state: &str| {
            series
                .iter()
                .find(|(labels, _)| labels.organization == organization && labels.state == state)
                .map(|(_, tasks)| *tasks)
        };
        assert_eq!(of(&large, "pending"), Some(500));
        assert_eq!(of(&large, "running"), Some(7));
        assert_eq!(
            of(BACKLOG_OTHER, "pending"),
            Some(2 * 6),
            "six small groups past the top"
        );
        let total: i64 = series.iter().map(|(_, tasks)| tasks).sum();
        assert_eq!(
            total,
            507 + 2 * (BACKLOG_GROUPS_MAX as i64 + 5),
            "nothing lost"
        );
    }

    #[test]
    fn the_live_worker_window_is_two_configured_lease_ttls() {
        let settings = MetricsSettings::for_lease_ttl(Duration::from_secs(2));
        assert_eq!(settings.worker_seen_within, Duration::from_secs(4));
        assert_eq!(settings.refresh_age_max, DATABASE_REFRESH_AGE_MAX);
        assert_eq!(
            MetricsSettings::default().worker_seen_within,
            Duration::from_secs(60)
        );
    }

    #[test]
    fn a_mirrored_counter_follows_the_database_and_never_decreases() {
        let counter = Counter::default();
        mirror(&counter, 0);
        assert_eq!(counter.get(), 0);
        mirror(&counter, 3);
        assert_eq!(counter.get(), 3);
        mirror(&counter, 2);
        assert_eq!(counter.get(), 3, "a lower reading is ignored");
        mirror(&counter, -1);
        assert_eq!(counter.get(), 3);
        mirror(&counter, 5);
        assert_eq!(counter.get(), 5);
    }
}
