//! The outbox relay: publishes events that were committed to the `outbox` table to JetStream,
//! with `Nats-Msg-Id` = the row id so a re-publish is de-duplicated by the stream.
//!
//! Rows are claimed with `FOR UPDATE SKIP LOCKED` and a claim deadline (never "id > cursor":
//! ids commit out of order), the claim commits before publishing so no connection is held
//! across a network wait, every PubAck is awaited, and only acknowledged rows are marked
//! published. Any number of relays (one per service replica) can run at once.

use std::sync::Arc;
use std::time::Duration;

use bus::async_nats::HeaderMap;
use bus::{Bus, OutgoingMessage};
use store::PgPool;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// How a relay runs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per pass: one pipelined round of publishes.
    pub batch_size: i64,
    /// How long a claim lasts; a relay that dies mid-publish loses its rows to others after it.
    pub claim_for: Duration,
    /// Poll interval when nobody signals new rows (rows committed by other processes).
    pub idle_poll: Duration,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 500,
            claim_for: Duration::from_secs(30),
            idle_poll: Duration::from_millis(200),
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayOutcome {
    pub published: usize,
    pub failed: usize,
}

/// Publishes outbox rows. Cheap to clone; [`Relay::notify`] wakes it after a commit.
#[derive(Clone)]
pub struct Relay {
    pool: PgPool,
    bus: Bus,
    config: RelayConfig,
    wake: Arc<Notify>,
}

impl Relay {
    pub fn new(pool: PgPool, bus: Bus, config: RelayConfig) -> Self {
        Self {
            pool,
            bus,
            config,
            wake: Arc::new(Notify::new()),
        }
    }

    /// Call after committing outbox rows, so they go out now rather than at the next poll.
    pub fn notify(&self) {
        self.wake.notify_one();
    }

    /// One pass: claim, publish (pipelined, every PubAck awaited), mark published.
    pub async fn run_once(&self) -> Result<RelayOutcome, store::StoreError> {
        let events =
            store::outbox::claim(&self.pool, self.config.batch_size, self.config.claim_for).await?;
        if events.is_empty() {
            return Ok(RelayOutcome::default());
        }
        let ids: Vec<_> = events.iter().map(|event| event.id).collect();
        let outgoing = events
            .into_iter()
            .map(|event| {
                let mut headers = HeaderMap::new();
                for (name, value) in &event.headers {
                    headers.insert(name.as_str(), value.as_str());
                }
                OutgoingMessage {
                    subject: event.subject,
                    msg_id: event.id.to_string(),
                    headers,
                    payload: event.payload.into(),
                }
            })
            .collect();
        let results = self.bus.publish_durable_all(outgoing).await;
        let mut published = Vec::with_capacity(ids.len());
        let mut failed = Vec::new();
        let mut first_error = None;
        for (id, result) in ids.into_iter().zip(results) {
            match result {
                Ok(_) => published.push(id),
                Err(error) => {
                    first_error.get_or_insert((id, error));
                    failed.push(id);
                }
            }
        }
        // One line per pass, not per row: during a NATS outage every row of every pass fails.
        if let Some((first_id, error)) = first_error {
            tracing::warn!(
                failed = failed.len(),
                published = published.len(),
                first_outbox_id = %first_id,
                error = %telemetry::chain(&error),
                "outbox publishes failed; those rows will be retried"
            );
        }
        store::outbox::mark_published(&self.pool, &published).await?;
        store::outbox::unclaim(&self.pool, &failed).await?;
        Ok(RelayOutcome {
            published: published.len(),
            failed: failed.len(),
        })
    }

    /// Runs passes until `shutdown`: immediately again while rows keep coming, otherwise on
    /// a signal or the idle poll. Its cost is the `outbox` lane's, whichever service runs it:
    /// every relay claims from the same table.
    pub async fn run(self, shutdown: CancellationToken) {
        telemetry::cost::in_lane(telemetry::cost::lanes::OUTBOX, self.relay_until(shutdown)).await;
    }

    async fn relay_until(self, shutdown: CancellationToken) {
        let mut failures: u32 = 0;
        loop {
            let outcome = self.run_once().await;
            let busy = match outcome {
                Ok(outcome) => {
                    failures = 0;
                    outcome.published as i64 >= self.config.batch_size
                }
                Err(error) => {
                    failures = failures.saturating_add(1);
                    tracing::warn!(error = %telemetry::chain(&error), failures, "outbox relay pass failed");
                    false
                }
            };
            if busy {
                continue;
            }
            let pause = if failures > 0 {
                self.config.idle_poll * failures.min(50)
            } else {
                self.config.idle_poll
            };
            tokio::select! {
                () = shutdown.cancelled() => return,
                () = self.wake.notified() => {}
                () = tokio::time::sleep(pause) => {}
            }
        }
    }
}
