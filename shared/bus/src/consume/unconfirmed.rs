//! Acknowledgements the server may not have read yet, kept so that a connection lost with them
//! costs no delivery: after a reconnection they are sent again, and confirmed, before anything
//! is pulled.
//!
//! One connection carries everything in order, and the server reads it in order: once the
//! server answers a pull request (a message delivered into it, or its expiry), it has read
//! every acknowledgement written before that request. Those are forgotten; the rest are kept.
//! A link that stalls takes the ones written after the last answer with it when the client
//! gives up the connection (or the server, pinging, closes it first): without them the server
//! would deliver those messages again one ack wait later, a delivery spent each, although they
//! were decided. Sent again they change nothing where the first copy did arrive: the server
//! ignores an acknowledgement of a message it no longer holds. Only the acknowledgements that
//! end a message (`Ack`, `Term`) are kept: a lost `Nak` only brings its message back at the ack
//! wait instead of its delay, the same delivery either way.
//!
//! Not recoverable so: a message still undecided when the link resumes (waiting, being
//! decided, held) whose ack wait lapsed during the stall. The server queued it for redelivery
//! then, and an in-progress acknowledgement does not withdraw that (measured: all 20 of a batch
//! held across a 25 s stall delivered again, in-progress acknowledgements sent first or not).
//!
//! Each is sent as a request, which the server answers once it has taken it: a pull request
//! made before then could be handed the very messages they acknowledge, the server taking
//! acknowledgements and pull requests in separate queues.

use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_nats::Subject;
use async_nats::jetstream::AckKind;
use bytes::Bytes;

/// One consumer's unconfirmed acknowledgements, shared by its batches in flight.
#[derive(Debug, Default)]
pub(super) struct Unconfirmed {
    /// The number of pull requests made so far: the latest one's number.
    requests: AtomicU64,
    sent: Mutex<VecDeque<Sent>>,
}

#[derive(Debug)]
struct Sent {
    /// The latest pull request made when this was written: the server's answer to any later
    /// request proves it read this.
    after_request: u64,
    reply: Subject,
    payload: Bytes,
}

impl Unconfirmed {
    /// Numbers the pull request about to be made; call before making it.
    pub(super) fn request_made(&self) -> u64 {
        self.requests.fetch_add(1, Ordering::SeqCst) + 1
    }

    /// A delivery decided: its acknowledgement of `kind` was written to the connection (its
    /// publish returned, so it is ahead of anything published after this call), or could not
    /// be (`written` false: the server delivers it again after the ack wait).
    pub(super) fn decided(&self, reply: &Subject, kind: AckKind, written: bool) {
        if !written || !matches!(kind, AckKind::Ack | AckKind::Term) {
            return;
        }
        let after_request = self.requests.load(Ordering::SeqCst);
        self.sent.lock().expect("not poisoned").push_back(Sent {
            after_request,
            reply: reply.clone(),
            payload: kind.into(),
        });
    }

    /// The server answered pull request `request`: it read everything written before it.
    pub(super) fn answered(&self, request: u64) {
        let mut sent = self.sent.lock().expect("not poisoned");
        while sent
            .front()
            .is_some_and(|front| front.after_request < request)
        {
            sent.pop_front();
        }
    }

    /// Sends every kept acknowledgement again, on the connection just made, and waits (at most
    /// `patience`) for the server to confirm each. They stay kept until it answers a pull
    /// request made after them.
    pub(super) async fn send_again(
        &self,
        client: &async_nats::Client,
        patience: Duration,
    ) -> usize {
        let again: Vec<(Subject, Bytes)> = self
            .sent
            .lock()
            .expect("not poisoned")
            .iter()
            .map(|sent| (sent.reply.clone(), sent.payload.clone()))
            .collect();
        let confirmed = futures::future::join_all(
            again
                .iter()
                .map(|(reply, payload)| client.request(reply.clone(), payload.clone())),
        );
        if tokio::time::timeout(patience, confirmed).await.is_err() {
            tracing::debug!(
                sent_again = again.len(),
                "not every acknowledgement sent again was confirmed in time"
            );
        }
        let latest = self.requests.load(Ordering::SeqCst);
        for sent in self.sent.lock().expect("not poisoned").iter_mut() {
            sent.after_request = sent.after_request.max(latest);
        }
        again.len()
    }

    #[cfg(test)]
    fn kept(&self) -> usize {
        self.sent.lock().expect("not poisoned").len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_confirms_only_what_was_written_before_its_request() {
        let unconfirmed = Unconfirmed::default();
        let first = unconfirmed.request_made();
        unconfirmed.decided(&"a".into(), AckKind::Ack, true);
        unconfirmed.decided(&"b".into(), AckKind::Term, true);
        // Not kept: a lost `Nak` costs no delivery, and one never written is not confirmable.
        unconfirmed.decided(&"c".into(), AckKind::Nak(None), true);
        unconfirmed.decided(&"d".into(), AckKind::Ack, false);
        assert_eq!(unconfirmed.kept(), 2);
        // An answer to the request made before them proves nothing about them.
        unconfirmed.answered(first);
        assert_eq!(unconfirmed.kept(), 2);
        let second = unconfirmed.request_made();
        unconfirmed.decided(&"e".into(), AckKind::Ack, true);
        unconfirmed.answered(second);
        assert_eq!(
            unconfirmed.kept(),
            1,
            "only the one written after the second request"
        );
    }
}
