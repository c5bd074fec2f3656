//! A tenant's events read back from the events stream (`<PREFIX>_EVENTS`) for the `events`
//! verb, so that a client follows its scans without any JetStream right of its own.
//!
//! A page is first read in one round trip: a batched direct get (`$JS.API.DIRECT.GET.<stream>`
//! with `seq`, `next_by_subj` = `<prefix>.v1.org.<organization_id>.event.>` and `batch`, NATS
//! 2.11 and later; the stream allows direct gets). Any replica may answer it, and a replica
//! applies the stream in order, so what it returns is the organization's next events with none
//! left out, and the cursor may move to the last of them. Its "nothing" is not trusted: a
//! replica that has not yet applied the newest messages would move a cursor past an event the
//! client never saw. So an empty (or failed) batch is read again message by message with the
//! stream's `MSG.GET` by subject, which the stream's leader answers, after reading the stream's
//! last sequence: that read decides where an empty page's cursor moves. On a single replica
//! both read the same store.

use std::time::Duration;

use async_nats::jetstream::stream::{self, RawMessageErrorKind};
use futures::StreamExt as _;
use messages::v1;
use uuid::Uuid;

use crate::{Bus, BusError};

/// How long a batched read waits for each of its messages before it falls back to reading
/// message by message. A server answers it in milliseconds; what never answers is a request
/// the server refused (credentials issued before ingestion could publish direct gets).
const BATCH_READ_TIMEOUT: Duration = Duration::from_secs(1);

/// How long reads go message by message after a batched read failed, before one is tried
/// again: a refused or unanswered batch costs [`BATCH_READ_TIMEOUT`] once a minute, not once
/// a page.
const BATCH_PAUSE: Duration = Duration::from_secs(60);

/// Until when a [`Bus`]'s batched reads are paused; shared by its clones.
#[derive(Clone, Default)]
pub(crate) struct BatchPause(std::sync::Arc<std::sync::Mutex<Option<std::time::Instant>>>);

impl BatchPause {
    fn paused(&self) -> bool {
        let until = *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        until.is_some_and(|until| std::time::Instant::now() < until)
    }

    fn pause(&self) {
        *self
            .0
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner()) =
            Some(std::time::Instant::now() + BATCH_PAUSE);
    }
}

/// One read of an organization's events: what follows the cursor, oldest first.
#[derive(Debug, Clone, PartialEq)]
pub struct EventsPage {
    pub events: Vec<v1::TenantEvent>,
    /// Where the next read resumes: the last event's sequence, or, when the page is empty, the
    /// larger of the cursor read from and the stream's last sequence read before the scan
    /// (nothing of the organization lies between them).
    pub cursor: u64,
}

/// What one page may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageBounds {
    /// At least 1.
    pub events_max: usize,
    /// Payload bytes; the first event is returned whatever its size.
    pub bytes_max: usize,
}

impl Bus {
    /// The events stream's last sequence now: a client that starts from here reads only the
    /// events that follow.
    pub async fn events_last_sequence(&self) -> Result<u64, BusError> {
        Ok(self
            .events_stream()
            .await?
            .cached_info()
            .state
            .last_sequence)
    }

    /// The events of `organization_id` with a sequence above `after_sequence`, in sequence
    /// order, as many as `bounds` allow. A cursor older than the stream's first retained
    /// message continues from that message (older events aged out).
    pub async fn tenant_events_page(
        &self,
        organization_id: &Uuid,
        after_sequence: u64,
        bounds: PageBounds,
    ) -> Result<EventsPage, BusError> {
        assert!(bounds.events_max > 0, "a page holds at least one event");
        let filter = self.subjects.tenant_events(organization_id);
        if !self.events_batch_paused.paused() {
            match self.events_batch(&filter, after_sequence, bounds).await {
                Ok(events) if !events.is_empty() => {
                    let cursor = events.last().map_or(after_sequence, |event| event.sequence);
                    return Ok(EventsPage { events, cursor });
                }
                Ok(_) => {}
                Err(error) => {
                    self.events_batch_paused.pause();
                    tracing::warn!(%error, pause_seconds = BATCH_PAUSE.as_secs(), "a batched read of the events stream failed; reading message by message meanwhile (a server before 2.11, or ingestion's credentials issued before it could publish $JS.API.DIRECT.GET: issue them again)");
                }
            }
        }
        let stream = self.events_stream().await?;
        // Read before the scan: a scan that finds nothing more has then covered it.
        let last_sequence = stream.cached_info().state.last_sequence;
        let mut events: Vec<v1::TenantEvent> = Vec::new();
        let mut bytes = 0_usize;
        let mut exhausted = false;
        let mut next = after_sequence.saturating_add(1);
        while events.len() < bounds.events_max {
            let message = match stream
                .raw_message_builder()
                .sequence(next)
                .next_by_subject(filter.clone())
                .send()
                .await
            {
                Ok(message) => message,
                Err(error) if error.kind() == RawMessageErrorKind::NoMessageFound => {
                    exhausted = true;
                    break;
                }
                Err(error) => return Err(self.events_read_error(error.to_string())),
            };
            assert!(
                message.sequence >= next,
                "the stream answered sequence {} for a read from {next}",
                message.sequence
            );
            next = message.sequence.saturating_add(1);
            let Some((_, name)) = self.subjects.tenant_event_of(message.subject.as_str()) else {
                // The filter names one organization's events: nothing else can match it.
                debug_assert!(false, "{} is not a tenant event", message.subject);
                continue;
            };
            if !events.is_empty() && bytes + message.payload.len() > bounds.bytes_max {
                break;
            }
            bytes += message.payload.len();
            events.push(v1::TenantEvent {
                sequence: message.sequence,
                name: name.to_owned(),
                trace_parent: message
                    .headers
                    .get("traceparent")
                    .map(|value| value.as_str().to_owned())
                    .unwrap_or_default(),
                payload: message.payload.to_vec(),
            });
        }
        // The loop ends on a full page, a page whose bytes are spent (neither is empty), or an
        // exhausted scan.
        debug_assert!(exhausted || !events.is_empty());
        let cursor = events
            .last()
            .map_or(after_sequence.max(last_sequence), |event| event.sequence);
        Ok(EventsPage { events, cursor })
    }

    /// One batched direct get of the events matching `filter` after `after_sequence`, within
    /// `bounds`, in sequence order: a prefix of them (see the module's documentation), empty
    /// when the answering server has none, or an error when it cannot answer (a server before
    /// 2.11, a stream that does not allow direct gets yet).
    async fn events_batch(
        &self,
        filter: &str,
        after_sequence: u64,
        bounds: PageBounds,
    ) -> Result<Vec<v1::TenantEvent>, String> {
        /// The status of the message that ends a batch ("EOB").
        const END_OF_BATCH: u16 = 204;
        let client = &self.client;
        let inbox = client.new_inbox();
        let mut replies = client
            .subscribe(inbox.clone())
            .await
            .map_err(|error| error.to_string())?;
        let request = serde_json::json!({
            "seq": after_sequence.saturating_add(1),
            "next_by_subj": filter,
            "batch": bounds.events_max,
            "max_bytes": bounds.bytes_max,
        });
        client
            .publish_with_reply(
                format!("$JS.API.DIRECT.GET.{}", self.subjects.events_stream()),
                inbox,
                request.to_string().into(),
            )
            .await
            .map_err(|error| error.to_string())?;
        let mut events: Vec<v1::TenantEvent> = Vec::new();
        let mut bytes = 0_usize;
        loop {
            let message = tokio::time::timeout(BATCH_READ_TIMEOUT, replies.next())
                .await
                .map_err(|_| "no answer within the request timeout".to_owned())?
                .ok_or("the reply subscription ended")?;
            match message.status.map(|status| status.as_u16()) {
                None => {}
                Some(END_OF_BATCH) => break,
                Some(404) if events.is_empty() => break,
                Some(status) => {
                    return Err(format!(
                        "status {status} {}",
                        message.description.unwrap_or_default()
                    ));
                }
            }
            let headers = message
                .headers
                .as_ref()
                .ok_or("a batched message without headers")?;
            let header = |name: &str| headers.get(name).map(|value| value.as_str().to_owned());
            let sequence: u64 = header("Nats-Sequence")
                .and_then(|sequence| sequence.parse().ok())
                .ok_or("a batched message without its sequence")?;
            let subject = header("Nats-Subject").ok_or("a batched message without its subject")?;
            let Some((_, name)) = self.subjects.tenant_event_of(&subject) else {
                return Err(format!("{subject} is not a tenant event"));
            };
            if sequence <= events.last().map_or(after_sequence, |event| event.sequence) {
                return Err(format!("sequence {sequence} out of order"));
            }
            if !events.is_empty() && bytes + message.payload.len() > bounds.bytes_max {
                break;
            }
            bytes += message.payload.len();
            events.push(v1::TenantEvent {
                sequence,
                name: name.to_owned(),
                trace_parent: header("traceparent").unwrap_or_default(),
                payload: message.payload.to_vec(),
            });
        }
        let _ = replies.unsubscribe().await;
        Ok(events)
    }

    /// The events stream with its current info (one `STREAM.INFO`, which every service may
    /// ask).
    async fn events_stream(&self) -> Result<stream::Stream, BusError> {
        self.jetstream
            .get_stream(self.subjects.events_stream())
            .await
            .map_err(|error| self.events_read_error(error.to_string()))
    }

    fn events_read_error(&self, message: String) -> BusError {
        BusError::Read {
            stream: self.subjects.events_stream(),
            message,
        }
    }
}
