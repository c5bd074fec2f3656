//! The metric families the message path updates, in the process-wide registry of
//! `telemetry::metrics`: acknowledgement decisions, redeliveries and handler latency per
//! consumer, refusals by error code, requests served, NATS connection events, stream sizes,
//! and leader status.
//!
//! Every label value comes from a bounded set: durable consumer names, the four decisions,
//! the `ErrorCode` names (unknown codes become `other`), lease names. Never an id.

use std::sync::LazyLock;

use messages::ErrorCode;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::exemplar::HistogramWithExemplars;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::exponential_buckets;

/// The four ways a delivery ends at the bus, as the `decision` label.
pub mod decisions {
    pub const ACK: &str = "ack";
    pub const RETRY: &str = "retry";
    pub const REJECT: &str = "reject";
    pub const DEAD: &str = "dead";
    pub const ALL: [&str; 4] = [ACK, RETRY, REJECT, DEAD];
}

/// How a served request ended, as the `outcome` label.
pub mod request_outcomes {
    pub const REPLIED: &str = "replied";
    /// The handler chose not to answer (or the request had no reply subject).
    pub const UNANSWERED: &str = "unanswered";
    pub const REPLY_FAILED: &str = "reply_failed";
    /// Not handled and not answered: the reply subject was not the requester's own
    /// (`messages::Subjects::may_answer`).
    pub const REFUSED_REPLY: &str = "refused_reply";
    pub const ALL: [&str; 4] = [REPLIED, UNANSWERED, REPLY_FAILED, REFUSED_REPLY];
}

/// What happened to a NATS connection, as the `event` label.
pub mod connection_events {
    pub const CONNECTED: &str = "connected";
    pub const DISCONNECTED: &str = "disconnected";
    /// The server announced it is shutting down (lame duck mode).
    pub const LAME_DUCK: &str = "lame_duck";
    /// A server or client error, or a slow consumer.
    pub const ERROR: &str = "error";
    pub const ALL: [&str; 4] = [CONNECTED, DISCONNECTED, LAME_DUCK, ERROR];
}

/// The `code` label for a refusal code this build does not know.
pub const CODE_OTHER: &str = "other";

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConsumerLabels {
    pub consumer: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DecisionLabels {
    pub consumer: String,
    pub decision: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RefusalLabels {
    pub consumer: String,
    pub code: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ServerLabels {
    pub server: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    pub server: &'static str,
    pub outcome: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ConnectionEventLabels {
    pub event: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct StreamLabels {
    /// One of palisade's stream names.
    pub stream: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct LeaseLabels {
    pub lease: &'static str,
}

/// An exemplar's labels: the trace of a recent observation (OpenMetrics exemplars), so a
/// slow bucket leads to a trace that was slow.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TraceLabels {
    pub trace_id: String,
}

/// A latency histogram whose buckets each keep the trace id of their latest observation.
pub type TracedHistogram = HistogramWithExemplars<TraceLabels>;

fn handler_seconds_histogram() -> TracedHistogram {
    // 1 ms .. ~33 s.
    HistogramWithExemplars::new(exponential_buckets(0.001, 2.0, 16))
}

/// The metric families the message path updates. Cheap to clone (handles share their values).
#[derive(Debug, Clone)]
pub struct BusMetrics {
    pub messages: Family<DecisionLabels, Counter>,
    pub redeliveries: Family<ConsumerLabels, Counter>,
    pub pulls_abandoned: Family<ConsumerLabels, Counter>,
    pub acknowledgements_resent: Family<ConsumerLabels, Counter>,
    pub handler_seconds: Family<ConsumerLabels, TracedHistogram, fn() -> TracedHistogram>,
    pub refusals: Family<RefusalLabels, Counter>,
    pub leader: Family<LeaseLabels, Gauge>,
    pub requests: Family<RequestLabels, Counter>,
    pub request_seconds: Family<ServerLabels, TracedHistogram, fn() -> TracedHistogram>,
    pub held: Family<ConsumerLabels, Gauge>,
    pub connection_events: Family<ConnectionEventLabels, Counter>,
    pub stream_bytes: Family<StreamLabels, Gauge>,
    pub stream_bytes_max: Family<StreamLabels, Gauge>,
    pub stream_messages: Family<StreamLabels, Gauge>,
    pub stream_identities_at_quota: Family<StreamLabels, Gauge>,
}

/// Registered in `telemetry::metrics` on first use ([`bus_metrics`]); `runtime` uses them
/// before it serves `/metrics`, so the families are there from the first scrape.
static METRICS: LazyLock<BusMetrics> = LazyLock::new(|| {
    let mut registry = telemetry::metrics::registry();
    let bus = BusMetrics {
        messages: Family::default(),
        redeliveries: Family::default(),
        pulls_abandoned: Family::default(),
        acknowledgements_resent: Family::default(),
        handler_seconds: Family::new_with_constructor(handler_seconds_histogram),
        refusals: Family::default(),
        leader: Family::default(),
        requests: Family::default(),
        request_seconds: Family::new_with_constructor(handler_seconds_histogram),
        held: Family::default(),
        connection_events: Family::default(),
        stream_bytes: Family::default(),
        stream_bytes_max: Family::default(),
        stream_messages: Family::default(),
        stream_identities_at_quota: Family::default(),
    };
    for event in connection_events::ALL {
        let _ = bus
            .connection_events
            .get_or_create(&ConnectionEventLabels { event });
    }
    registry.register(
        "nats_connection_events",
        "What happened to this process's NATS connections: connected (first time or again), \
         disconnected (the client reconnects by itself), lame_duck, error",
        bus.connection_events.clone(),
    );
    registry.register(
        "stream_bytes",
        "Bytes one of palisade's streams holds (refreshed when /metrics is scraped)",
        bus.stream_bytes.clone(),
    );
    registry.register(
        "stream_bytes_max",
        "Bytes one of palisade's streams may hold (PALISADE_STREAM_BYTES_MAX; -1: no limit); \
         a full stream refuses new messages (the events stream drops its oldest instead)",
        bus.stream_bytes_max.clone(),
    );
    registry.register(
        "stream_messages",
        "Messages one of palisade's streams holds: on the requests and results streams, what \
         waits to be decided",
        bus.stream_messages.clone(),
    );
    registry.register(
        "stream_identities_at_quota",
        "Identities at their quota of waiting messages on one of palisade's streams (a client's \
         requests of one organization; a worker's results, completions or failures): each is \
         refused until palisade decides what waits; their subjects are logged",
        bus.stream_identities_at_quota.clone(),
    );
    registry.register(
        "consumer_held_messages",
        "Messages a durable consumer holds undecided because something outside them is \
         unavailable (PostgreSQL down, pool exhausted); while any are held it fetches nothing",
        bus.held.clone(),
    );
    registry.register(
        "messages",
        "Deliveries acknowledged by a durable consumer, by decision (ack, retry, reject, dead)",
        bus.messages.clone(),
    );
    registry.register(
        "redeliveries",
        "Deliveries seen more than once by a durable consumer",
        bus.redeliveries.clone(),
    );
    registry.register(
        "pull_requests_abandoned",
        "Pull requests a durable consumer gave up (no word past their expiry, or the connection \
         made again); after one goes unanswered it makes no other until the connection answers \
         or is replaced",
        bus.pulls_abandoned.clone(),
    );
    registry.register(
        "acknowledgements_resent",
        "Acknowledgements ending a message that a durable consumer sent again on a new \
         connection because the lost one may not have carried them (written after the server's \
         last answer): without them those messages would be delivered again",
        bus.acknowledgements_resent.clone(),
    );
    registry.register(
        "handler_seconds",
        "Time a consumer's handler took for one batch",
        bus.handler_seconds.clone(),
    );
    registry.register(
        "refusals",
        "Messages refused with an error code, by consumer and code",
        bus.refusals.clone(),
    );
    registry.register(
        "leader",
        "1 while this process holds the named leader lease, else 0",
        bus.leader.clone(),
    );
    registry.register(
        "requests",
        "Requests served over core NATS request/reply, by server and outcome",
        bus.requests.clone(),
    );
    registry.register(
        "request_seconds",
        "Time from receiving a request to sending its reply, less any long-poll wait (an acquire waiting for a task)",
        bus.request_seconds.clone(),
    );
    bus
});

/// The message-path metric families.
pub fn bus_metrics() -> &'static BusMetrics {
    &METRICS
}

/// Creates every series of `consumer` at zero (each decision, each refusal code), so the set
/// of series does not depend on which outcomes happened to occur yet.
pub fn register_consumer(consumer: &str) {
    let metrics = bus_metrics();
    for decision in decisions::ALL {
        let _ = metrics.messages.get_or_create(&DecisionLabels {
            consumer: consumer.to_owned(),
            decision,
        });
    }
    let labels = ConsumerLabels {
        consumer: consumer.to_owned(),
    };
    for code in ErrorCode::ALL
        .into_iter()
        .map(ErrorCode::as_str)
        .chain([CODE_OTHER])
    {
        let _ = metrics.refusals.get_or_create(&RefusalLabels {
            consumer: consumer.to_owned(),
            code,
        });
    }
    let _ = metrics.redeliveries.get_or_create(&labels);
    let _ = metrics.pulls_abandoned.get_or_create(&labels);
    let _ = metrics.acknowledgements_resent.get_or_create(&labels);
    let _ = metrics.handler_seconds.get_or_create(&labels);
    let _ = metrics.held.get_or_create(&labels);
}

/// Counts one acknowledgement decision.
pub fn record_decision(consumer: &str, decision: &'static str, redelivered: bool) {
    let metrics = bus_metrics();
    metrics
        .messages
        .get_or_create(&DecisionLabels {
            consumer: consumer.to_owned(),
            decision,
        })
        .inc();
    if redelivered {
        metrics
            .redeliveries
            .get_or_create(&ConsumerLabels {
                consumer: consumer.to_owned(),
            })
            .inc();
    }
}

/// Counts one pull request `consumer` gave up.
pub fn record_pull_abandoned(consumer: &str) {
    bus_metrics()
        .pulls_abandoned
        .get_or_create(&ConsumerLabels {
            consumer: consumer.to_owned(),
        })
        .inc();
}

/// Counts `count` acknowledgements `consumer` sent again after a reconnection.
pub fn record_acknowledgements_resent(consumer: &str, count: usize) {
    bus_metrics()
        .acknowledgements_resent
        .get_or_create(&ConsumerLabels {
            consumer: consumer.to_owned(),
        })
        .inc_by(count as u64);
}

/// Adds `change` (negative to release) to the messages `consumer` holds undecided.
pub fn add_held(consumer: &str, change: i64) {
    bus_metrics()
        .held
        .get_or_create(&ConsumerLabels {
            consumer: consumer.to_owned(),
        })
        .inc_by(change);
}

/// Records how long one batch took in `consumer`'s handler, with the trace of one of its
/// messages as the exemplar.
pub fn observe_handler_seconds(consumer: &str, seconds: f64, trace_id: Option<String>) {
    bus_metrics()
        .handler_seconds
        .get_or_create(&ConsumerLabels {
            consumer: consumer.to_owned(),
        })
        .observe(
            seconds,
            trace_id.map(|trace_id| TraceLabels { trace_id }),
            None,
        );
}

/// The `code` label for a wire error code: its `ErrorCode` name, or [`CODE_OTHER`].
pub fn code_label(code: &str) -> &'static str {
    ErrorCode::parse(code).map_or(CODE_OTHER, ErrorCode::as_str)
}

/// Counts one refusal by `consumer` with wire error code `code`.
pub fn record_refusal(consumer: &str, code: &str) {
    bus_metrics()
        .refusals
        .get_or_create(&RefusalLabels {
            consumer: consumer.to_owned(),
            code: code_label(code),
        })
        .inc();
}

/// Creates every series of request server `server` at zero.
pub fn register_server(server: &'static str) {
    let metrics = bus_metrics();
    for outcome in request_outcomes::ALL {
        let _ = metrics
            .requests
            .get_or_create(&RequestLabels { server, outcome });
    }
    let _ = metrics
        .request_seconds
        .get_or_create(&ServerLabels { server });
}

/// Counts one served request and how long it took.
pub fn record_request(
    server: &'static str,
    outcome: &'static str,
    seconds: f64,
    trace_id: Option<String>,
) {
    let metrics = bus_metrics();
    metrics
        .requests
        .get_or_create(&RequestLabels { server, outcome })
        .inc();
    metrics
        .request_seconds
        .get_or_create(&ServerLabels { server })
        .observe(
            seconds,
            trace_id.map(|trace_id| TraceLabels { trace_id }),
            None,
        );
}

/// Counts one event of a NATS connection (one of [`connection_events::ALL`]).
pub fn record_connection_event(event: &'static str) {
    bus_metrics()
        .connection_events
        .get_or_create(&ConnectionEventLabels { event })
        .inc();
}

/// Sets the `leader{lease}` gauge.
/// Records what one stream holds and may hold.
pub fn record_stream(stream: &str, bytes: u64, messages: u64, bytes_max: i64) {
    let metrics = bus_metrics();
    let labels = StreamLabels {
        stream: stream.to_owned(),
    };
    let gauge = |value: u64| i64::try_from(value).unwrap_or(i64::MAX);
    metrics
        .stream_bytes
        .get_or_create(&labels)
        .set(gauge(bytes));
    metrics
        .stream_messages
        .get_or_create(&labels)
        .set(gauge(messages));
    metrics
        .stream_bytes_max
        .get_or_create(&labels)
        .set(bytes_max);
}

/// Creates the gauges of `stream` at zero where they do not exist yet (the identities one
/// only for a stream with per-identity quotas), so the set of series does not depend on which
/// reads the server answered.
pub fn register_stream(stream: &str, quotas: bool) {
    let metrics = bus_metrics();
    let labels = StreamLabels {
        stream: stream.to_owned(),
    };
    let _ = metrics.stream_bytes.get_or_create(&labels);
    let _ = metrics.stream_messages.get_or_create(&labels);
    let _ = metrics.stream_bytes_max.get_or_create(&labels);
    if quotas {
        let _ = metrics.stream_identities_at_quota.get_or_create(&labels);
    }
}

/// Records how many identities are at their quota of waiting messages on a stream.
pub fn record_identities_at_quota(stream: &str, identities: usize) {
    bus_metrics()
        .stream_identities_at_quota
        .get_or_create(&StreamLabels {
            stream: stream.to_owned(),
        })
        .set(i64::try_from(identities).unwrap_or(i64::MAX));
}

pub fn set_leader(lease: &'static str, is_leader: bool) {
    bus_metrics()
        .leader
        .get_or_create(&LeaseLabels { lease })
        .set(i64::from(is_leader));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_codes_are_other_and_known_codes_keep_their_name() {
        assert_eq!(code_label("no_such_code"), CODE_OTHER);
        for code in ErrorCode::ALL {
            assert_eq!(code_label(code.as_str()), code.as_str());
        }
    }

    #[test]
    fn registered_consumer_has_every_decision_series() {
        register_consumer("unit-test-consumer");
        record_decision("unit-test-consumer", decisions::ACK, true);
        let text = telemetry::metrics::encode_text();
        for decision in decisions::ALL {
            let line = format!(
                "palisade_messages_total{{consumer=\"unit-test-consumer\",decision=\"{decision}\"}}"
            );
            assert!(text.contains(&line), "{line} missing from\n{text}");
        }
        assert!(text.contains("palisade_redeliveries_total{consumer=\"unit-test-consumer\"} 1"));
    }
}
