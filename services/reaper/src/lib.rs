//! The reaper (SPEC §4.5): sweeps that heal what crashes and lost messages leave behind:
//! stale-attempt recovery (expired leases back to `retry_wait`, or `failed_terminal` when the
//! budget is spent), execution deadlines (enforced even while a worker renews), wake-ups for
//! retried tasks that became due, expired upload sessions (and what ended ones left on the
//! bus: chunks, objects), retention, the slots of recurring scan schedules
//! (`store::fire`: each fired once, through the admission script), and the outbox relay
//! (rows whose claim lapsed are re-published). Each sweep is a bounded `run_once` that tests
//! call directly; it logs only when it acted.
//!
//! The same replica tends palisade's hot tables ([`upkeep`]: vacuum and analyze driven by
//! their churn, every `PALISADE_UPKEEP_INTERVAL_MS`), beside the sweeps.
//!
//! Sweeps run only on the replica that holds the `palisade-reaper` leader lease. Every sweep
//! is also safe on any number of replicas (`FOR UPDATE SKIP LOCKED`, guarded statements), so
//! the lease saves duplicate work; it is not what keeps the data right.

pub mod metrics;
pub mod upkeep;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bus::Bus;
use outbox::Relay;
use runtime::{CommonSettings, Connections, Plumbing, SettingsError, env};
use store::recover::{Pruned, RecoveryOutcome};
use store::{PgPool, RetryPolicy, StoreError};
use telemetry::cost::{in_lane, lanes};
use tokio_util::sync::CancellationToken;

/// Upload sessions whose leftovers one sweep removes (each costs a few NATS round trips).
pub const UPLOAD_REMOVALS_MAX: i64 = 100;

/// Reaper settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    /// Pause between sweeps (`PALISADE_REAPER_INTERVAL_MS`, default 1000).
    pub interval: Duration,
    /// Rows one sweep may touch (`PALISADE_REAPER_BATCH`, default 1000).
    pub batch: i64,
    pub retry: RetryPolicy,
    /// Transport history older than this is pruned (`PALISADE_RETENTION_HOURS`, default 720).
    pub retention: Duration,
    /// A task never leased fails with `no_worker` (and its scan with it, freeing the target)
    /// after waiting this long while no live worker of its organization offers its plugin
    /// (`PALISADE_PENDING_DEADLINE_MS`, default 600000: ten minutes).
    pub pending_deadline: Duration,
    /// The task attempt budget of the scans schedules submit (`PALISADE_MAX_ATTEMPTS`, as
    /// admission).
    pub max_attempts: i32,
    /// Longest a sweep may take before it is abandoned until the next interval.
    pub sweep_time_max: Duration,
    /// How often the leader tends the hot tables (`PALISADE_UPKEEP_INTERVAL_MS`, default
    /// 2000; `0` for never, where the server's autovacuum is made eager enough instead:
    /// `docs/operations.md`).
    pub upkeep_interval: Option<Duration>,
    /// The leader lease the sweeps run under (`PALISADE_REAPER_LEASE_TTL_MS`, default 15000;
    /// `PALISADE_REAPER_LEASE_RETRY_MS`, default 5000): a crashed leader is replaced within
    /// TTL + retry, a stopped one within retry.
    pub lease: lease::RunConfig,
    /// Where `/healthz` and `/readyz` listen (`PALISADE_HTTP_ADDR`, default `0.0.0.0:9090`,
    /// `off` for none); `None` where one process runs many services and serves them once.
    pub http_addr: Option<std::net::SocketAddr>,
}

impl Settings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_common(CommonSettings::from_env()?)
    }

    pub fn from_common(common: CommonSettings) -> Result<Self, SettingsError> {
        let batch = env::parse_in("PALISADE_REAPER_BATCH", 1_000_i64, 1..=100_000)?;
        let retry = runtime::retry_policy_from_env()?;
        Ok(Self {
            common,
            interval: Duration::from_millis(env::parse("PALISADE_REAPER_INTERVAL_MS", 1_000_u64)?),
            batch,
            retry,
            retention: Duration::from_secs(
                3_600 * env::parse("PALISADE_RETENTION_HOURS", 720_u64)?,
            ),
            pending_deadline: Duration::from_millis(env::parse(
                "PALISADE_PENDING_DEADLINE_MS",
                600_000_u64,
            )?),
            max_attempts: runtime::max_attempts_from_env()?,
            sweep_time_max: Duration::from_secs(30),
            upkeep_interval: Some(env::parse("PALISADE_UPKEEP_INTERVAL_MS", 2_000_u64)?)
                .filter(|ms| *ms > 0)
                .map(Duration::from_millis),
            lease: {
                let ttl_ms = env::parse("PALISADE_REAPER_LEASE_TTL_MS", 15_000_u64)?;
                let retry_ms = env::parse("PALISADE_REAPER_LEASE_RETRY_MS", 5_000_u64)?;
                lease::RunConfig::new(
                    Duration::from_millis(ttl_ms),
                    Duration::from_millis(retry_ms),
                )
                .map_err(|error| SettingsError::Invalid {
                    name: "PALISADE_REAPER_LEASE_TTL_MS / PALISADE_REAPER_LEASE_RETRY_MS",
                    value: format!("{ttl_ms} / {retry_ms}"),
                    reason: error.to_string(),
                })?
            },
            http_addr: runtime::health::http_addr_from_env()?,
        })
    }
}

/// A sweep starting or ending on this replica (tests and metrics observe them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SweepEvent {
    Started,
    Finished,
}

/// Called on every [`SweepEvent`].
pub type SweepObserver = Arc<dyn Fn(SweepEvent) + Send + Sync>;

/// A built reaper. Cheap to clone.
#[derive(Clone)]
pub struct Service {
    settings: Settings,
    pool: PgPool,
    bus: Bus,
    relay: Relay,
    owner: String,
    observer: Option<SweepObserver>,
    /// The clock schedules are fired by (tests set it; leases keep the system's).
    clock: Arc<dyn lease::Clock>,
    is_leader: Arc<std::sync::Mutex<Option<tokio::sync::watch::Receiver<bool>>>>,
    /// The health server and the outbox relay, started by `run_until_stopped`.
    plumbing: Plumbing,
}

impl Service {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let connections = Connections::open(
            &settings.common,
            &messages::Identity::Service(messages::Service::Reaper),
        )
        .await
        .context("failed to connect")?;
        Ok(Self::from_connections(settings, connections))
    }

    pub fn from_connections(settings: Settings, connections: Connections) -> Self {
        let mut plumbing = Plumbing::new(&settings.common, settings.http_addr, &connections);
        let relay = plumbing.relay_outbox(&connections);
        Self {
            settings,
            pool: connections.pool,
            bus: connections.bus,
            relay,
            owner: lease::owner_id("reaper"),
            observer: None,
            clock: Arc::new(lease::SystemClock),
            is_leader: Arc::default(),
            plumbing,
        }
    }

    /// Reports every sweep to `observer`.
    pub fn with_sweep_observer(mut self, observer: SweepObserver) -> Self {
        self.observer = Some(observer);
        self
    }

    /// Fires schedules by `clock` instead of the system's (tests step it).
    pub fn with_clock(mut self, clock: Arc<dyn lease::Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// This replica's lease owner id.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// Whether this replica holds the reaper lease now.
    pub fn is_leader(&self) -> bool {
        self.is_leader
            .lock()
            .expect("not poisoned")
            .as_ref()
            .is_some_and(|leader| *leader.borrow())
    }

    /// One sweep, bounded in rows (`batch` per step) and time (`sweep_time_max`).
    pub async fn run_once(&self) -> Result<SweepOutcome, StoreError> {
        match tokio::time::timeout(self.settings.sweep_time_max, self.sweep()).await {
            Ok(outcome) => outcome,
            Err(_) => Err(StoreError::Corrupt(format!(
                "sweep took longer than {:?}; the rest waits for the next interval",
                self.settings.sweep_time_max
            ))),
        }
    }

    async fn sweep(&self) -> Result<SweepOutcome, StoreError> {
        let outcome = self.sweep_steps().await?;
        if outcome.acted() {
            outcome.log_acted();
            self.relay.notify();
        }
        if outcome.due_retries > 0 {
            // A hint that wakes waiting acquires for retried tasks whose backoff passed.
            let wakeup = self
                .bus
                .publish_untraced(self.bus.subjects().dispatch_wakeup(), bytes::Bytes::new());
            let _ = in_lane(lanes::REAPER_RETRIES, wakeup).await;
        }
        Ok(outcome)
    }

    /// The sweep's steps in order, each its own transaction, bounded by `batch` rows.
    async fn sweep_steps(&self) -> Result<SweepOutcome, StoreError> {
        let subjects = self.bus.subjects();
        let batch = self.settings.batch;
        // Each step is a lane of its own, so its cost shows in `palisade_db_statements_total`.
        Ok(SweepOutcome {
            recovered: in_lane(
                lanes::REAPER_RECOVERY,
                store::recover::recover_expired(&self.pool, subjects, self.settings.retry, batch),
            )
            .await?,
            overdue: in_lane(
                lanes::REAPER_DEADLINES,
                store::recover::fail_overdue(&self.pool, subjects, batch),
            )
            .await?,
            stranded: in_lane(
                lanes::REAPER_STRANDED,
                store::recover::fail_stranded(
                    &self.pool,
                    subjects,
                    self.settings.pending_deadline,
                    self.settings.common.metrics.worker_seen_within,
                    batch,
                ),
            )
            .await?,
            enrichment: in_lane(
                lanes::REAPER_ENRICHMENT,
                store::enrichment::recover_expired(
                    &self.pool,
                    subjects,
                    self.settings.retry,
                    batch,
                ),
            )
            .await?,
            uploads_expired: in_lane(
                lanes::REAPER_UPLOADS,
                store::recover::expire_uploads(&self.pool, batch),
            )
            .await?,
            uploads_removed: in_lane(lanes::REAPER_UPLOADS, self.remove_upload_leftovers()).await?,
            pruned: in_lane(
                lanes::REAPER_RETENTION,
                store::recover::prune(&self.pool, self.settings.retention, batch),
            )
            .await?,
            schedules: in_lane(lanes::REAPER_SCHEDULES, self.fire_schedules()).await?,
            due_retries: in_lane(
                lanes::REAPER_RETRIES,
                store::recover::due_retries(&self.pool),
            )
            .await?,
        })
    }

    /// Fires the schedules due now by this replica's clock (`store::fire`), in one
    /// transaction; each slot's scan joins a trace of its own, rooted at the fire's span.
    async fn fire_schedules(&self) -> Result<Vec<store::fire::Fire>, StoreError> {
        let trace_context = |schedule: &store::fire::DueSchedule,
                             slot: chrono::DateTime<chrono::Utc>| {
            let span = tracing::info_span!(
                parent: None,
                "schedule.fire",
                schedule_id = %schedule.id,
                organization_id = %schedule.organization_id,
                slot = %slot.to_rfc3339(),
            );
            bus::trace::traceparent_of(&span)
        };
        let script = store::fire::FireDue {
            subjects: self.bus.subjects(),
            now: self.clock.now(),
            limit: self.settings.batch,
            max_attempts: self.settings.max_attempts,
            trace_context: &trace_context,
        };
        let (fires, staged) =
            store::decide_batch(&self.pool, self.settings.common.progress_events, &script).await?;
        self.relay.hand_off(staged);
        metrics::record_fires(&fires);
        // A queued slot is tried at every sweep: only its firing is logged.
        for fire in &fires {
            if let Some(outcome) = fire.outcome {
                tracing::info!(
                    schedule_id = %fire.schedule_id,
                    slot = %fire.slot.to_rfc3339(),
                    outcome = outcome.as_str(),
                    scan_id = ?fire.scan_id,
                    missed = fire.missed,
                    "schedule slot fired"
                );
            }
        }
        Ok(fires)
    }

    /// Removes what upload sessions left on the bus: of those that expired or failed, the
    /// chunks on their upload subject and any object under their key (a session can expire
    /// after its file was stored, its commit refused); of a committed one whose chunks ingestion
    /// did not purge (it stopped between its commit and its purge), the chunks only: its object
    /// is the artifact. At most [`UPLOAD_REMOVALS_MAX`] sessions a sweep; a session whose
    /// removal fails on the bus stays to be removed at the next sweep.
    async fn remove_upload_leftovers(&self) -> Result<u64, StoreError> {
        let removable = store::artifacts::removable(&self.pool, UPLOAD_REMOVALS_MAX).await?;
        if removable.is_empty() {
            return Ok(0);
        }
        let store = match runtime::artifacts::Artifacts::open(
            &self.bus,
            &self.settings.common.artifact_store,
        )
        .await
        {
            Ok(store) => store,
            Err(error) => {
                tracing::warn!(error = %telemetry::chain(&error), "upload leftovers not removed; retrying next sweep");
                return Ok(0);
            }
        };
        let mut removed = Vec::with_capacity(removable.len());
        for upload in removable {
            let id = upload.id.to_string();
            let chunks = match upload.worker_id {
                Some(worker_id) => self.bus.purge_upload(&worker_id.to_string(), &id).await,
                None => Ok(()),
            };
            let object = if upload.is_artifact() {
                Ok(())
            } else {
                bus::artifacts::ArtifactStore::delete(&store, &upload.object_key).await
            };
            match chunks.and(object) {
                Ok(()) => removed.push(upload.id),
                Err(error) => {
                    tracing::warn!(upload_id = %id, error = %telemetry::chain(&error), "upload leftovers not removed; retrying next sweep");
                }
            }
        }
        store::artifacts::mark_removed(&self.pool, &removed).await
    }

    /// Campaigns for the reaper lease and, while it holds it, sweeps every interval; the
    /// outbox relay runs on every replica (it is safe to). Returns at `shutdown`, releasing
    /// the lease so another replica takes over within one retry interval.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let stop = shutdown.child_token();
        let plumbing = self
            .plumbing
            .start(&stop)
            .await
            .context("failed to serve the health endpoints")?;
        let election = lease::Election::new(
            lease::PgStore::new(self.pool.clone()),
            lease::SystemClock,
            lease::names::REAPER,
            self.owner.clone(),
            self.settings.lease,
        );
        metrics::register();
        upkeep::register();
        *self.is_leader.lock().expect("not poisoned") = Some(election.watch());
        let mut leader_watch = election.watch();
        let leader_stop = stop.clone();
        let leader_gauge = tokio::spawn(async move {
            loop {
                let is_leader = *leader_watch.borrow_and_update();
                bus::metrics::set_leader(lease::names::REAPER, is_leader);
                tokio::select! {
                    () = leader_stop.cancelled() => break,
                    changed = leader_watch.changed() => if changed.is_err() { break },
                }
            }
            bus::metrics::set_leader(lease::names::REAPER, false);
        });
        let service = self.clone();
        // Campaigning and renewing is the election lane; each sweep step names its own.
        let campaign = election.run(
            move |term| {
                let service = service.clone();
                async move {
                    tokio::join!(
                        service.sweep_while_leader(&term),
                        service.tend_while_leader(&term)
                    );
                }
            },
            stop.clone(),
        );
        in_lane(lanes::REAPER_ELECTION, campaign).await;
        plumbing.stop().await;
        let _ = leader_gauge.await;
        Ok(())
    }

    /// Tends the hot tables every upkeep interval until the term ends (never when it is off).
    async fn tend_while_leader(&self, term: &lease::TermGuard) {
        if let Some(interval) = self.settings.upkeep_interval {
            in_lane(
                lanes::REAPER_UPKEEP,
                upkeep::tend_until(&self.pool, interval, term.ended()),
            )
            .await;
        }
    }

    /// Sweeps every interval until the term ends.
    async fn sweep_while_leader(&self, term: &lease::TermGuard) {
        let mut ticker = tokio::time::interval(self.settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = term.ended() => return,
                _ = ticker.tick() => {}
            }
            self.observe(SweepEvent::Started);
            // A term that ends mid-sweep stops it: the sweep's statements are each safe to
            // abandon (one transaction each), and a stale leader must stop acting.
            let outcome = tokio::select! {
                () = term.ended() => None,
                outcome = self.run_once() => Some(outcome),
            };
            self.observe(SweepEvent::Finished);
            match outcome {
                None => return,
                Some(Err(error)) => {
                    tracing::warn!(error = %telemetry::chain(&error), "reaper sweep failed; retrying next interval")
                }
                Some(Ok(_)) => {}
            }
        }
    }

    fn observe(&self, event: SweepEvent) {
        if let Some(observer) = &self.observer {
            observer(event);
        }
    }
}

/// What one sweep did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepOutcome {
    pub recovered: RecoveryOutcome,
    /// Tasks failed because an attempt ran past the execution deadline.
    pub overdue: Vec<uuid::Uuid>,
    /// Tasks failed because no live worker offered their plugin before the pending deadline.
    pub stranded: Vec<uuid::Uuid>,
    /// Enrichment jobs whose claim lapsed: back to pending, or failed once their executions
    /// were spent.
    pub enrichment: store::enrichment::RecoveredJobs,
    pub uploads_expired: u64,
    /// Upload sessions whose leftovers were removed: chunks and object of expired or failed
    /// ones, chunks of committed ones that ingestion did not purge.
    pub uploads_removed: u64,
    pub pruned: Pruned,
    /// Schedule slots fired (or still queued behind their target's active scan).
    pub schedules: Vec<store::fire::Fire>,
    /// `retry_wait` tasks due now (a wake-up was published for them).
    pub due_retries: i64,
}

impl SweepOutcome {
    /// Whether the sweep changed anything (it logs only then).
    pub fn acted(&self) -> bool {
        !self.recovered.is_empty()
            || !self.overdue.is_empty()
            || !self.stranded.is_empty()
            || !self.enrichment.is_empty()
            || self.uploads_expired > 0
            || self.uploads_removed > 0
            || self.pruned != Pruned::default()
            || self.schedules.iter().any(|fire| fire.outcome.is_some())
    }

    /// The one line a sweep that acted logs.
    fn log_acted(&self) {
        tracing::info!(
            retried = self.recovered.retried.len(),
            budget_spent = self.recovered.failed.len(),
            overdue = self.overdue.len(),
            stranded = self.stranded.len(),
            enrichment_retried = self.enrichment.retried.len(),
            enrichment_failed = self.enrichment.failed.len(),
            uploads_expired = self.uploads_expired,
            uploads_removed = self.uploads_removed,
            pruned_outbox = self.pruned.outbox,
            pruned_batches = self.pruned.batches,
            pruned_dead_letters = self.pruned.dead_letters,
            pruned_cve_quarantine = self.pruned.cve_quarantine,
            pruned_schedule_fires = self.pruned.schedule_fires,
            schedule_fires = self.schedules.len(),
            "reaper sweep acted"
        );
    }
}
