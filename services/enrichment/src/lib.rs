//! Enrichment (SPEC §4.4): claims the one enrichment job of each completed scan under a
//! fenced lease and completes it.
//!
//! Scope today: the durable job loop (claim with `SKIP LOCKED`, fencing token, fenced
//! completion, expired claims taken over). CVE lookups against the NVD API or local NVD files,
//! checkpoints, retries and the four request outcomes come with the enrichment issue; until
//! then a job completes recording the CVE ids it found and `"source": "none"`.

use std::time::Duration;

use anyhow::Context as _;
use runtime::{CommonSettings, Connections, Plumbing, SettingsError, env};
use store::PgPool;
use telemetry::cost::{in_lane, lanes};
use tokio_util::sync::CancellationToken;

/// Enrichment settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    /// Pause when no job is due (`PALISADE_ENRICHMENT_POLL_MS`, default 1000).
    pub poll: Duration,
    /// Claim lease (`PALISADE_ENRICHMENT_LEASE_TTL_MS`, default 60000).
    pub lease_ttl: Duration,
    /// Where `/healthz` and `/readyz` listen (`PALISADE_HTTP_ADDR`, default `0.0.0.0:9090`,
    /// `off` for none); `None` where one process runs many services and serves them once.
    pub http_addr: Option<std::net::SocketAddr>,
}

impl Settings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_common(CommonSettings::from_env()?)
    }

    pub fn from_common(common: CommonSettings) -> Result<Self, SettingsError> {
        Ok(Self {
            common,
            poll: Duration::from_millis(env::parse("PALISADE_ENRICHMENT_POLL_MS", 1_000_u64)?),
            lease_ttl: Duration::from_millis(env::parse(
                "PALISADE_ENRICHMENT_LEASE_TTL_MS",
                60_000_u64,
            )?),
            http_addr: runtime::health::http_addr_from_env()?,
        })
    }
}

/// A built enrichment service.
pub struct Service {
    settings: Settings,
    pool: PgPool,
    owner: String,
    /// The health server, started by `run_until_stopped` (enrichment writes no outbox rows).
    plumbing: Plumbing,
}

impl Service {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let connections = Connections::open(
            &settings.common,
            &messages::Identity::Service(messages::Service::Enrichment),
        )
        .await
        .context("failed to connect")?;
        Ok(Self::from_connections(settings, connections))
    }

    pub fn from_connections(settings: Settings, connections: Connections) -> Self {
        let plumbing = Plumbing::new(&settings.common, settings.http_addr, &connections);
        Self {
            settings,
            pool: connections.pool,
            owner: format!("enrichment-{}", uuid::Uuid::new_v4()),
            plumbing,
        }
    }

    /// Jobs claimed (and completed) together: one statement each for the claim, the CVE
    /// look-up and the completion, whatever their number.
    pub const BATCH: i64 = 64;

    /// Claims and completes up to [`Service::BATCH`] due jobs; true when there were any.
    pub async fn run_once(&self) -> Result<bool, store::StoreError> {
        let jobs = store::enrichment::claim(
            &self.pool,
            &self.owner,
            self.settings.lease_ttl,
            Self::BATCH,
        )
        .await?;
        if jobs.is_empty() {
            return Ok(false);
        }
        // Enrichment is triggered by a poll, not a message: each job joins its scan's trace
        // through the context stored at admission, with a span that lasts until it completes.
        let spans: Vec<tracing::Span> = jobs
            .iter()
            .map(|job| {
                let span = tracing::info_span!(
                    parent: None,
                    "enrich",
                    otel.name = "enrich scan",
                    otel.kind = "internal",
                    palisade.service = "enrichment",
                    palisade.scan_id = %job.scan_id,
                );
                bus::trace::set_parent_from_traceparent(
                    &span,
                    job.trace_context.as_deref().unwrap_or(""),
                );
                span
            })
            .collect();
        let scan_ids: Vec<uuid::Uuid> = jobs.iter().map(|job| job.scan_id).collect();
        let mut cve_ids = store::enrichment::scan_cve_ids(&self.pool, &scan_ids).await?;
        let results: Vec<(&store::enrichment::ClaimedJob, serde_json::Value)> = jobs
            .iter()
            .map(|job| {
                let cve_ids = cve_ids.remove(&job.scan_id).unwrap_or_default();
                (
                    job,
                    serde_json::json!({ "cve_ids": cve_ids, "source": "none" }),
                )
            })
            .collect();
        let completed = store::enrichment::complete(&self.pool, &results).await?;
        for (job, span) in jobs.iter().zip(&spans) {
            if !completed.contains(&job.id) {
                span.in_scope(|| {
                    tracing::warn!(job_id = %job.id, "enrichment job was taken over; dropping this result");
                });
            }
        }
        Ok(true)
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        in_lane(lanes::ENRICHMENT, self.serve_until_stopped(shutdown)).await
    }

    async fn serve_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let stop = shutdown.child_token();
        let _stop_on_return = stop.clone().drop_guard();
        let plumbing = self
            .plumbing
            .start(&stop)
            .await
            .context("failed to serve the health endpoints")?;
        loop {
            let worked = match self.run_once().await {
                Ok(worked) => worked,
                Err(error) => {
                    tracing::warn!(error = %telemetry::chain(&error), "enrichment pass failed");
                    false
                }
            };
            if worked {
                continue;
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.settings.poll) => {}
            }
        }
        plumbing.stop().await;
        Ok(())
    }
}
