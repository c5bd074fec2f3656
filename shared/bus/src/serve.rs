//! Core-NATS request/reply serving: every request runs in its own task (long-polls must not
//! block others), with a bound on how many run at once.

use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::{Bus, BusError};

/// Requests handled at once per subscription; beyond it, requests wait in the subscription.
pub const IN_FLIGHT_MAX: usize = 4_096;

/// Answers requests on `subject` (queue group `queue_group`, so replicas share them) with
/// `handler`, until `shutdown`. A handler returning `None` sends no reply.
pub async fn serve<F, Fut>(
    bus: &Bus,
    subject: String,
    queue_group: &str,
    handler: F,
    shutdown: CancellationToken,
) -> Result<(), BusError>
where
    F: Fn(async_nats::Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<Bytes>> + Send + 'static,
{
    let mut subscription = bus
        .client()
        .queue_subscribe(subject.clone(), queue_group.to_owned())
        .await
        .map_err(|error| BusError::Subscribe {
            subject: subject.clone(),
            message: error.to_string(),
        })?;
    let permits = Arc::new(Semaphore::new(IN_FLIGHT_MAX));
    let handler = Arc::new(handler);
    loop {
        let message = tokio::select! {
            () = shutdown.cancelled() => break,
            message = subscription.next() => message,
        };
        let Some(message) = message else { break };
        let permit = permits
            .clone()
            .acquire_owned()
            .await
            .expect("semaphore is never closed");
        let handler = handler.clone();
        let client = bus.client().clone();
        let span = crate::trace::process_span(
            message.subject.as_str(),
            None,
            queue_group,
            "server",
            message.headers.as_ref(),
        );
        tokio::spawn(async move {
            let reply_to = message.reply.clone();
            let reply = handler(message).instrument(span).await;
            if let (Some(reply_to), Some(reply)) = (reply_to, reply)
                && let Err(error) = client.publish(reply_to, reply).await
            {
                tracing::warn!(%error, "reply failed; the requester will retry");
            }
            drop(permit);
        });
    }
    let _ = subscription.unsubscribe().await;
    Ok(())
}
