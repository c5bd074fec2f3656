//! A tenant's events over the bus (issue 23): `EventsRequest` on
//! `<prefix>.v1.org.<organization_id>.client.<client_id>.events` (request/reply, queue group
//! `ingestion`) answers the organization's `scan.*` and `enrichment.*` events after the
//! client's cursor, read from the events stream (`bus::events`), so a client follows its scans
//! without creating consumers or holding any JetStream right.
//!
//! When nothing follows the cursor the request waits, up to its `wait_ms`, for the
//! organization's next event. [`Waiters`] is woken by ingestion's core-NATS subscription to
//! `<prefix>.v1.org.*.event.>` (the outbox relays publish there); a wake-up is only a hint to
//! read again, and a read every [`RECHECK_INTERVAL`] is the fallback for a lost one (or one
//! heard before the stream stored its event). It decides nothing. How many requests wait is
//! `palisade_events_requests_waiting`; how many found their events only by the recheck,
//! `palisade_events_found_by_recheck_total`.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use bus::Bus;
use bus::events::{EventsPage, PageBounds};
use messages::limits::{
    EVENTS_PER_REPLY_DEFAULT, EVENTS_PER_REPLY_MAX, EVENTS_REPLY_BYTES_MAX, EVENTS_WAIT_MS_MAX,
};
use messages::validate::{client_subject, invalid, malformed, schema_version};
use messages::{Subjects, v1};
use prost::Message as _;
use telemetry::metrics::prometheus_client::metrics::counter::Counter;
use telemetry::metrics::prometheus_client::metrics::gauge::Gauge;
use tokio::sync::Notify;
use uuid::Uuid;

/// The events request server's name in `palisade_requests_total`.
pub const REQUEST_SERVER: &str = "ingestion.events";

/// How often a waiting request reads again without a wake-up: the fallback for a lost hint.
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

/// The requests of this process waiting for their organization's next event: a read found
/// nothing after their cursor and they wait for a wake-up or the recheck.
static WAITING: LazyLock<Gauge> = LazyLock::new(|| {
    let waiting = Gauge::default();
    telemetry::metrics::registry().register(
        "events_requests_waiting",
        "events requests (long-polls) waiting for their organization's next event",
        waiting.clone(),
    );
    waiting
});

/// The waiting requests whose events were found by the recheck, no wake-up having come: a
/// lost hint, or one heard before the stream stored its event.
static FOUND_BY_RECHECK: LazyLock<Counter> = LazyLock::new(|| {
    let found = Counter::default();
    telemetry::metrics::registry().register(
        "events_found_by_recheck",
        "events requests (long-polls) whose events were found by the periodic recheck, not \
         by a wake-up: lost or early wake-ups, each answered up to a second late",
        found.clone(),
    );
    found
});

/// Registers `palisade_events_requests_waiting` and `palisade_events_found_by_recheck_total`,
/// so they are exported from start-up, at 0.
pub fn register_metrics() {
    LazyLock::force(&WAITING);
    LazyLock::force(&FOUND_BY_RECHECK);
}

/// A request whose fields have their documented form.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub organization_id: Uuid,
    pub start: Start,
    /// 1..=`EVENTS_PER_REPLY_MAX`.
    pub events_max: u32,
    /// At most `EVENTS_WAIT_MS_MAX`.
    pub wait: Duration,
}

/// Where the read starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// After this stream sequence.
    After(u64),
    /// At the stream's end: no events, only the cursor.
    Now,
}

/// Decodes and validates the request published on `subject`; the error is the answer.
pub fn parse(subjects: &Subjects, subject: &str, bytes: &[u8]) -> Result<Request, v1::Error> {
    let request =
        v1::EventsRequest::decode(bytes).map_err(|error| malformed("EventsRequest", error))?;
    schema_version(request.schema_version)?;
    let organization_id = Uuid::parse_str(&request.organization_id).map_err(|_| {
        invalid(format!(
            "organization_id {:?} is not a UUID",
            request.organization_id
        ))
    })?;
    client_subject(subjects, subject, &organization_id, &request.client_id)?;
    let events_max = match request.max_events {
        0 => EVENTS_PER_REPLY_DEFAULT,
        max if max <= EVENTS_PER_REPLY_MAX => max,
        _ => {
            return Err(invalid(format!(
                "max_events must be 1..={EVENTS_PER_REPLY_MAX} (0 for {EVENTS_PER_REPLY_DEFAULT})"
            )));
        }
    };
    Ok(Request {
        organization_id,
        start: if request.from_now {
            Start::Now
        } else {
            Start::After(request.after_sequence)
        },
        events_max,
        wait: Duration::from_millis(u64::from(request.wait_ms.min(EVENTS_WAIT_MS_MAX))),
    })
}

/// Each organization's waiting requests: their ids and wake-ups.
type ByOrganization = HashMap<Uuid, Vec<(u64, Arc<Notify>)>>;

/// The waiting `events` requests of this replica, by organization.
#[derive(Default)]
pub struct Waiters {
    by_organization: Mutex<ByOrganization>,
    next_id: std::sync::atomic::AtomicU64,
}

/// One request's place among the waiters; leaves when dropped.
pub struct Waiter<'w> {
    waiters: &'w Waiters,
    organization_id: Uuid,
    id: u64,
    wake: Arc<Notify>,
}

impl Waiters {
    /// Waits for events of `organization_id` from now on.
    pub fn join(&self, organization_id: Uuid) -> Waiter<'_> {
        let id = self
            .next_id
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let wake = Arc::new(Notify::new());
        self.lock()
            .entry(organization_id)
            .or_default()
            .push((id, wake.clone()));
        Waiter {
            waiters: self,
            organization_id,
            id,
            wake,
        }
    }

    /// An event was published on `subject`: wakes the waiters of its organization. Anything
    /// but a tenant event of this installation wakes nobody.
    pub fn event_published(&self, subjects: &Subjects, subject: &str) {
        let Some(organization_id) = subjects
            .tenant_event_of(subject)
            .and_then(|(organization_id, _)| Uuid::parse_str(organization_id).ok())
        else {
            return;
        };
        if let Some(waiting) = self.lock().get(&organization_id) {
            for (_, wake) in waiting {
                wake.notify_one();
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, ByOrganization> {
        self.by_organization
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl Waiter<'_> {
    /// Resolves when an event of the organization was published (at once if one was since the
    /// waiter joined or last woke).
    pub async fn woken(&self) {
        self.wake.notified().await;
    }
}

impl Drop for Waiter<'_> {
    fn drop(&mut self) {
        let mut by_organization = self.waiters.lock();
        if let Some(waiting) = by_organization.get_mut(&self.organization_id) {
            waiting.retain(|(id, _)| *id != self.id);
            if waiting.is_empty() {
                by_organization.remove(&self.organization_id);
            }
        }
    }
}

fn refuse(error: v1::Error) -> v1::EventsReply {
    v1::EventsReply {
        events: Vec::new(),
        cursor: 0,
        error: Some(error),
    }
}

/// Answers one request.
pub async fn reply(bus: &Bus, waiters: &Waiters, subject: &str, payload: &[u8]) -> v1::EventsReply {
    let request = match parse(bus.subjects(), subject, payload) {
        Ok(request) => request,
        Err(error) => return refuse(error),
    };
    match read(bus, waiters, &request).await {
        Ok(page) => v1::EventsReply {
            events: page.events,
            cursor: page.cursor,
            error: None,
        },
        Err(error) => refuse(runtime::internal_error(
            "the events request",
            &telemetry::chain(&error),
            "retry the request with the same after_sequence",
        )),
    }
}

/// Reads the page the request asks for, waiting up to its `wait` while there is none.
async fn read(
    bus: &Bus,
    waiters: &Waiters,
    request: &Request,
) -> Result<EventsPage, bus::BusError> {
    let mut after_sequence = match request.start {
        Start::Now => {
            return Ok(EventsPage {
                events: Vec::new(),
                cursor: bus.events_last_sequence().await?,
            });
        }
        Start::After(sequence) => sequence,
    };
    let bounds = PageBounds {
        events_max: usize::try_from(request.events_max).expect("at most 256"),
        bytes_max: EVENTS_REPLY_BYTES_MAX,
    };
    let deadline = tokio::time::Instant::now() + request.wait;
    // Joined before the first read, so an event published between a read and the wait that
    // follows it still wakes the wait.
    let waiter = (!request.wait.is_zero()).then(|| waiters.join(request.organization_id));
    // Bounded: every round but the last waits for a wake-up or the recheck interval, and the
    // deadline ends the rounds.
    let mut rechecking = false;
    loop {
        let page = bus
            .tenant_events_page(&request.organization_id, after_sequence, bounds)
            .await?;
        let now = tokio::time::Instant::now();
        let Some(waiter) = waiter.as_ref() else {
            return Ok(page);
        };
        if !page.events.is_empty() {
            if rechecking {
                FOUND_BY_RECHECK.inc();
            }
            return Ok(page);
        }
        if now >= deadline {
            return Ok(page);
        }
        after_sequence = page.cursor;
        let pause = (deadline - now).min(RECHECK_INTERVAL);
        let _waiting = Waiting::counted();
        rechecking = bus::serve::long_poll(tokio::time::timeout(pause, waiter.woken()))
            .await
            .is_err();
    }
}

/// One request counted in `palisade_events_requests_waiting` for as long as it lives, also
/// when the request is dropped mid-wait (shutdown).
struct Waiting(());

impl Waiting {
    fn counted() -> Self {
        WAITING.inc();
        Self(())
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        WAITING.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use messages::{ClientVerb, ErrorCode};

    fn subjects() -> Subjects {
        Subjects::new("p").unwrap()
    }

    fn request(organization: Uuid, client_id: &str) -> v1::EventsRequest {
        v1::EventsRequest {
            schema_version: messages::SCHEMA_VERSION,
            organization_id: organization.to_string(),
            client_id: client_id.to_owned(),
            after_sequence: 7,
            from_now: false,
            max_events: 0,
            wait_ms: 0,
        }
    }

    fn code_of(result: Result<Request, v1::Error>) -> Option<ErrorCode> {
        result.err().and_then(|error| error.error_code())
    }

    #[test]
    fn a_request_must_match_its_subject_and_its_bounds() {
        let s = subjects();
        let organization = Uuid::now_v7();
        let subject = s.client(&organization, "ci", ClientVerb::Events).unwrap();
        let parsed = parse(&s, &subject, &request(organization, "ci").encode_to_vec()).unwrap();
        assert_eq!(
            parsed,
            Request {
                organization_id: organization,
                start: Start::After(7),
                events_max: EVENTS_PER_REPLY_DEFAULT,
                wait: Duration::ZERO,
            }
        );

        assert_eq!(
            code_of(parse(&s, &subject, b"\xff\xff")),
            Some(ErrorCode::MalformedMessage)
        );
        let mut wrong = request(organization, "ci");
        wrong.schema_version = 2;
        assert_eq!(
            code_of(parse(&s, &subject, &wrong.encode_to_vec())),
            Some(ErrorCode::UnsupportedSchemaVersion)
        );
        for wrong in [
            request(Uuid::now_v7(), "ci"),
            request(organization, "other"),
            v1::EventsRequest {
                organization_id: "nope".into(),
                ..request(organization, "ci")
            },
            v1::EventsRequest {
                max_events: EVENTS_PER_REPLY_MAX + 1,
                ..request(organization, "ci")
            },
        ] {
            assert_eq!(
                code_of(parse(&s, &subject, &wrong.encode_to_vec())),
                Some(ErrorCode::InvalidField),
                "{wrong:?}"
            );
        }

        let long = v1::EventsRequest {
            from_now: true,
            max_events: EVENTS_PER_REPLY_MAX,
            wait_ms: u32::MAX,
            ..request(organization, "ci")
        };
        let parsed = parse(&s, &subject, &long.encode_to_vec()).unwrap();
        assert_eq!(parsed.start, Start::Now);
        assert_eq!(parsed.events_max, EVENTS_PER_REPLY_MAX);
        assert_eq!(
            parsed.wait,
            Duration::from_millis(u64::from(EVENTS_WAIT_MS_MAX))
        );
    }

    /// Whether the waiter holds a wake-up now. `event_published` wakes synchronously (a
    /// wake-up is a permit stored in the waiter's `Notify`), so one poll answers exactly: no
    /// timeout to outwait, and a wake-up that arrives late counts as none.
    fn was_woken(waiter: &Waiter<'_>) -> bool {
        use futures::FutureExt as _;
        waiter.woken().now_or_never().is_some()
    }

    #[test]
    fn an_event_wakes_the_waiters_of_its_organization_only() {
        let s = subjects();
        let waiters = Waiters::default();
        let organization = Uuid::now_v7();
        let other = Uuid::now_v7();
        let first = waiters.join(organization);
        let second = waiters.join(organization);
        let elsewhere = waiters.join(other);

        waiters.event_published(
            &s,
            &s.tenant_event(&organization, messages::EventKind::ScanCompleted),
        );
        assert!(was_woken(&first));
        assert!(was_woken(&second));
        assert!(!was_woken(&elsewhere));

        // The services' events and other installations' wake nobody.
        waiters.event_published(&s, &s.event(messages::EventKind::TaskReady));
        waiters.event_published(&s, &format!("q.v1.org.{other}.event.scan.failed"));
        assert!(!was_woken(&elsewhere));

        drop((first, second, elsewhere));
        assert!(waiters.lock().is_empty());
    }

    mod hostile {
        use super::*;
        use messages::testing::{cases, hostile_text, token_text, uuid_text};
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(cases(512))]

            /// Whatever the bytes and the subject, parsing never panics, refuses with the
            /// codes of reference 6.15, and accepts only a request of the subject's
            /// organization and client within the bounds.
            #[test]
            fn hostile_events_request_is_refused_with_its_code(
                bytes in proptest::collection::vec(any::<u8>(), 0..64),
                organization_id in prop_oneof![uuid_text(), token_text(), hostile_text()],
                client_id in prop_oneof![token_text(), hostile_text()],
                subject_client in token_text(),
                max_events in any::<u32>(),
                wait_ms in any::<u32>(),
                after_sequence in any::<u64>(),
                from_now in any::<bool>(),
            ) {
                let s = subjects();
                let subject_organization = Uuid::parse_str(&organization_id).unwrap_or_else(|_| Uuid::now_v7());
                let subject = s
                    .client(&subject_organization, &subject_client, ClientVerb::Events)
                    .unwrap();
                let message = v1::EventsRequest {
                    schema_version: messages::SCHEMA_VERSION,
                    organization_id: organization_id.clone(),
                    client_id: client_id.clone(),
                    after_sequence,
                    from_now,
                    max_events,
                    wait_ms,
                };
                for payload in [bytes, message.encode_to_vec()] {
                    match parse(&s, &subject, &payload) {
                        Ok(request) => {
                            prop_assert_eq!(request.organization_id, subject_organization);
                            prop_assert!((1..=EVENTS_PER_REPLY_MAX).contains(&request.events_max));
                            prop_assert!(request.wait <= Duration::from_millis(u64::from(EVENTS_WAIT_MS_MAX)));
                        }
                        Err(error) => prop_assert!(matches!(
                            error.error_code(),
                            Some(ErrorCode::MalformedMessage | ErrorCode::UnsupportedSchemaVersion | ErrorCode::InvalidField)
                        )),
                    }
                }
                let valid = Uuid::parse_str(&organization_id).is_ok()
                    && client_id == subject_client
                    && max_events <= EVENTS_PER_REPLY_MAX;
                prop_assert_eq!(parse(&s, &subject, &message.encode_to_vec()).is_ok(), valid);
            }
        }
    }
}
