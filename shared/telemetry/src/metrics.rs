//! The process-wide Prometheus registry: every crate that updates a metric registers its
//! families here (`bus::metrics` the message path, `runtime::metrics` the database gauges,
//! enrichment and the reaper their own; this crate the cost counters of [`crate::cost`]), and
//! `runtime` serves it on `GET /metrics`.
//!
//! Every label value comes from a bounded set (consumer names, decisions, error codes, lanes,
//! states): never an id.

use std::sync::{LazyLock, Mutex, MutexGuard};

use prometheus_client::registry::Registry;

pub use prometheus_client;

/// Every metric name starts with this and an underscore.
pub const PREFIX: &str = "palisade";

static REGISTRY: LazyLock<Mutex<Registry>> = LazyLock::new(|| {
    let mut registry = Registry::with_prefix(PREFIX);
    let cost = crate::cost::metrics();
    registry.register(
        "db_statements",
        "PostgreSQL statements sent (COMMIT included; sqlx does not report BEGIN), by lane",
        cost.statements.clone(),
    );
    registry.register(
        "db_commits",
        "PostgreSQL transactions committed (statements that were a COMMIT), by lane",
        cost.commits.clone(),
    );
    registry.register(
        "nats_messages",
        "NATS messages sent and received (acknowledgements, replies and PubAcks included), by lane",
        cost.messages.clone(),
    );
    Mutex::new(registry)
});

/// The registry, to register a family in (once per process) or to encode.
pub fn registry() -> MutexGuard<'static, Registry> {
    REGISTRY.lock().expect("metrics registry not poisoned")
}

/// The whole registry in the OpenMetrics text format.
pub fn encode_text() -> String {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry())
        .expect("writing to a String cannot fail");
    text
}
