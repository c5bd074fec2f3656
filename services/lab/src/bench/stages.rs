//! Where a scenario's time went: each scan's pickup and stages, from the timestamps PostgreSQL
//! holds, when the events stream stored its completion, and when the benchmark sent its request
//! and saw its completion event.

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use futures::StreamExt as _;

use super::Quantiles;
use crate::harness::Harness;

/// One stage of a scan's life, over the scans of the steady scenario.
#[derive(Debug, Clone)]
pub struct Stage {
    pub name: &'static str,
    pub span: &'static str,
    pub samples: usize,
    pub ms: Quantiles,
}

/// Where a scenario's time went: pickup and the stages of its scans' lives.
#[derive(Debug, Clone, Default)]
pub struct Stages {
    /// Request to the first attempt of the first task.
    pub pickup_ms: Quantiles,
    pub stages: Vec<Stage>,
    /// Scans lacking a timestamp a stage needs.
    pub incomplete_timestamps: usize,
}

/// A scan's timestamps as PostgreSQL recorded them (`now()`: the start of the transaction
/// that wrote each).
type ScanTimes = (
    String,
    DateTime<Utc>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
    Option<DateTime<Utc>>,
);

/// The stages of a scan's life, each a name and the span it measures, in the order
/// [`stage_samples`] measures them.
const STAGES: [(&str, &str); 7] = [
    ("admission", "request sent → scans.created_at"),
    (
        "acquire",
        "scans.created_at → first attempt created_at (leased)",
    ),
    (
        "result",
        "leased → first worker_result_batches.persisted_at",
    ),
    ("completion", "first result persisted → scans.finished_at"),
    ("event", "scans.finished_at → client saw scan.completed"),
    (
        "event.publish",
        "scans.finished_at → scan.completed stored on the stream",
    ),
    (
        "event.read",
        "stored → the client's events request answered it",
    ),
];

/// Pickup and the time per stage of scenario `name`'s scans, from PostgreSQL's timestamps,
/// the time each request was sent and the time its completion event arrived.
pub(super) async fn measure(
    harness: &Harness,
    name: &str,
    requested_at: &HashMap<String, DateTime<Utc>>,
    seen_at: &HashMap<String, DateTime<Utc>>,
) -> anyhow::Result<Stages> {
    let rows = scan_times(harness, name).await?;
    let stored_at = completions_stored_at(harness, name).await?;
    let (pickup, spans, incomplete) = stage_samples(rows, requested_at, &stored_at, seen_at);
    // Requests whose scan PostgreSQL does not hold lack every timestamp.
    let missing = requested_at.len().saturating_sub(pickup.len() + incomplete);
    Ok(Stages {
        pickup_ms: Quantiles::of(&pickup),
        stages: STAGES
            .into_iter()
            .zip(spans)
            .map(|((name, span), samples)| Stage {
                name,
                span,
                samples: samples.len(),
                ms: Quantiles::of(&samples),
            })
            .collect(),
        incomplete_timestamps: incomplete + missing,
    })
}

/// The timestamps PostgreSQL holds for each of scenario `name`'s scans.
async fn scan_times(harness: &Harness, name: &str) -> anyhow::Result<Vec<ScanTimes>> {
    // There is no `leased_at`: an attempt row is created by the transaction that grants the
    // lease, so its `created_at` is the lease time.
    sqlx::query_as(
        "SELECT s.idempotency_key, s.created_at, min(a.created_at) AS leased_at,
                min(b.persisted_at) AS first_result_at, s.finished_at
           FROM scans s
           LEFT JOIN worker_tasks t ON t.scan_id = s.id
           LEFT JOIN worker_task_attempts a ON a.task_id = t.id
           LEFT JOIN worker_result_batches b ON b.task_id = t.id
          WHERE s.client_id = $1 AND s.idempotency_key LIKE $2
          GROUP BY s.id",
    )
    .bind(harness.client.client_id())
    .bind(format!("{name}-%"))
    .fetch_all(&harness.pool)
    .await
    .context("cannot read the scans' timestamps")
}

/// Each scan's pickup and its time in each of the [`STAGES`], in milliseconds, from its
/// timestamps and when its request was sent, its completion stored and seen; and how many
/// scans lacked one of those and were left out.
fn stage_samples(
    rows: Vec<ScanTimes>,
    requested_at: &HashMap<String, DateTime<Utc>>,
    stored_at: &HashMap<String, DateTime<Utc>>,
    seen_at: &HashMap<String, DateTime<Utc>>,
) -> (Vec<f64>, [Vec<f64>; STAGES.len()], usize) {
    let ms = |from: DateTime<Utc>, to: DateTime<Utc>| {
        (to - from).num_microseconds().unwrap_or(i64::MAX) as f64 / 1_000.0
    };
    let mut pickup = Vec::new();
    let mut spans: [Vec<f64>; STAGES.len()] = Default::default();
    let mut incomplete = 0;
    for (key, created_at, leased_at, first_result_at, finished_at) in rows {
        let (
            Some(requested),
            Some(leased),
            Some(first_result),
            Some(finished),
            Some(stored),
            Some(seen),
        ) = (
            requested_at.get(&key).copied(),
            leased_at,
            first_result_at,
            finished_at,
            stored_at.get(&key).copied(),
            seen_at.get(&key).copied(),
        )
        else {
            incomplete += 1;
            continue;
        };
        pickup.push(ms(requested, leased));
        for (samples, (from, to)) in spans.iter_mut().zip([
            (requested, created_at),
            (created_at, leased),
            (leased, first_result),
            (first_result, finished),
            (finished, seen),
            (finished, stored),
            (stored, seen),
        ]) {
            samples.push(ms(from, to));
        }
    }
    (pickup, spans, incomplete)
}

/// When each `scan.completed` of scenario `name` was stored on the events stream (the stream's
/// own timestamp), by idempotency key: read back after the run with an ordered consumer.
async fn completions_stored_at(
    harness: &Harness,
    name: &str,
) -> anyhow::Result<HashMap<String, DateTime<Utc>>> {
    use bus::async_nats::jetstream::consumer::pull::OrderedConfig;
    use prost::Message as _;

    let subjects = harness.bus.subjects();
    let stream = harness
        .bus
        .jetstream()
        .get_stream(subjects.events_stream())
        .await
        .context("cannot open the events stream")?;
    let mut stored_at = HashMap::new();
    if stream.cached_info().state.messages == 0 {
        return Ok(stored_at);
    }
    let consumer = stream
        .create_consumer(OrderedConfig {
            filter_subject: subjects
                .tenant_event(&harness.organization_id, messages::EventKind::ScanCompleted),
            ..OrderedConfig::default()
        })
        .await
        .context("cannot read the events stream back")?;
    let mut messages = consumer
        .messages()
        .await
        .context("cannot read the events stream back")?;
    let prefix = format!("{name}-");
    // Ends at the last stored completion, or after a quiet second (none stored at all).
    while let Ok(Some(message)) =
        tokio::time::timeout(Duration::from_secs(1), messages.next()).await
    {
        let message = message.context("reading the events stream back")?;
        let info = message
            .info()
            .map_err(|error| anyhow::anyhow!("a stream message without its info: {error}"))?;
        let pending = info.pending;
        let published = DateTime::<Utc>::from_timestamp_nanos(
            i64::try_from(info.published.unix_timestamp_nanos()).unwrap_or(i64::MAX),
        );
        if let Ok(event) = messages::v1::ScanCompleted::decode(message.payload.as_ref())
            && event.idempotency_key.starts_with(&prefix)
        {
            stored_at.entry(event.idempotency_key).or_insert(published);
        }
        if pending == 0 {
            break;
        }
    }
    Ok(stored_at)
}
