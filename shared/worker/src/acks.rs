//! Ingestion's acknowledgements arrive on one subject per worker; the router hands each to the
//! lease task of its attempt.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use futures::StreamExt as _;
use messages::{WorkerVerb, v1};
use prost::Message as _;
use tokio::sync::{Notify, mpsc};

/// Acknowledgements queued per attempt. A lease task has at most
/// [`crate::lease::BATCHES_UNACKED_MAX`] batches and one completion waiting; beyond this an
/// acknowledgement is dropped, and the resend it leads to brings another.
pub(crate) const ACK_QUEUE_MAX: usize = 256;

/// Attempt id → the queue of the lease task working on it; and, per durable verb, the room
/// under the worker's quota of waiting results ([`Room`]).
#[derive(Debug, Default)]
pub(crate) struct AckRouter {
    routes: Mutex<HashMap<String, mpsc::Sender<v1::IngestAck>>>,
    /// One per [`WorkerVerb::DURABLE`], in its order.
    rooms: [Room; WorkerVerb::DURABLE.len()],
}

/// One durable verb's messages of this worker that JetStream refused at the worker's quota of
/// waiting results, and the signal that ingestion decided one of the verb's messages. While
/// any wait, a new message of the verb waits behind them instead of taking the room first.
#[derive(Debug, Default)]
pub(crate) struct Room {
    decided: Notify,
    waiting: AtomicUsize,
}

impl Room {
    /// Notified once per acknowledgement of one of the verb's messages (for whichever
    /// attempt): that message no longer counts against the quota, so one waiting message may
    /// be published.
    pub fn decided(&self) -> &Notify {
        &self.decided
    }

    /// Messages of the verb waiting for room.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Relaxed)
    }
}

/// One message counted among its verb's waiting ([`Room::waiting`]) until dropped.
#[derive(Debug)]
pub(crate) struct Waiting {
    router: Arc<AckRouter>,
    index: usize,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        self.router.rooms[self.index]
            .waiting
            .fetch_sub(1, Ordering::Relaxed);
    }
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

    /// `verb`'s room; `None` for a verb that is not durable.
    pub fn room(&self, verb: WorkerVerb) -> Option<&Room> {
        Some(&self.rooms[durable_index(verb)?])
    }

    /// Counts one more message of `verb` waiting for room, until the returned guard drops.
    pub fn start_waiting(self: &Arc<Self>, verb: WorkerVerb) -> Option<Waiting> {
        let index = durable_index(verb)?;
        self.rooms[index].waiting.fetch_add(1, Ordering::Relaxed);
        Some(Waiting {
            router: self.clone(),
            index,
        })
    }

    /// Hands `ack` to its attempt's task, without waiting.
    pub fn dispatch(&self, ack: v1::IngestAck) {
        let verb = WorkerVerb::DURABLE
            .into_iter()
            .find(|verb| verb.name() == ack.kind);
        if let Some(room) = verb.and_then(|verb| self.room(verb)) {
            room.decided.notify_one();
        }
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

/// `verb`'s place in [`WorkerVerb::DURABLE`].
fn durable_index(verb: WorkerVerb) -> Option<usize> {
    WorkerVerb::DURABLE
        .iter()
        .position(|&durable| durable == verb)
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

    #[tokio::test]
    async fn an_ack_makes_room_for_one_message_of_its_own_verb() {
        let router = Arc::new(AckRouter::default());
        let waiting = router.start_waiting(WorkerVerb::Complete).unwrap();
        let also = router.start_waiting(WorkerVerb::Complete).unwrap();
        let room = router.room(WorkerVerb::Complete).unwrap();
        assert_eq!(room.waiting(), 2);
        drop(also);
        assert_eq!(room.waiting(), 1, "a guard counts until it drops");

        let complete = room.decided().notified();
        let result = router
            .room(WorkerVerb::Result)
            .unwrap()
            .decided()
            .notified();
        tokio::pin!(complete, result);
        // An acknowledgement of a result batch makes no room for a completion.
        router.dispatch(ack("gone", 0));
        let mut complete_ack = ack("gone", 0);
        complete_ack.kind = "complete".into();
        router.dispatch(complete_ack);
        let wait = std::time::Duration::from_millis(500);
        tokio::time::timeout(wait, &mut complete)
            .await
            .expect("a completion's ack (even for an attempt no longer running) makes room");
        tokio::time::timeout(wait, &mut result)
            .await
            .expect("a result's ack makes room for a result batch");
        assert!(
            router.room(WorkerVerb::Hello).is_none(),
            "only durable verbs wait"
        );
        drop(waiting);
        assert_eq!(router.room(WorkerVerb::Complete).unwrap().waiting(), 0);
    }
}
