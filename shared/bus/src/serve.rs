//! Core-NATS request/reply serving: every request runs in its own task (long-polls must not
//! block others, and it works in the lane of the server), with a bound on how many run at
//! once. Each server counts its requests by outcome and observes how long they took, less
//! the time a handler spent in a long-poll wait ([`long_poll`]): an idle acquire's wait is
//! not a slow request.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use telemetry::cost::{Direction, count_messages};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::metrics::request_outcomes;
use crate::{Bus, BusError};

/// Requests handled at once per subscription; beyond it, requests wait in the subscription.
pub const IN_FLIGHT_MAX: usize = 4_096;

tokio::task_local! {
    /// The long-poll waits of the request this task serves, so far.
    static LONG_POLLED: std::cell::Cell<std::time::Duration>;
}

/// Runs `wait`, a handler's long-poll wait for something to answer (dispatch's acquire
/// waiting for a task), and leaves its time out of the request's `palisade_request_seconds`.
pub async fn long_poll<F: Future>(wait: F) -> F::Output {
    let started = std::time::Instant::now();
    let output = wait.await;
    let _ = LONG_POLLED.try_with(|waited| waited.set(waited.get() + started.elapsed()));
    output
}

/// Answers requests on `subject` (queue group `queue_group`, so replicas share them) with
/// `handler`, until `shutdown`. A handler returning `None` sends no reply. `server` names
/// this server in the request metrics (a constant such as `dispatch.acquire`, never an id).
pub async fn serve<F, Fut>(
    bus: &Bus,
    server: &'static str,
    subject: String,
    queue_group: &str,
    handler: F,
    shutdown: CancellationToken,
) -> Result<(), BusError>
where
    F: Fn(async_nats::Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<Bytes>> + Send + 'static,
{
    let subscription = subscribe(bus, subject, queue_group).await?;
    serve_subscribed(bus, server, subscription, queue_group, handler, shutdown).await
}

/// The subscription [`serve_subscribed`] answers on: taken first by a server that must know
/// it is in place before it says it serves (dispatch's `dispatch.ready`).
pub async fn subscribe(
    bus: &Bus,
    subject: String,
    queue_group: &str,
) -> Result<async_nats::Subscriber, BusError> {
    bus.client()
        .queue_subscribe(subject.clone(), queue_group.to_owned())
        .await
        .map_err(|error| BusError::Subscribe {
            subject,
            message: error.to_string(),
        })
}

/// [`serve`] on a subscription already taken with [`subscribe`].
pub async fn serve_subscribed<F, Fut>(
    bus: &Bus,
    server: &'static str,
    mut subscription: async_nats::Subscriber,
    queue_group: &str,
    handler: F,
    shutdown: CancellationToken,
) -> Result<(), BusError>
where
    F: Fn(async_nats::Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<Bytes>> + Send + 'static,
{
    crate::metrics::register_server(server);
    let permits = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    let mut refusal_logged = false;
    let handler = Arc::new(handler);
    loop {
        let message = tokio::select! {
            () = shutdown.cancelled() => break,
            message = subscription.next() => message,
        };
        let Some(message) = message else { break };
        count_messages(Direction::Received, 1);
        let received = std::time::Instant::now();
        if let Some(reply) = &message.reply
            && !bus.subjects().may_answer(&message.subject, reply)
        {
            // Not even handled: an acquire answered nowhere would hold a lease for nothing.
            if !refusal_logged {
                tracing::warn!(
                    server,
                    subject = %message.subject,
                    reply = %reply,
                    "a request's reply subject is not its requester's own inbox: not handled, not answered; further ones are only counted (palisade_requests_total{{outcome=\"refused_reply\"}})"
                );
                refusal_logged = true;
            }
            let seconds = received.elapsed().as_secs_f64();
            crate::metrics::record_request(server, request_outcomes::REFUSED_REPLY, seconds, None);
            continue;
        }
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore is never closed");
        let handler = handler.clone();
        let client = bus.client().clone();
        let span = crate::trace::process_span(
            bus.subjects(),
            message.subject.as_str(),
            None,
            queue_group,
            "server",
            message.headers.as_ref(),
        );
        let trace_id = crate::trace::trace_id_of(&span);
        tokio::spawn(telemetry::cost::inherit(async move {
            let (outcome, waited) = LONG_POLLED
                .scope(std::cell::Cell::default(), async {
                    let outcome = handle_one(&client, handler.as_ref(), message, span).await;
                    (outcome, LONG_POLLED.with(std::cell::Cell::get))
                })
                .await;
            let seconds = received.elapsed().saturating_sub(waited).as_secs_f64();
            crate::metrics::record_request(server, outcome, seconds, trace_id);
            drop(permit);
        }));
    }
    let _ = subscription.unsubscribe().await;
    Ok(())
}

/// Runs `handler` on one request in its `process` span and publishes its reply, if it has
/// one and the request has a reply subject. Returns the request's outcome for the metrics.
async fn handle_one<F, Fut>(
    client: &async_nats::Client,
    handler: &F,
    message: async_nats::Message,
    span: tracing::Span,
) -> &'static str
where
    F: Fn(async_nats::Message) -> Fut,
    Fut: Future<Output = Option<Bytes>>,
{
    let reply_to = message.reply.clone();
    let reply = handler(message).instrument(span).await;
    match (reply_to, reply) {
        (Some(reply_to), Some(reply)) => {
            count_messages(Direction::Sent, 1);
            match client.publish(reply_to, reply).await {
                Ok(()) => request_outcomes::REPLIED,
                Err(error) => {
                    tracing::warn!(error = %telemetry::chain(&error), "reply failed; the requester will retry");
                    request_outcomes::REPLY_FAILED
                }
            }
        }
        _ => request_outcomes::UNANSWERED,
    }
}
