//! Ingestion (SPEC §4.3): consumes result batches, completions and failures from the results
//! stream, decides each under the fence in one transaction per fetched batch (a savepoint per
//! message), and only after the commit answers the worker and acknowledges JetStream. It also
//! answers a tenant's reads: its findings (`findings`) and its events (`events`), and a
//! worker's artifact uploads: sessions (`artifact`) and their chunks (`upload`).
//!
//! Here: the settings and the service's wiring; the consumer is in `consumer`, the request
//! servers in `servers`.

pub mod artifacts;
mod consumer;
pub mod coverage;
pub mod events;
pub mod findings;
pub mod parse;
pub mod scans;
mod servers;
pub mod uploads;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bus::{Bus, ConsumerSpec};
use runtime::env::{ConsumerTuning, ConsumerVars};
use runtime::{ArtifactLimits, BatchLimits, CommonSettings, Connections, Plumbing, SettingsError};
use store::RetryPolicy;
use telemetry::cost::{in_lane, lanes};
use tokio_util::sync::CancellationToken;

use crate::consumer::Ingestion;

/// The durable consumer's name on the results stream.
pub const CONSUMER_NAME: &str = "ingestion";

/// Ingestion's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    pub batch_limits: BatchLimits,
    /// Artifact size and upload session lifetime (`PALISADE_ARTIFACT_BYTES_MAX` 64 MiB,
    /// `PALISADE_UPLOAD_TTL_MS` 900000).
    pub artifact_limits: ArtifactLimits,
    /// Backoff between attempts of a failed task (`PALISADE_RETRY_BASE_MS` 5000,
    /// `PALISADE_RETRY_CAP_MS` 300000).
    pub retry: RetryPolicy,
    /// How long a lease handed with a completion lasts (`PALISADE_LEASE_TTL_MS` 30000, as
    /// dispatch's leases).
    pub lease_ttl: Duration,
    /// The durable consumer (`PALISADE_INGESTION_BATCH_SIZE` 128, `PALISADE_INGESTION_ACK_WAIT_MS`
    /// 5000, `PALISADE_INGESTION_MAX_DELIVER` 10, `PALISADE_INGESTION_BATCHES_IN_FLIGHT` 4).
    pub consumer: ConsumerTuning,
    /// Where `/healthz` and `/readyz` listen (`PALISADE_HTTP_ADDR`, default `0.0.0.0:9090`,
    /// `off` for none); `None` where one process runs many services and serves them once.
    pub http_addr: Option<std::net::SocketAddr>,
}

impl Settings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_common(CommonSettings::from_env()?)
    }

    pub fn from_common(common: CommonSettings) -> Result<Self, SettingsError> {
        let retry = runtime::retry_policy_from_env()?;
        let consumer = ConsumerTuning::from_env(ConsumerVars {
            batch_size: "PALISADE_INGESTION_BATCH_SIZE",
            ack_wait_ms: "PALISADE_INGESTION_ACK_WAIT_MS",
            max_deliver: "PALISADE_INGESTION_MAX_DELIVER",
            batches_in_flight: "PALISADE_INGESTION_BATCHES_IN_FLIGHT",
        })?;
        Ok(Self {
            common,
            batch_limits: BatchLimits::from_env()?,
            artifact_limits: ArtifactLimits::from_env()?,
            retry,
            lease_ttl: runtime::LeaseSettings::ttl_from_env()?,
            consumer,
            http_addr: runtime::health::http_addr_from_env()?,
        })
    }
}

/// A built ingestion service.
pub struct Service {
    settings: Settings,
    bus: Bus,
    ingestion: Arc<Ingestion>,
    /// The health server and the outbox relay, started by `run_until_stopped`.
    plumbing: Plumbing,
    /// [`Service::crash_after_commit`].
    #[cfg(feature = "testing")]
    crash_after_commit: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Service {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let connections = Connections::open(
            &settings.common,
            &messages::Identity::Service(messages::Service::Ingestion),
        )
        .await
        .context("failed to connect")?;
        Ok(Self::from_connections(settings, connections))
    }

    pub fn from_connections(settings: Settings, connections: Connections) -> Self {
        let mut plumbing = Plumbing::new(&settings.common, settings.http_addr, &connections);
        let ingestion = Arc::new(Ingestion {
            relay: plumbing.relay_outbox(&connections),
            pool: connections.pool,
            bus: connections.bus.clone(),
            limits: settings.batch_limits,
            retry: settings.retry,
            lease_ttl: settings.lease_ttl,
            progress_events: settings.common.progress_events,
        });
        Self {
            settings,
            bus: connections.bus,
            ingestion,
            plumbing,
            #[cfg(feature = "testing")]
            crash_after_commit: None,
        }
    }

    /// The consumer's test fault injection ([`bus::consume::ConsumerSpec::crash_after_commit`]),
    /// given to the built service, never among the [`Settings`] an operator sets.
    #[cfg(feature = "testing")]
    pub fn crash_after_commit(mut self, crash: Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.crash_after_commit = Some(crash);
        self
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        in_lane(lanes::INGESTION, self.serve_until_stopped(shutdown)).await
    }

    async fn serve_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let spec = self.consumer_spec();
        let stop = shutdown.child_token();
        let plumbing = self
            .plumbing
            .start(&stop)
            .await
            .context("failed to serve the health endpoints")?;
        let (servers, waker) =
            servers::start(&self.bus, &self.ingestion.pool, &self.settings).await?;
        let consumer = bus::consume::run(&self.bus, spec, self.ingestion.clone(), stop.clone());
        let result = tokio::select! {
            result = consumer => result.context("ingestion consumer stopped"),
            result = servers => result,
        };
        waker.abort();
        plumbing.stop().await;
        result
    }

    /// The durable consumer of the results stream, tuned by the settings.
    fn consumer_spec(&self) -> ConsumerSpec {
        let subjects = self.bus.subjects();
        let mut spec = ConsumerSpec::new(
            subjects.results_stream(),
            CONSUMER_NAME,
            subjects.results_wildcard(),
        );
        self.settings.consumer.apply(&mut spec);
        #[cfg(feature = "testing")]
        {
            spec.crash_after_commit = self.crash_after_commit.clone();
        }
        spec.removes_decided = true;
        spec
    }
}
