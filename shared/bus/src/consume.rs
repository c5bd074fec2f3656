//! Durable pull consumers with one acknowledgement rule for every service:
//! a handler decides, the bus acknowledges.
//!
//! - [`Decision::Ack`]: the handler's transaction committed (or nothing needed writing);
//!   acknowledged only now, after the commit (SPEC I3).
//! - [`Decision::Retry`]: something transient failed; `Nak` with a backoff that grows with
//!   the delivery count. On the last allowed delivery (or any after it) the message is
//!   recorded as dead (the handler's [`BatchHandler::dead_letter`]) and terminated instead of
//!   being lost silently. The server does not count deliveries (`max_deliver` is unlimited on
//!   the consumer): only a decision ends a message, never deliveries that lapsed undecided.
//!   A handler that panics decides the same for the message it panicked on (the batch is
//!   decided again one message at a time to find it).
//! - [`Decision::Reject`]: bad input; the handler already told the sender. `Term`.
//! - [`Decision::Hold`]: something outside the message is unavailable (PostgreSQL down, the
//!   pool exhausted): the message is kept with in-progress acknowledgements, spends no
//!   delivery, and is decided again after a backoff; while any is held the consumer's pull is
//!   closed and nothing new is fetched.
//!
//! Pull mechanics: one pull request at a time, for at most the room left in the waiting batch,
//! expiring after half the ack wait, and always read to its end (see `Pulling`): a request
//! given up while the server could still deliver into it would leave what it delivered unread
//! until the ack wait redelivers it. Every message delivered is in a batch being decided,
//! held, or waiting its turn (at most one batch waits), and all three get in-progress
//! acknowledgements every third of the ack wait, so only a crashed consumer's messages are
//! redelivered: waiting for a connection, for a hung statement or for a batch slot never spends
//! a delivery. No new request is made while a batch is full or messages are held, so the
//! pool's acquire timeout may be longer than the ack wait. A deadlock or a statement timeout is
//! a [`Decision::Retry`].
//!
//! A link that stalls (half-open: nothing answers, nothing closes, then it resumes) costs no
//! delivery either. A pull request unanswered past its expiry makes the connection silent
//! ([`Silence`]): no request is written into it until it answers a probe or a new connection
//! replaces it, because a request the server reads only when the link resumes expires only from
//! then, and would be delivered into on a connection the consumer has given up. And each
//! acknowledgement that ends a message is kept until the server answers a request made after it
//! ([`unconfirmed`]): after a reconnection the kept ones are sent again, and confirmed, before
//! anything is pulled, since the lost connection may have taken them with it (the client gave
//! it up, or the server's `ping_interval` closed it first). What no client can get back is
//! what the server wrote into the link the instant it stalled (at most one pull request's
//! worth), and a message still undecided when the link resumes whose ack wait lapsed during
//! the stall (held, or in a decision slower than it): the server queued it for redelivery
//! then. Each comes back once. Measured with a 1,000-message backlog in batches
//! of 20, before and after: a frozen server 5 s and 15 s, 0 and 20 delivered again, now 0
//! (`redelivery::a_stalled_link_costs_no_delivery`); a link stalled both ways 25 s, 20 with
//! the server's default pings and 40 with `ping_interval` 5 s, now 0 with either
//! (`redelivery::a_link_stalled_both_ways_costs_at_most_what_it_swallowed`). Requests given up
//! (`palisade_pull_requests_abandoned_total`) and acknowledgements sent again
//! (`palisade_acknowledgements_resent_total`) are counted, so what follows a stall can be
//! placed.

use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use async_nats::jetstream::{self, AckKind};
use futures::{FutureExt as _, StreamExt as _};
use tokio_util::sync::CancellationToken;

use crate::metrics::decisions;
use crate::{Bus, BusError};

mod unconfirmed;
use unconfirmed::Unconfirmed;

/// Everything about one durable consumer, spelled out.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub stream: String,
    pub durable_name: String,
    /// One subject filter (servers before 2.10 ignore `filter_subjects`).
    pub filter_subject: String,
    /// Redelivery after this long without an acknowledgement.
    pub ack_wait: Duration,
    /// Deliveries after which a message that fails for reasons of its own is recorded dead:
    /// one failing on this delivery or a later one. Counted here, never by the server, so a
    /// message leaves its stream only by a decision ([`Decision`]): deliveries that lapse
    /// undecided count towards it but never end a message.
    pub max_deliver: i64,
    /// Unacknowledged messages in flight across all replicas.
    pub max_ack_pending: i64,
    /// Messages handed to the handler at once (one transaction per batch).
    pub batch_size: usize,
    /// Batches decided at once: the next batch is fetched and decided while the previous one
    /// waits on its commit. Handlers lock in one global order, so concurrent batches wait on
    /// each other where they overlap (a deadlock is a transient failure: redelivered).
    pub batches_in_flight: usize,
    /// Nak delay after the first delivery; doubles per delivery up to `retry_delay_max`.
    pub retry_delay_base: Duration,
    pub retry_delay_max: Duration,
    /// Fault injection for tests (feature `testing`, never in a release build): when set, the
    /// consumer "crashes" after the handler returned (its transaction committed) and before any
    /// acknowledgement.
    #[cfg(feature = "testing")]
    pub crash_after_commit: Option<Arc<std::sync::atomic::AtomicBool>>,
    /// This consumer is its stream's only reader: once it exists, the stream keeps only what
    /// it has not yet acknowledged (interest retention), so a decided message leaves the
    /// stream and the stream's per-subject quotas count waiting messages
    /// ([`crate::StreamQuotas`]). Switched on after the consumer is created, never before: a
    /// stream with interest retention and no consumer would drop what is published to it.
    pub removes_decided: bool,
    /// How often such a consumer checks that its stream still keeps only undecided messages:
    /// another process's provisioning, racing the switch at start-up, may have written back
    /// the retention it read before the switch.
    pub retention_check: Duration,
}

impl ConsumerSpec {
    /// Short, so a crashed consumer's messages are redelivered within seconds: a live one
    /// keeps what it is deciding with in-progress acknowledgements every third of it.
    pub const ACK_WAIT_DEFAULT: Duration = Duration::from_secs(5);
    pub const MAX_DELIVER_DEFAULT: i64 = 10;
    pub const MAX_ACK_PENDING_DEFAULT: i64 = 20_000;
    pub const BATCH_SIZE_DEFAULT: usize = 128;
    pub const BATCHES_IN_FLIGHT_DEFAULT: usize = 4;
    pub const RETENTION_CHECK_DEFAULT: Duration = Duration::from_secs(30);

    pub fn new(stream: String, durable_name: &str, filter_subject: String) -> Self {
        Self {
            stream,
            durable_name: durable_name.to_owned(),
            filter_subject,
            ack_wait: Self::ACK_WAIT_DEFAULT,
            max_deliver: Self::MAX_DELIVER_DEFAULT,
            max_ack_pending: Self::MAX_ACK_PENDING_DEFAULT,
            batch_size: Self::BATCH_SIZE_DEFAULT,
            batches_in_flight: Self::BATCHES_IN_FLIGHT_DEFAULT,
            retry_delay_base: Duration::from_millis(500),
            retry_delay_max: Duration::from_secs(30),
            #[cfg(feature = "testing")]
            crash_after_commit: None,
            removes_decided: false,
            retention_check: Self::RETENTION_CHECK_DEFAULT,
        }
    }

    /// The nak delay after delivery number `delivered`, not jittered: JetStream spreads
    /// redeliveries by itself.
    fn retry_delay(&self, delivered: i64) -> Duration {
        messages::retry::RetryPolicy::new(self.retry_delay_base, self.retry_delay_max)
            .delay_max(u32::try_from(delivered).unwrap_or(u32::MAX))
    }
}

/// One delivered message.
#[derive(Debug)]
pub struct Delivery {
    message: jetstream::Message,
    /// 1 on first delivery.
    pub delivered: i64,
    pub stream_sequence: u64,
    /// This message's `process` span, a child of the context in its headers; handlers run
    /// their per-message work in it and record `palisade.scan_id`/`palisade.task_id`.
    span: tracing::Span,
}

impl Delivery {
    pub fn subject(&self) -> &str {
        self.message.subject.as_str()
    }

    pub fn payload(&self) -> &[u8] {
        &self.message.payload
    }

    pub fn headers(&self) -> Option<&async_nats::HeaderMap> {
        self.message.headers.as_ref()
    }

    pub fn span(&self) -> &tracing::Span {
        &self.span
    }

    pub fn is_redelivery(&self) -> bool {
        self.delivered > 1
    }
}

/// What to do with one delivery once the handler is done.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Decided, and the decision committed.
    Ack,
    /// Could not be decided for a reason that may be the message's own (a bug, a row the
    /// schema refuses): redelivered later, spending one of its `max_deliver` deliveries, and
    /// recorded dead after the last.
    Retry { reason: String },
    /// Refused for its own reasons, and the refusal recorded (an event, a reply): terminated.
    Reject { reason: String },
    /// Could not be decided because something outside the message is unavailable (PostgreSQL
    /// unreachable, the pool exhausted, NATS refusing a publish): nothing is wrong with it,
    /// so it must not spend its deliveries. The consumer holds it, keeping it its own with
    /// in-progress acknowledgements, fetches nothing new while it holds any, and decides it
    /// again after a backoff, for as long as that takes.
    Hold { reason: String },
}

/// A service's message handler.
pub trait BatchHandler: Send + Sync + 'static {
    /// Handles a batch; returns one decision per delivery, in order.
    fn handle(&self, batch: &[Delivery]) -> impl Future<Output = Vec<Decision>> + Send;

    /// Records a message that failed `max_deliver` times for reasons of its own. It is
    /// terminated only once this returns `Ok`; an `Err` (the record could not be written) holds
    /// it like [`Decision::Hold`].
    fn dead_letter(
        &self,
        delivery: &Delivery,
        reason: &str,
    ) -> impl Future<Output = Result<(), String>> + Send {
        tracing::error!(
            subject = delivery.subject(),
            stream_sequence = delivery.stream_sequence,
            delivered = delivery.delivered,
            reason,
            "message dead after its last delivery"
        );
        async { Ok(()) }
    }
}

/// How long one pull request lasts on the server: less than the ack wait, so that a consumer
/// that stops asking (while it holds messages it cannot decide) has read its last request to
/// its end, and taken in what it delivered, well before anything it holds could lapse.
fn pull_expires(spec: &ConsumerSpec) -> Duration {
    (spec.ack_wait / 2).clamp(Duration::from_millis(500), Duration::from_secs(10))
}

/// How long past its expiry a pull request may go unended (the server's timeout status not
/// come) before the consumer takes it as lost, as when its server restarted or the consumer's
/// leader moved, and asks again.
fn pull_grace(spec: &ConsumerSpec) -> Duration {
    (pull_expires(spec) / 2).min(Duration::from_secs(1))
}

/// How often an idle consumer looks whether its connection was re-established (it also looks
/// before anything it does with the server). A pull request made on the lost connection may
/// have been lost with it (its server gone, its subscription to be made again), and nothing
/// would arrive until it is taken as lost: so every reconnection sends the unconfirmed
/// acknowledgements again and makes a fresh request at once.
const RECONNECT_CHECK: Duration = Duration::from_millis(250);

/// How soon a switch to interest retention that failed at start is tried again.
const RETENTION_RETRY: Duration = Duration::from_secs(2);

/// A consumer's open pull request, read in chunks of up to its batch size; it ends once it
/// has delivered what it asked for or the server says it expired.
type Pull = futures::stream::ReadyChunks<pull::Batch>;

/// Whether the silent connection answered its probe; never, when it is not silent.
async fn silence_ended(silence: &mut Option<Silence>) -> bool {
    match silence {
        Some(silence) => (&mut silence.probe).await.unwrap_or(false),
        None => std::future::pending().await,
    }
}

/// The next chunk of the open pull request (none once it ended); never, when none is open.
async fn next_chunk(
    pull: &mut Option<Pull>,
) -> Option<Vec<Result<jetstream::Message, async_nats::Error>>> {
    match pull {
        Some(pull) => pull.next().await,
        None => std::future::pending().await,
    }
}

/// Switches `stream` to interest retention (see [`ConsumerSpec::removes_decided`]); nothing
/// to do when it already is.
async fn keep_only_undecided(bus: &Bus, stream: &str) -> Result<(), String> {
    let mut config = bus
        .jetstream()
        .get_stream(stream)
        .await
        .map_err(|error| format!("stream {stream}: {error}"))?
        .cached_info()
        .config
        .clone();
    if config.retention == jetstream::stream::RetentionPolicy::Interest {
        return Ok(());
    }
    config.retention = jetstream::stream::RetentionPolicy::Interest;
    bus.jetstream()
        .update_stream(&config)
        .await
        .map(|_| {
            tracing::info!(
                stream,
                "the stream now keeps only undecided messages (interest retention)"
            )
        })
        .map_err(|error| format!("switching stream {stream} to interest retention: {error}"))
}

/// Creates the consumer if needed and runs it until `shutdown`.
pub async fn run<H: BatchHandler>(
    bus: &Bus,
    spec: ConsumerSpec,
    handler: Arc<H>,
    shutdown: CancellationToken,
) -> Result<(), BusError> {
    let consumer = create(bus, &spec).await?;
    // A switch that fails (a stream whose Raft group has just formed may not answer in time)
    // does not stop the consumer: the stream keeps more than it needs until the next check,
    // which comes soon.
    let mut retention_switched = true;
    if spec.removes_decided
        && let Err(error) = keep_only_undecided(bus, &spec.stream).await
    {
        tracing::warn!(consumer = %spec.durable_name, %error, "switching the stream to interest retention failed; trying again shortly");
        retention_switched = false;
    }
    let unconfirmed = Unconfirmed::default();
    let mut pulling = Pulling {
        bus,
        spec: &spec,
        consumer,
        pull: None,
        pull_number: 0,
        connects_seen: bus.client().statistics().connects.load(Ordering::Relaxed),
        pull_lost_at: tokio::time::Instant::now(),
        silence: None,
        waiting: Vec::new(),
        unconfirmed: &unconfirmed,
    };
    crate::metrics::register_consumer(&spec.durable_name);
    let holding = Holding::new(&spec.durable_name);
    pulling
        .run(handler, &holding, &shutdown, retention_switched)
        .await
}

/// Creates the durable consumer `spec` describes, or finds it.
async fn create(
    bus: &Bus,
    spec: &ConsumerSpec,
) -> Result<jetstream::consumer::PullConsumer, BusError> {
    let stream = bus
        .jetstream()
        .get_stream(&spec.stream)
        .await
        .map_err(|error| {
            spec.error(format!(
                "stream {} missing ({error}); run provisioning first",
                spec.stream
            ))
        })?;
    let config = pull::Config {
        durable_name: Some(spec.durable_name.clone()),
        filter_subject: spec.filter_subject.clone(),
        ack_policy: AckPolicy::Explicit,
        ack_wait: spec.ack_wait,
        // Unlimited: palisade counts deliveries itself (`ConsumerSpec::max_deliver`). A server
        // that counted them would stop delivering a message whose deliveries all lapsed
        // undecided (a consumer crashed, frozen or cut off past the ack wait, a delivery lost
        // with a dropped pull) and leave it in the stream with no consumer ever seeing a last
        // delivery to record dead: a confirmed message lost silently.
        max_deliver: -1,
        max_ack_pending: spec.max_ack_pending,
        ..Default::default()
    };
    stream
        .create_consumer(config)
        .await
        .map_err(|error| spec.error(error.to_string()))
}

impl ConsumerSpec {
    fn error(&self, message: String) -> BusError {
        BusError::Consume {
            consumer: self.durable_name.clone(),
            message,
        }
    }
}

/// One consumer's fetching: its open pull request, and the deliveries no batch has taken yet.
///
/// Every message the server delivered is either in a batch being decided, held, or waiting
/// here, and each of those is kept with in-progress acknowledgements: a delivery is spent
/// only by a decision (or a crash), never by waiting its turn. A pull request asks for at most
/// the room left in the waiting batch and is read to its end (what it asked for delivered, or
/// the server's word that it expired, within half the ack wait), so nothing the server
/// delivers sits unread in the client until it is redelivered. A new one is made only while
/// the waiting batch has room and nothing is held: with every batch in flight stuck (as when
/// PostgreSQL hangs), the consumer stops fetching once one batch waits, whatever the pool's
/// acquire timeout.
struct Pulling<'a> {
    bus: &'a Bus,
    spec: &'a ConsumerSpec,
    consumer: jetstream::consumer::PullConsumer,
    pull: Option<Pull>,
    /// The open pull request's number ([`Unconfirmed::request_made`]).
    pull_number: u64,
    /// When the open pull request is taken as lost if it has not ended.
    pull_lost_at: tokio::time::Instant,
    /// Connections made by the client so far, as last seen here.
    connects_seen: u64,
    /// Set while the connection has not answered since a pull request went unanswered past
    /// its expiry (see [`Silence`]): no request is made into it meanwhile.
    silence: Option<Silence>,
    waiting: Vec<Delivery>,
    unconfirmed: &'a Unconfirmed,
}

/// A connection that left a pull request unanswered past its expiry: it may be stalled (a
/// half-open link, a frozen server), and a pull request written into it now would reach the
/// server whenever the link resumes, expiring only from then, to be delivered into on a
/// connection the client has given up meanwhile: a delivery spent for every message. So none
/// is made until the connection answers a probe (a round trip: the request was lost some
/// other way, as when the consumer's leader moved) or is replaced by a new one.
struct Silence {
    probe: tokio::task::JoinHandle<bool>,
}

impl Drop for Silence {
    fn drop(&mut self) {
        self.probe.abort();
    }
}

impl Silence {
    /// A probe of the connection: asks the server for the consumer's state, and says whether
    /// it answered (anything, an error included) within `patience`.
    fn probe(consumer: &jetstream::consumer::PullConsumer, patience: Duration) -> Self {
        let consumer = consumer.clone();
        Self {
            probe: tokio::spawn(async move {
                use jetstream::context::ConsumerInfoErrorKind as Kind;
                match tokio::time::timeout(patience, consumer.get_info()).await {
                    Ok(Ok(_)) => true,
                    Ok(Err(error)) => !matches!(error.kind(), Kind::TimedOut | Kind::Request),
                    Err(_) => false,
                }
            }),
        }
    }
}

impl Pulling<'_> {
    /// A pull request for the room left in the waiting batch.
    async fn open(&mut self) -> Result<Pull, BusError> {
        self.pull_number = self.unconfirmed.request_made();
        self.consumer
            .batch()
            .max_messages(self.spec.batch_size - self.waiting.len())
            .expires(pull_expires(self.spec))
            .messages()
            .await
            .map(|messages| messages.ready_chunks(self.spec.batch_size))
            .map_err(|error| self.spec.error(error.to_string()))
    }

    /// The longest-waiting deliveries, up to a batch; none when nothing waits.
    fn next_batch(&mut self) -> Option<Vec<Delivery>> {
        let count = self.waiting.len().min(self.spec.batch_size);
        (count > 0).then(|| self.waiting.drain(..count).collect())
    }

    fn waiting_full(&self) -> bool {
        self.waiting.len() >= self.spec.batch_size
    }

    async fn run<H: BatchHandler>(
        &mut self,
        handler: Arc<H>,
        holding: &Holding,
        shutdown: &CancellationToken,
        retention_switched: bool,
    ) -> Result<(), BusError> {
        let spec = self.spec;
        let mut reconnect_check = interval(RECONNECT_CHECK, RECONNECT_CHECK);
        let first_retention_check = if retention_switched {
            spec.retention_check
        } else {
            spec.retention_check.min(RETENTION_RETRY)
        };
        let mut retention_check = interval(first_retention_check, spec.retention_check);
        let beat = in_progress_interval(spec);
        let mut waiting_beat = interval(beat, beat);
        let mut in_flight = futures::stream::FuturesUnordered::new();
        loop {
            // Registered before the check below, so a hold that starts after it still wakes us.
            let changed = holding.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            while in_flight.len() < spec.batches_in_flight.max(1)
                && let Some(batch) = self.next_batch()
            {
                let handler = handler.clone();
                let unconfirmed = self.unconfirmed;
                in_flight.push(telemetry::cost::inherit(async move {
                    let handler = handler.as_ref();
                    decide_and_acknowledge(spec, handler, batch, holding, unconfirmed, shutdown)
                        .await
                }));
            }
            self.follow_reconnection().await;
            self.open_if_due(holding).await?;
            let chunk = tokio::select! {
                () = shutdown.cancelled() => {
                    // Batches being decided finish and are acknowledged; nothing new is
                    // fetched, and what waits is redelivered after the ack wait.
                    while let Some(finished) = in_flight.next().await {
                        finished?;
                    }
                    return Ok(());
                }
                Some(finished) = in_flight.next(), if !in_flight.is_empty() => {
                    finished?;
                    continue;
                }
                () = &mut changed => continue,
                _ = waiting_beat.tick(), if !self.waiting.is_empty() => {
                    in_progress(&self.waiting).await;
                    continue;
                }
                _ = retention_check.tick(), if spec.removes_decided => {
                    self.check_retention().await;
                    continue;
                }
                _ = reconnect_check.tick() => continue,
                () = tokio::time::sleep_until(self.pull_lost_at), if self.pull.is_some() => {
                    self.pull_lost();
                    continue;
                }
                answered = silence_ended(&mut self.silence) => {
                    self.probed(answered).await;
                    continue;
                }
                chunk = next_chunk(&mut self.pull) => chunk,
            };
            self.take(chunk).await;
        }
    }

    /// The silent connection's probe ended, answered or not.
    async fn probed(&mut self, answered: bool) {
        // An answer that came on a new connection says nothing of the old one.
        if self.follow_reconnection().await {
            return;
        }
        self.silence = if answered {
            tracing::info!(consumer = %self.spec.durable_name, "the connection answers; pulling again");
            None
        } else {
            Some(Silence::probe(&self.consumer, pull_expires(self.spec)))
        };
    }

    /// Takes what the open pull request delivered (none: it ended).
    async fn take(&mut self, chunk: Option<Vec<Result<jetstream::Message, async_nats::Error>>>) {
        // Anything from the server on the open request, its end included, proves it read
        // the acknowledgements written before that request, on the same connection.
        if !self.follow_reconnection().await {
            self.unconfirmed.answered(self.pull_number);
        }
        match chunk {
            Some(chunk) => self.receive(chunk),
            None => self.pull = None,
        }
    }

    /// Opens a pull request when none is open, the waiting batch has room and nothing is held
    /// (what the server delivered but nobody decides would spend its deliveries).
    async fn open_if_due(&mut self, holding: &Holding) -> Result<(), BusError> {
        if self.pull.is_none() && self.silence.is_none() && !self.waiting_full() && !holding.any() {
            self.pull = Some(self.open().await?);
            self.pull_lost_at =
                tokio::time::Instant::now() + pull_expires(self.spec) + pull_grace(self.spec);
        }
        Ok(())
    }

    async fn check_retention(&self) {
        if let Err(error) = keep_only_undecided(self.bus, &self.spec.stream).await {
            tracing::warn!(consumer = %self.spec.durable_name, %error, "checking the stream's retention failed; trying again later");
        }
    }

    /// Gives up the open pull request, its expiry long past with no word from the server, and
    /// makes no other until the connection answers or is replaced ([`Silence`]).
    fn pull_lost(&mut self) {
        tracing::warn!(consumer = %self.spec.durable_name, "pull request not ended past its expiry; pulling again once the connection answers");
        crate::metrics::record_pull_abandoned(&self.spec.durable_name);
        self.pull = None;
        self.silence = Some(Silence::probe(&self.consumer, pull_expires(self.spec)));
    }

    /// Whether a new connection replaced the one the open pull request (if any) was made on,
    /// and if so: the request is given up, the acknowledgements the old one may have lost are
    /// sent again on the new one before any new request, and pulling resumes on it.
    async fn follow_reconnection(&mut self) -> bool {
        let connects = self
            .bus
            .client()
            .statistics()
            .connects
            .load(Ordering::Relaxed);
        if connects == self.connects_seen {
            return false;
        }
        self.connects_seen = connects;
        let consumer = &self.spec.durable_name;
        if self.pull.take().is_some() {
            crate::metrics::record_pull_abandoned(consumer);
        }
        self.silence = None;
        let again = self
            .unconfirmed
            .send_again(self.bus.client(), pull_expires(self.spec))
            .await;
        telemetry::cost::count_messages(telemetry::cost::Direction::Sent, again as u64);
        crate::metrics::record_acknowledgements_resent(consumer, again);
        tracing::info!(consumer = %consumer, acknowledgements_sent_again = again, "NATS connection re-established; pulling again");
        true
    }

    /// Adds a chunk's messages to the waiting ones.
    fn receive(&mut self, chunk: Vec<Result<jetstream::Message, async_nats::Error>>) {
        for message in chunk {
            match message {
                Ok(message) => self.waiting.push(delivery(self.bus, self.spec, message)),
                // The request ends with it (the consumer's leader moved, the consumer was
                // changed): the next one is made at once.
                Err(error) => {
                    tracing::warn!(consumer = %self.spec.durable_name, error = %error, "pull request ended with an error; pulling again");
                }
            }
        }
    }
}

/// A tick every `period`, the first after `first`, late ticks delayed rather than bunched.
fn interval(first: Duration, period: Duration) -> tokio::time::Interval {
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + first, period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    interval
}

/// A delivered message, with its `process` span.
fn delivery(bus: &Bus, spec: &ConsumerSpec, message: jetstream::Message) -> Delivery {
    let (delivered, stream_sequence) = match message.info() {
        Ok(info) => (info.delivered, info.stream_sequence),
        Err(_) => (1, 0),
    };
    let span = crate::trace::process_span(
        bus.subjects(),
        message.subject.as_str(),
        message
            .headers
            .as_ref()
            .and_then(|headers| headers.get(messages::HEADER_MSG_ID))
            .map(|value| value.as_str()),
        &spec.durable_name,
        "consumer",
        message.headers.as_ref(),
    );
    Delivery {
        message,
        delivered,
        stream_sequence,
        span,
    }
}

/// How long a consumer waits before deciding held messages again.
const HOLD_RETRY: messages::retry::RetryPolicy =
    messages::retry::RetryPolicy::new(Duration::from_millis(250), Duration::from_secs(5));

/// Messages held undecided by every consumer of this process, by consumer (the ones holding
/// none are left out): what `/readyz` reports as its `consumers` check.
pub fn held_messages() -> Vec<(String, usize)> {
    HELD.lock()
        .expect("not poisoned")
        .iter()
        .filter(|(_, held)| **held > 0)
        .map(|(consumer, held)| (consumer.clone(), *held))
        .collect()
}

static HELD: std::sync::LazyLock<std::sync::Mutex<std::collections::BTreeMap<String, usize>>> =
    std::sync::LazyLock::new(Default::default);

/// The messages a consumer holds undecided (see [`Decision::Hold`]), shared by its batches in
/// flight; mirrored on `/metrics` as `palisade_consumer_held_messages` and in
/// [`held_messages`].
struct Holding {
    consumer: String,
    held: std::sync::atomic::AtomicUsize,
    /// Woken when messages start or stop being held, so the consumer closes or reopens its
    /// pull at once.
    changed: tokio::sync::Notify,
}

impl Holding {
    fn new(consumer: &str) -> Self {
        Self {
            consumer: consumer.to_owned(),
            held: std::sync::atomic::AtomicUsize::new(0),
            changed: tokio::sync::Notify::new(),
        }
    }

    fn any(&self) -> bool {
        self.held.load(Ordering::SeqCst) > 0
    }

    fn add(&self, count: usize) {
        if count > 0 && self.held.fetch_add(count, Ordering::SeqCst) == 0 {
            self.changed.notify_waiters();
        }
        self.publish(count as i64);
    }

    fn release(&self, count: usize) {
        if count > 0 && self.held.fetch_sub(count, Ordering::SeqCst) == count {
            self.changed.notify_waiters();
        }
        self.publish(-(count as i64));
    }

    /// Mirrors a change on `/metrics` and in [`held_messages`]; a batch decided at once
    /// changes nothing and costs nothing here.
    fn publish(&self, change: i64) {
        if change == 0 {
            return;
        }
        crate::metrics::add_held(&self.consumer, change);
        let mut held = HELD.lock().expect("not poisoned");
        let entry = held.entry(self.consumer.clone()).or_default();
        *entry = entry.saturating_add_signed(change as isize);
    }
}

/// Decides one batch and acknowledges each delivery as decided; deliveries held
/// ([`Decision::Hold`], or a dead letter that could not be recorded) are decided again after a
/// backoff, kept from redelivery meanwhile by in-progress acknowledgements, until they are
/// decided or the consumer shuts down (then they are redelivered after the ack wait).
async fn decide_and_acknowledge<H: BatchHandler>(
    spec: &ConsumerSpec,
    handler: &H,
    mut batch: Vec<Delivery>,
    holding: &Holding,
    unconfirmed: &Unconfirmed,
    shutdown: &CancellationToken,
) -> Result<(), BusError> {
    telemetry::cost::count_messages(telemetry::cost::Direction::Received, batch.len() as u64);
    let mut held_rounds = 0u32;
    let mut held_count = 0;
    loop {
        let handle_started = std::time::Instant::now();
        let decisions = deciding(spec, &batch, handle_guarded(handler, &batch)).await;
        crate::metrics::observe_handler_seconds(
            &spec.durable_name,
            handle_started.elapsed().as_secs_f64(),
            batch
                .first()
                .and_then(|delivery| crate::trace::trace_id_of(delivery.span())),
        );
        assert_eq!(
            decisions.len(),
            batch.len(),
            "a handler returns one decision per delivery"
        );
        #[cfg(feature = "testing")]
        if let Some(crash) = &spec.crash_after_commit
            && crash.load(Ordering::SeqCst)
        {
            return Err(BusError::Consume {
                consumer: spec.durable_name.clone(),
                message: "injected crash after commit, before ack".into(),
            });
        }
        let mut held = Vec::new();
        let mut held_reason = None;
        for (delivery, decision) in batch.into_iter().zip(decisions) {
            if let Some(reason) = acknowledge(spec, handler, &delivery, decision, unconfirmed).await
            {
                held_reason = Some(reason);
                held.push(delivery);
            }
        }
        // The holding count follows the deliveries still held.
        holding.add(held.len());
        holding.release(held_count);
        held_count = held.len();
        let Some(reason) = held_reason else {
            if held_rounds > 0 {
                tracing::info!(consumer = %spec.durable_name, rounds = held_rounds, "held messages decided; fetching again");
            }
            return Ok(());
        };
        held_rounds += 1;
        if held_rounds == 1 {
            tracing::warn!(consumer = %spec.durable_name, held = held.len(), reason, "messages held undecided, nothing fetched until they are decided");
        }
        batch = held;
        if !keep_held(spec, &batch, HOLD_RETRY.jittered(held_rounds), shutdown).await {
            holding.release(held_count);
            return Ok(());
        }
    }
}

/// The handler's decisions for `batch`, a panic included: the batch is decided again one
/// delivery at a time, and a delivery whose handling panics alone is a [`Decision::Retry`]
/// (recorded dead on its last delivery, like any message failing for reasons of its own). So a
/// message that crashes its handler neither takes the batch's other messages with it nor
/// crashes the service on every delivery: with no delivery limit on the server (see
/// [`create`]), that would go on for ever.
async fn handle_guarded<H: BatchHandler>(handler: &H, batch: &[Delivery]) -> Vec<Decision> {
    let panic = match caught(handler, batch).await {
        Ok(decisions) => return decisions,
        Err(panic) => panic,
    };
    if let [delivery] = batch {
        return vec![panicked(delivery, panic.as_ref())];
    }
    let mut decisions = Vec::with_capacity(batch.len());
    for delivery in batch {
        let alone = std::slice::from_ref(delivery);
        decisions.push(match caught(handler, alone).await {
            Ok(mut decided) => decided.pop().expect("a handler returns one decision"),
            Err(panic) => panicked(delivery, panic.as_ref()),
        });
    }
    decisions
}

/// The handler's decisions for `batch`, or its panic (while making the future or polling it).
async fn caught<H: BatchHandler>(
    handler: &H,
    batch: &[Delivery],
) -> std::thread::Result<Vec<Decision>> {
    AssertUnwindSafe(async { handler.handle(batch).await })
        .catch_unwind()
        .await
}

/// A handler's panic on `delivery`, as the decision to try it again.
fn panicked(delivery: &Delivery, panic: &(dyn std::any::Any + Send)) -> Decision {
    let message = panic
        .downcast_ref::<&str>()
        .map(|message| (*message).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "no message".to_owned());
    tracing::error!(
        subject = delivery.subject(),
        stream_sequence = delivery.stream_sequence,
        delivered = delivery.delivered,
        panic = message,
        "the handler panicked on this message"
    );
    Decision::Retry {
        reason: format!("the handler panicked: {message}"),
    }
}

/// Runs `decide`, telling the server every third of the ack wait that `batch` is still being
/// worked on, so a decision slower than the ack wait is not redelivered to another consumer.
async fn deciding<T>(
    spec: &ConsumerSpec,
    batch: &[Delivery],
    decide: impl Future<Output = T>,
) -> T {
    let beat = in_progress_interval(spec);
    let mut ticks = tokio::time::interval_at(tokio::time::Instant::now() + beat, beat);
    tokio::pin!(decide);
    loop {
        tokio::select! {
            decided = &mut decide => return decided,
            _ = ticks.tick() => in_progress(batch).await,
        }
    }
}

fn in_progress_interval(spec: &ConsumerSpec) -> Duration {
    (spec.ack_wait / 3).max(Duration::from_millis(100))
}

async fn in_progress(deliveries: &[Delivery]) {
    for delivery in deliveries {
        telemetry::cost::count_messages(telemetry::cost::Direction::Sent, 1);
        if let Err(error) = delivery.message.ack_with(AckKind::Progress).await {
            tracing::warn!(subject = delivery.subject(), error = %telemetry::chain(&*error), "in-progress acknowledgement failed");
        }
    }
}

/// Waits `delay` while telling the server every third of the ack wait that the held
/// deliveries are still being worked on; false when the consumer is shutting down first.
async fn keep_held(
    spec: &ConsumerSpec,
    held: &[Delivery],
    delay: Duration,
    shutdown: &CancellationToken,
) -> bool {
    let beat = in_progress_interval(spec);
    let until = tokio::time::Instant::now() + delay;
    loop {
        in_progress(held).await;
        let now = tokio::time::Instant::now();
        if now >= until {
            return true;
        }
        tokio::select! {
            () = shutdown.cancelled() => return false,
            () = tokio::time::sleep((until - now).min(beat)) => {}
        }
    }
}

/// Acknowledges one delivery as decided; returns why, when it is held instead.
async fn acknowledge<H: BatchHandler>(
    spec: &ConsumerSpec,
    handler: &H,
    delivery: &Delivery,
    decision: Decision,
    unconfirmed: &Unconfirmed,
) -> Option<String> {
    let (kind, counted_as) = match decision {
        Decision::Hold { reason } => return Some(reason),
        Decision::Ack => (AckKind::Ack, decisions::ACK),
        Decision::Reject { reason } => {
            tracing::debug!(subject = delivery.subject(), reason, "message rejected");
            (AckKind::Term, decisions::REJECT)
        }
        Decision::Retry { reason } if delivery.delivered >= spec.max_deliver => {
            if let Err(error) = handler.dead_letter(delivery, &reason).await {
                return Some(format!("its dead letter could not be recorded: {error}"));
            }
            telemetry::record_error(delivery.span(), decisions::DEAD, &reason);
            (AckKind::Term, decisions::DEAD)
        }
        Decision::Retry { reason } => {
            telemetry::record_error(delivery.span(), decisions::RETRY, &reason);
            tracing::warn!(
                subject = delivery.subject(),
                delivered = delivery.delivered,
                reason,
                "message will be redelivered"
            );
            (
                AckKind::Nak(Some(spec.retry_delay(delivery.delivered))),
                decisions::RETRY,
            )
        }
    };
    crate::metrics::record_decision(&spec.durable_name, counted_as, delivery.is_redelivery());
    telemetry::cost::count_messages(telemetry::cost::Direction::Sent, 1);
    let written = delivery.message.ack_with(kind).await;
    if let Err(error) = &written {
        // The message will be redelivered after ack_wait; handlers are idempotent.
        tracing::warn!(subject = delivery.subject(), error = %telemetry::chain(&**error), "acknowledgement failed");
    }
    if let Some(reply) = &delivery.message.reply {
        unconfirmed.decided(reply, kind, written.is_ok());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_grows_and_is_capped() {
        let spec = ConsumerSpec::new("S".into(), "c", "s".into());
        assert_eq!(spec.retry_delay(1), Duration::from_millis(500));
        assert_eq!(spec.retry_delay(2), Duration::from_secs(1));
        assert_eq!(spec.retry_delay(100), Duration::from_secs(30));
    }
}
