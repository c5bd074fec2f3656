//! The reaper (SPEC §4.5): sweeps that heal what crashes and lost messages leave behind.
//! Today: stale-attempt recovery (expired leases back to `retry_wait`, or `failed_terminal`
//! when the budget is spent) and the outbox relay (rows whose claim lapsed are re-published).
//! Each sweep is a bounded `run_once` that tests call directly.
//!
//! Every sweep is safe on any number of replicas (`FOR UPDATE SKIP LOCKED`, guarded
//! statements); running it under a leader lease only saves the duplicate work.

use std::time::Duration;

use anyhow::Context as _;
use bus::Bus;
use outbox::Relay;
use runtime::{CommonSettings, Connections, SettingsError, env};
use store::recovery::RecoveryOutcome;
use store::{PgPool, RetryPolicy, StoreError};
use tokio_util::sync::CancellationToken;

/// Reaper settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    /// Pause between sweeps (`PALISADE_REAPER_INTERVAL_MS`, default 1000).
    pub interval: Duration,
    /// Rows one sweep may touch (`PALISADE_REAPER_BATCH`, default 1000).
    pub batch: i64,
    pub retry: RetryPolicy,
}

impl Settings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_common(CommonSettings::from_env()?)
    }

    pub fn from_common(common: CommonSettings) -> Result<Self, SettingsError> {
        let batch = env::parse("PALISADE_REAPER_BATCH", 1_000_i64)?;
        let retry = RetryPolicy {
            base: Duration::from_millis(env::parse("PALISADE_RETRY_BASE_MS", 5_000_u64)?),
            cap: Duration::from_millis(env::parse("PALISADE_RETRY_CAP_MS", 300_000_u64)?),
        };
        if retry.base.is_zero() || retry.cap < retry.base {
            return Err(SettingsError::Invalid {
                name: "PALISADE_RETRY_CAP_MS",
                value: retry.cap.as_millis().to_string(),
                reason: "the cap must be at least PALISADE_RETRY_BASE_MS, and the base above 0"
                    .into(),
            });
        }
        if !(1..=100_000).contains(&batch) {
            return Err(SettingsError::Invalid {
                name: "PALISADE_REAPER_BATCH",
                value: batch.to_string(),
                reason: "must be 1..=100000".into(),
            });
        }
        Ok(Self {
            common,
            interval: Duration::from_millis(env::parse("PALISADE_REAPER_INTERVAL_MS", 1_000_u64)?),
            batch,
            retry,
        })
    }
}

/// A built reaper.
pub struct Service {
    settings: Settings,
    pool: PgPool,
    bus: Bus,
    relay: Relay,
}

impl Service {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let connections = Connections::open(&settings.common, "palisade-reaper")
            .await
            .context("failed to connect")?;
        Ok(Self::from_connections(settings, connections))
    }

    pub fn from_connections(settings: Settings, connections: Connections) -> Self {
        let relay = Relay::new(
            connections.pool.clone(),
            connections.bus.clone(),
            Default::default(),
        );
        Self {
            settings,
            pool: connections.pool,
            bus: connections.bus,
            relay,
        }
    }

    /// One sweep: recover up to `batch` expired attempts, then announce the retried tasks
    /// that are due.
    pub async fn run_once(&self) -> Result<RecoveryOutcome, StoreError> {
        let outcome = store::recovery::recover_expired(
            &self.pool,
            self.bus.subjects(),
            self.settings.retry,
            self.settings.batch,
        )
        .await?;
        if !outcome.is_empty() {
            tracing::info!(
                retried = outcome.retried.len(),
                failed = outcome.failed.len(),
                "recovered expired leases"
            );
            self.relay.notify();
        }
        Ok(outcome)
    }

    /// Sweeps every interval until `shutdown`; the relay runs alongside.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let stop = shutdown.child_token();
        let relay = tokio::spawn(self.relay.clone().run(stop.clone()));
        let mut ticker = tokio::time::interval(self.settings.interval);
        ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => break,
                _ = ticker.tick() => {}
            }
            if let Err(error) = self.run_once().await {
                tracing::warn!(%error, "reaper sweep failed; retrying next interval");
            }
            // Wake dispatch's long-polls for retried tasks whose backoff has passed.
            self.announce_due().await;
        }
        let _ = relay.await;
        Ok(())
    }

    /// Publishes a core-NATS wake-up hint when `retry_wait` tasks are due, so waiting
    /// workers re-check at once instead of at their next poll. A hint, never a decision.
    async fn announce_due(&self) {
        let due = store::recovery::due_retries(&self.pool).await.unwrap_or(0);
        if due > 0 {
            let _ = self
                .bus
                .publish_core(self.bus.subjects().dispatch_wakeup(), bytes::Bytes::new())
                .await;
        }
    }
}
