//! Ingestion's acknowledgements arrive on one subject per worker; the router hands each to the
//! lease task of its attempt.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use messages::v1;
use prost::Message as _;
use tokio::sync::mpsc;

/// Acknowledgements queued per attempt. A lease task has at most
/// [`crate::lease::BATCHES_UNACKED_MAX`] batches and one completion waiting; beyond this an
/// acknowledgement is dropped, and the resend it leads to brings another.
pub(crate) const ACK_QUEUE_MAX: usize = 256;

/// Attempt id → the queue of the lease task working on it.
#[derive(Debug, Default)]
pub(crate) struct AckRouter {
    routes: Mutex<HashMap<String, mpsc::Sender<v1::IngestAck>>>,
}

/// Removes its attempt's route when the lease task ends.
#[derive(Debug)]
pub(crate) struct Route {
    router: Arc<AckRouter>,
    attempt_id: String,
}

impl Drop for Route {
    fn drop(&mut self) {
        self.router
            .routes
            .lock()
            .expect("ack routes lock is never poisoned")
            .remove(&self.attempt_id);
    }
}

impl AckRouter {
    /// Starts routing acknowledgements of `attempt_id`; `None` when it is routed already
    /// (dispatch handed out one attempt twice).
    pub fn register(
        self: &Arc<Self>,
        attempt_id: &str,
    ) -> Option<(Route, mpsc::Receiver<v1::IngestAck>)> {
        let mut routes = self
            .routes
            .lock()
            .expect("ack routes lock is never poisoned");
        if routes.contains_key(attempt_id) {
            return None;
        }
        let (sender, receiver) = mpsc::channel(ACK_QUEUE_MAX);
        routes.insert(attempt_id.to_owned(), sender);
        let route = Route {
            router: self.clone(),
            attempt_id: attempt_id.to_owned(),
        };
        Some((route, receiver))
    }

    /// Hands `ack` to its attempt's task, without waiting.
    pub fn dispatch(&self, ack: v1::IngestAck) {
        let sender = self
            .routes
            .lock()
            .expect("ack routes lock is never poisoned")
            .get(&ack.attempt_id)
            .cloned();
        let Some(sender) = sender else {
            tracing::debug!(attempt_id = %ack.attempt_id, kind = %ack.kind, "ack for an attempt no longer running");
            return;
        };
        if let Err(mpsc::error::TrySendError::Full(ack)) = sender.try_send(ack) {
            tracing::warn!(attempt_id = %ack.attempt_id, kind = %ack.kind, "ack queue full, dropping ack; the message will be resent");
        }
    }

    /// Routes every acknowledgement arriving on `subscription` until it ends.
    pub async fn run(self: Arc<Self>, mut subscription: bus::async_nats::Subscriber) {
        while let Some(message) = subscription.next().await {
            telemetry::cost::count_messages(telemetry::cost::Direction::Received, 1);
            match v1::IngestAck::decode(message.payload) {
                Ok(ack) => self.dispatch(ack),
                Err(error) => {
                    tracing::warn!(error = %telemetry::chain(&error), "undecodable ack from ingestion, ignored")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ack(attempt_id: &str, sequence_number: u32) -> v1::IngestAck {
        v1::IngestAck {
            kind: "result".into(),
            attempt_id: attempt_id.into(),
            sequence_number,
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn routes_by_attempt_until_the_route_drops() {
        let router = Arc::new(AckRouter::default());
        let (route_a, mut acks_a) = router.register("a").unwrap();
        let (_route_b, mut acks_b) = router.register("b").unwrap();
        assert!(router.register("a").is_none(), "one route per attempt");
        router.dispatch(ack("b", 1));
        router.dispatch(ack("a", 2));
        assert_eq!(acks_a.recv().await.unwrap().sequence_number, 2);
        assert_eq!(acks_b.recv().await.unwrap().sequence_number, 1);
        drop(route_a);
        router.dispatch(ack("a", 3));
        assert!(
            acks_a.recv().await.is_none(),
            "the sender went with the route"
        );
        assert!(router.register("a").is_some());
    }

    #[tokio::test]
    async fn drops_acks_beyond_the_queue_bound() {
        let router = Arc::new(AckRouter::default());
        let (_route, mut acks) = router.register("a").unwrap();
        for sequence_number in 0..(ACK_QUEUE_MAX as u32 + 10) {
            router.dispatch(ack("a", sequence_number));
        }
        let mut received = 0;
        while acks.try_recv().is_ok() {
            received += 1;
        }
        assert_eq!(received, ACK_QUEUE_MAX);
    }
}
