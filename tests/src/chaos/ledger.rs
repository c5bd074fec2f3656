//! The steady load and its ledger: scan requests published on the durable path at a fixed
//! rate, each recorded as attempted, and as confirmed once JetStream's PubAck arrived. Only a
//! confirmed request is owed a scan; an unconfirmed one may or may not have one.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use messages::v1;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

/// Findings each synthetic scan emits; with the suite's batch limit of 10, three batches.
pub const FINDINGS_PER_SCAN: i64 = 25;

/// The client id every request of the suite carries.
pub const CLIENT_ID: &str = "chaos";

/// Publishes awaiting their PubAck at once; more wait (a NATS outage must not pile up tasks).
const PUBLISHES_IN_FLIGHT: usize = 64;

/// What was asked and what was confirmed, by idempotency key.
#[derive(Debug, Default)]
pub struct Ledger {
    pub attempted: BTreeSet<String>,
    pub confirmed: BTreeSet<String>,
    /// Publish errors (NATS down, PubAck timed out), by message.
    pub errors: Vec<String>,
}

pub type SharedLedger = Arc<Mutex<Ledger>>;

/// The request numbered `n`: a unique target (one active scan per target) whose synthetic
/// plugin takes 300 ms and emits [`FINDINGS_PER_SCAN`] findings.
pub fn request(client: &client::Client, organization_id: &str, n: u64) -> v1::ScanRequest {
    client.request(
        organization_id,
        &format!("synthetic://chaos-{n}?duration_ms=300&findings={FINDINGS_PER_SCAN}"),
        &["synthetic"],
        &format!("chaos-{n}"),
    )
}

/// Publishes `rate` requests a second until `stop`.
pub async fn run_load(
    client: client::Client,
    organization_id: String,
    rate: f64,
    ledger: SharedLedger,
    stop: CancellationToken,
) {
    let in_flight = Arc::new(Semaphore::new(PUBLISHES_IN_FLIGHT));
    let mut ticks = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut publishes = tokio::task::JoinSet::new();
    for n in 0.. {
        tokio::select! {
            () = stop.cancelled() => break,
            _ = ticks.tick() => {}
        }
        let permit = tokio::select! {
            () = stop.cancelled() => break,
            permit = in_flight.clone().acquire_owned() => permit.expect("never closed"),
        };
        while publishes.try_join_next().is_some() {}
        let request = request(&client, &organization_id, n);
        ledger
            .lock()
            .expect("not poisoned")
            .attempted
            .insert(request.idempotency_key.clone());
        let (client, ledger) = (client.clone(), ledger.clone());
        publishes.spawn(async move {
            let published = client.publish(&request).await;
            let mut ledger = ledger.lock().expect("not poisoned");
            match published {
                Ok(()) => {
                    ledger.confirmed.insert(request.idempotency_key);
                }
                Err(error) => ledger.errors.push(error.to_string()),
            }
            drop(permit);
        });
    }
    // A publish still waiting for its PubAck may yet be confirmed.
    while publishes.join_next().await.is_some() {}
}
