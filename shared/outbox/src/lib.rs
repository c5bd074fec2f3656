//! The outbox relay: publishes events that were committed to the outbox to JetStream, with
//! `Nats-Msg-Id` = the event's id so a re-publish is de-duplicated by the stream. A row holds
//! one decision's events (`store::OutboxRow`) and is removed once all of them are on the stream.
//!
//! Two ways out. **Hand-off**: a service's hot path stages its events (`store::outbox::stage`,
//! the rows claimed by their committer) and hands them to [`Relay::hand_off`] right after its
//! commit; they are published at once, pipelined with whatever else was handed off meanwhile,
//! and removed from the table in bulk by one statement per round. An event then costs no claim,
//! no poll and no relay pass on the latency path. **Poll**: the relay claims unpublished rows with
//! `FOR UPDATE SKIP LOCKED` and a claim deadline (never "id > cursor": ids commit out of
//! order), commits the claim before publishing so no connection is held across a network wait,
//! and publishes them; it picks up rows enqueued without a hand-off (the operator's commands)
//! and staged rows whose hand-off lapsed (a committer that crashed between commit and publish,
//! a publish NATS refused). Every PubAck is awaited and only acknowledged rows are removed:
//! the stream keeps the event, the table only what is not yet on it. Any number of relays (one
//! per service replica) can run at once.

use std::sync::Arc;
use std::time::Duration;

use bus::async_nats::HeaderMap;
use bus::{Bus, OutgoingMessage};
use store::{OutboxRow, PgPool, Staged};
use tokio::sync::{Mutex, Notify, mpsc};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// How a relay runs.
#[derive(Debug, Clone)]
pub struct RelayConfig {
    /// Rows claimed per pass: one pipelined round of publishes.
    pub batch_size: i64,
    /// How long a claim lasts; a relay that dies mid-publish loses its rows to others after it.
    pub claim_for: Duration,
    /// Poll interval when nobody signals new rows (rows committed by other processes, staged
    /// rows whose hand-off lapsed).
    pub idle_poll: Duration,
    /// Most handed-off events published in one pipelined round (and removed by one statement).
    pub hand_off_round: usize,
    /// Rounds of handed-off events being published (and removed) at once.
    pub hand_off_rounds_in_flight: usize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            batch_size: 500,
            claim_for: Duration::from_secs(30),
            idle_poll: Duration::from_millis(200),
            hand_off_round: 1000,
            hand_off_rounds_in_flight: 4,
        }
    }
}

/// What one pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RelayOutcome {
    pub published: usize,
    pub failed: usize,
}

/// Publishes outbox rows. Cheap to clone: every clone hands off to, and wakes, the same relay.
#[derive(Clone)]
pub struct Relay {
    pool: PgPool,
    bus: Bus,
    config: RelayConfig,
    wake: Arc<Notify>,
    handed_off: mpsc::UnboundedSender<Vec<OutboxRow>>,
    /// Taken by [`Relay::run`] for as long as it runs.
    hand_offs: Arc<Mutex<mpsc::UnboundedReceiver<Vec<OutboxRow>>>>,
}

impl Relay {
    pub fn new(pool: PgPool, bus: Bus, config: RelayConfig) -> Self {
        let (handed_off, hand_offs) = mpsc::unbounded_channel();
        Self {
            pool,
            bus,
            config,
            wake: Arc::new(Notify::new()),
            handed_off,
            hand_offs: Arc::new(Mutex::new(hand_offs)),
        }
    }

    /// Call after committing [`store::outbox::enqueue`]d rows, so they go out now rather than
    /// at the next poll.
    pub fn notify(&self) {
        self.wake.notify_one();
    }

    /// Call right after committing the transaction that staged `staged`: its events are
    /// published at once. Never waits; a relay that stopped leaves them to the next poll.
    pub fn hand_off(&self, staged: Staged) {
        if staged.is_empty() {
            return;
        }
        // An error means the relay has stopped (shutdown): the rows wait out their hand-off
        // and the next poll of any relay publishes them.
        let _ = self.handed_off.send(staged.into_rows());
    }

    /// One pass: claim, publish (pipelined, every PubAck awaited), remove the published.
    pub async fn run_once(&self) -> Result<RelayOutcome, store::StoreError> {
        let rows =
            store::outbox::claim(&self.pool, self.config.batch_size, self.config.claim_for).await?;
        self.publish(rows).await
    }

    /// Publishes the events of `rows` pipelined, removes the rows whose every event was
    /// acknowledged and gives the others back to the poll without their acknowledged events
    /// (one statement each, whatever their number). The outcome counts events.
    async fn publish(&self, rows: Vec<OutboxRow>) -> Result<RelayOutcome, store::StoreError> {
        if rows.is_empty() {
            return Ok(RelayOutcome::default());
        }
        let row_ids: Vec<Uuid> = rows.iter().map(|row| row.id).collect();
        // Each event's row (by index into `rows`) and id, in publishing order.
        let mut owners: Vec<(usize, Uuid)> = Vec::new();
        let mut outgoing = Vec::new();
        for (row, event) in rows
            .into_iter()
            .enumerate()
            .flat_map(|(index, row)| row.events.into_iter().map(move |event| (index, event)))
        {
            let mut headers = HeaderMap::new();
            for (name, value) in &event.headers {
                headers.insert(name.as_str(), value.as_str());
            }
            owners.push((row, event.id));
            outgoing.push(OutgoingMessage {
                subject: event.subject,
                msg_id: event.id.to_string(),
                headers,
                payload: event.payload.into(),
            });
        }
        let results = self.bus.publish_durable_all(outgoing).await;
        let mut row_failed = vec![false; row_ids.len()];
        let mut acknowledged = Vec::with_capacity(owners.len());
        let mut outcome = RelayOutcome::default();
        let mut first_error = None;
        for ((row, event_id), result) in owners.into_iter().zip(results) {
            match result {
                Ok(_) => acknowledged.push((row, event_id)),
                Err(error) => {
                    first_error.get_or_insert((row_ids[row], error));
                    row_failed[row] = true;
                    outcome.failed += 1;
                }
            }
        }
        outcome.published = acknowledged.len();
        // One line per pass, not per row: during a NATS outage every row of every pass fails.
        if let Some((first_row, error)) = first_error {
            tracing::warn!(
                failed = outcome.failed,
                published = outcome.published,
                first_outbox_row = %first_row,
                error = %telemetry::chain(&error),
                "outbox publishes failed; their rows will be published again"
            );
        }
        let rows_where = |failed: bool| -> Vec<Uuid> {
            (row_ids.iter().zip(&row_failed))
                .filter(|(_, row_failed)| **row_failed == failed)
                .map(|(id, _)| *id)
                .collect()
        };
        store::outbox::remove_published(&self.pool, &rows_where(false)).await?;
        // A row given back leaves out its events already on the stream.
        let already_out: Vec<Uuid> = acknowledged
            .into_iter()
            .filter(|(row, _)| row_failed[*row])
            .map(|(_, event_id)| event_id)
            .collect();
        store::outbox::unclaim(&self.pool, &rows_where(true), &already_out).await?;
        Ok(outcome)
    }

    /// Runs passes until `shutdown`: immediately again while rows keep coming, otherwise on
    /// a signal or the idle poll. Its cost is the `outbox` lane's, whichever service runs it:
    /// every relay claims from the same table.
    pub async fn run(self, shutdown: CancellationToken) {
        let work = async {
            tokio::join!(
                self.publish_hand_offs(shutdown.clone()),
                self.clone().relay_until(shutdown.clone())
            );
        };
        telemetry::cost::in_lane(telemetry::cost::lanes::OUTBOX, work).await;
    }

    /// Publishes handed-off events as they come: each round takes everything handed off
    /// since the last (up to `hand_off_round` events), so under load a round carries many
    /// commits' events and costs one removing statement. Up to `hand_off_rounds_in_flight`
    /// rounds run at once, so an event never waits behind another round's PubAcks or removing
    /// statement. At shutdown it publishes what was handed off before it stopped; what comes
    /// later waits for a poll.
    async fn publish_hand_offs(&self, shutdown: CancellationToken) {
        let mut hand_offs = self.hand_offs.lock().await;
        let mut received: Vec<Vec<OutboxRow>> = Vec::new();
        let mut rounds = tokio::task::JoinSet::new();
        loop {
            let open = tokio::select! {
                biased;
                count = hand_offs.recv_many(&mut received, self.config.hand_off_round) => count > 0,
                () = shutdown.cancelled() => {
                    hand_offs.close();
                    while hand_offs.recv_many(&mut received, usize::MAX).await > 0 {}
                    false
                }
            };
            let mut rows = received.drain(..).flatten().peekable();
            while rows.peek().is_some() {
                // Whole rows, up to `hand_off_round` events (at least one row).
                let mut round: Vec<OutboxRow> = Vec::new();
                let mut events = 0;
                while let Some(row) = rows.next_if(|row| {
                    round.is_empty() || events + row.events.len() <= self.config.hand_off_round
                }) {
                    events += row.events.len();
                    round.push(row);
                }
                while rounds.len() >= self.config.hand_off_rounds_in_flight.max(1) {
                    rounds.join_next().await;
                }
                let relay = self.clone();
                rounds.spawn(telemetry::cost::inherit(async move {
                    if let Err(error) = relay.publish(round).await {
                        // The rows are not lost: their hand-off lapses and a poll publishes them.
                        tracing::warn!(error = %telemetry::chain(&error), "removing published outbox rows failed; a poll will publish them again");
                    }
                }));
            }
            // Finished rounds are reaped as they end, not only when the limit is reached.
            while rounds.try_join_next().is_some() {}
            if !open {
                rounds.join_all().await;
                return;
            }
        }
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
            // After failed passes (PostgreSQL or NATS down), back off up to 10 s; a hand-off
            // or notify still wakes it at once.
            let pause = if failures > 0 {
                messages::retry::RetryPolicy::new(self.config.idle_poll, Duration::from_secs(10))
                    .delay_max(failures)
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
