//! A tenant's events read back from the events stream (`<PREFIX>_EVENTS`) for the `events`
//! verb, so that a client follows its scans without any JetStream right of its own.
//!
//! A page is read message by message with the stream's `MSG.GET` and `next_by_subj` =
//! `<prefix>.v1.org.<organization_id>.event.>` (a wildcard, which the server accepts there
//! from 2.9), starting after the caller's cursor. `MSG.GET` is answered by the stream's
//! leader. A direct get (`allow_direct`) may be answered by a replica that has not yet applied
//! the newest messages, and its "no message" would then move a cursor past an event the client
//! never saw. On a single replica the two read the same store.

use async_nats::jetstream::stream::{self, RawMessageErrorKind};
use messages::v1;
use uuid::Uuid;

use crate::{Bus, BusError};

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
        let stream = self.events_stream().await?;
        // Read before the scan: a scan that finds nothing more has then covered it.
        let last_sequence = stream.cached_info().state.last_sequence;
        let filter = self.subjects.tenant_events(organization_id);
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
