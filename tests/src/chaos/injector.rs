//! Duplicate, late and reordered delivery, injected in the bus: a subscriber that sees every
//! scan request and every worker result, completion and failure as it is published, and
//! publishes a copy of some of them again into their stream after a random delay, under a
//! fresh `Nats-Msg-Id` (so JetStream stores and delivers it again). A copy arrives after
//! messages sent later than its original (reordered), often after its task has finished or
//! moved to another attempt (late), and always as a second delivery (duplicated).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bus::Bus;
use futures::StreamExt as _;
use messages::{ClientVerb, WorkerVerb};
use rand::{Rng as _, SeedableRng as _};
use tokio_util::sync::CancellationToken;

/// How often and how late copies are made.
#[derive(Debug, Clone, Copy)]
pub struct Injection {
    /// Chance that a message is copied.
    pub probability: f64,
    /// A copy is published this long after its original at most (uniformly drawn).
    pub delay_max: Duration,
}

/// What the injector did.
#[derive(Debug, Default)]
pub struct Injected {
    pub seen: AtomicU64,
    pub copied: AtomicU64,
    /// Copies NATS did not take (it was down); no harm, only fewer copies.
    pub lost: AtomicU64,
}

/// Runs until `stop`, copying as `injection` says.
pub async fn run(
    bus: Bus,
    injection: Injection,
    seed: u64,
    injected: Arc<Injected>,
    stop: CancellationToken,
) {
    let subjects = bus.subjects().clone();
    let watched = [
        subjects.client_wildcard(ClientVerb::Request),
        subjects.worker_wildcard(WorkerVerb::Result),
        subjects.worker_wildcard(WorkerVerb::Complete),
        subjects.worker_wildcard(WorkerVerb::Fail),
    ];
    let mut subscriptions = Vec::new();
    for subject in watched {
        match bus.client().subscribe(subject.clone()).await {
            Ok(subscription) => subscriptions.push(subscription),
            Err(error) => panic!("the injector cannot subscribe to {subject}: {error}"),
        }
    }
    let mut messages = futures::stream::select_all(subscriptions);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut copies = tokio::task::JoinSet::new();
    loop {
        let message = tokio::select! {
            () = stop.cancelled() => break,
            message = messages.next() => match message {
                Some(message) => message,
                None => break,
            },
        };
        injected.seen.fetch_add(1, Ordering::Relaxed);
        while copies.try_join_next().is_some() {}
        if !rng.random_bool(injection.probability) {
            continue;
        }
        let delay = injection.delay_max.mul_f64(rng.random::<f64>());
        let (bus, injected, stop) = (bus.clone(), injected.clone(), stop.clone());
        copies.spawn(async move {
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(delay) => {}
            }
            let mut headers = bus::async_nats::HeaderMap::new();
            for (name, values) in message.headers.iter().flat_map(|headers| headers.iter()) {
                if AsRef::<str>::as_ref(name) == messages::HEADER_MSG_ID {
                    continue;
                }
                for value in values {
                    headers.append(name.clone(), value.clone());
                }
            }
            let copied = bus
                .publish_durable(
                    message.subject.to_string(),
                    &format!("chaos-copy-{}", uuid::Uuid::new_v4()),
                    headers,
                    message.payload,
                )
                .await;
            match copied {
                Ok(_) => injected.copied.fetch_add(1, Ordering::Relaxed),
                Err(_) => injected.lost.fetch_add(1, Ordering::Relaxed),
            };
        });
    }
    copies.shutdown().await;
}
