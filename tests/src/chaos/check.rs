//! The checker: what must hold after any schedule of faults, read from PostgreSQL and the
//! events stream once the load has stopped and the system has settled.
//!
//! - every confirmed request has exactly one scan, in a terminal state, and exactly one
//!   terminal event (by event id) in the events stream, of the kind its state says (I3, I4,
//!   I5, I13); no scan exists for a request that was never attempted;
//! - every completed scan holds each finding exactly once: as many as its plugin emitted, all
//!   written by its succeeding attempt, and as many as the batches that attempt had accepted
//!   (I2, I7);
//! - no live attempt is left and no task of the load is unfinished (I1, I4);
//! - the outbox is drained (I4);
//! - attempt numbers strictly increase with the attempts' start, per task (I1);
//! - no message was recorded dead: nothing in the load is malformed, so a dead letter means a
//!   fault spent a message's redelivery budget (I13);
//! - the reaper's leader intervals are disjoint (I9).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use bus::Bus;
use futures::StreamExt as _;
use messages::{EventKind, v1};
use prost::Message as _;
use store::PgPool;
use store::states::{AttemptStatus, ScanState, TaskState};

use super::ledger::{CLIENT_ID, FINDINGS_PER_SCAN, Ledger};
use super::processes::{Sweep, overlapping_sweeps};

/// Scans of the load by state.
pub type StateCounts = BTreeMap<String, usize>;

/// Scans of the load (by idempotency key) that are not yet in a terminal state, and the
/// count by state.
pub async fn unfinished(
    pool: &PgPool,
    ledger: &Ledger,
) -> Result<(Vec<String>, StateCounts), sqlx::Error> {
    let scans = scans_by_key(pool).await?;
    let mut counts = StateCounts::new();
    let mut unfinished = Vec::new();
    for key in &ledger.confirmed {
        let state = scans
            .get(key)
            .map_or("missing", |(_, state)| state.as_str());
        *counts.entry(state.to_owned()).or_default() += 1;
        if !is_terminal_scan(state) {
            unfinished.push(key.clone());
        }
    }
    Ok((unfinished, counts))
}

fn is_terminal_scan(state: &str) -> bool {
    ScanState::ALL
        .iter()
        .any(|terminal| terminal.as_str() == state && !ScanState::ACTIVE.contains(terminal))
}

/// Every scan of the suite's client: idempotency key → (scan id, state).
async fn scans_by_key(
    pool: &PgPool,
) -> Result<BTreeMap<String, (uuid::Uuid, String)>, sqlx::Error> {
    let rows: Vec<(String, uuid::Uuid, String)> =
        sqlx::query_as("SELECT idempotency_key, id, state FROM scans WHERE client_id = $1")
            .bind(CLIENT_ID)
            .fetch_all(pool)
            .await?;
    Ok(rows
        .into_iter()
        .map(|(key, id, state)| (key, (id, state)))
        .collect())
}

/// Runs every check; returns what failed, one line each (empty when everything holds).
pub async fn check(
    pool: &PgPool,
    bus: &Bus,
    ledger: &Ledger,
    sweeps: &[Sweep],
) -> Result<Vec<String>, anyhow::Error> {
    let mut violations = Vec::new();
    let scans = scans_by_key(pool).await?;

    // Exactly one scan per confirmed request, terminal; none for a request never made.
    for key in &ledger.confirmed {
        match scans.get(key) {
            None => violations.push(format!("confirmed request {key} has no scan")),
            Some((id, state)) if !is_terminal_scan(state) => {
                violations.push(format!("scan {id} ({key}) is still {state}"));
            }
            Some(_) => {}
        }
    }
    if ledger.confirmed.iter().any(|key| !scans.contains_key(key)) {
        violations.extend(consumers_of(bus, &bus.subjects().requests_stream()).await?);
    }
    for key in scans.keys() {
        if !ledger.attempted.contains(key) {
            violations.push(format!("scan for {key}, which the load never requested"));
        }
    }

    // Exactly one terminal event per scan, of its state's kind.
    let terminal_events = terminal_events(bus).await?;
    for (key, (id, state)) in &scans {
        let events = terminal_events.get(id).cloned().unwrap_or_default();
        let kinds: BTreeSet<&str> = events.values().copied().collect();
        match (events.len(), kinds.iter().next()) {
            (1, Some(kind)) if *kind == *state => {}
            (0, _) if !is_terminal_scan(state) => {}
            _ => violations.push(format!(
                "scan {id} ({key}, {state}) has terminal events {events:?}, not exactly one {state}"
            )),
        }
    }

    // Findings exactly once, from the attempt that succeeded, as its accepted batches say.
    let findings: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT s.idempotency_key,
                (SELECT count(*) FROM findings f WHERE f.scan_id = s.id),
                (SELECT count(DISTINCT f.finding_key) FROM findings f WHERE f.scan_id = s.id),
                (SELECT count(*) FROM findings f
                   JOIN worker_task_attempts a ON a.id = f.attempt_id
                  WHERE f.scan_id = s.id AND a.status = $2),
                (SELECT coalesce(sum(b.finding_count), 0) FROM worker_result_batches b
                   JOIN worker_task_attempts a ON a.id = b.attempt_id
                   JOIN worker_tasks t ON t.id = a.task_id
                  WHERE t.scan_id = s.id AND a.status = $2)
           FROM scans s
          WHERE s.client_id = $1 AND s.state = $3",
    )
    .bind(CLIENT_ID)
    .bind(AttemptStatus::Succeeded.as_str())
    .bind(ScanState::Completed.as_str())
    .fetch_all(pool)
    .await?;
    for (key, rows, distinct, by_winner, batched) in findings {
        if [rows, distinct, by_winner, batched] != [FINDINGS_PER_SCAN; 4] {
            violations.push(format!(
                "completed scan {key}: {rows} findings ({distinct} distinct, {by_winner} by the succeeding attempt, {batched} in its accepted batches), expected {FINDINGS_PER_SCAN}"
            ));
        }
    }

    // No live attempt, no unfinished task.
    let live_attempts = count(
        pool,
        "SELECT count(*) FROM worker_task_attempts WHERE status = ANY($1)",
        AttemptStatus::LIVE
            .iter()
            .map(|status| status.as_str())
            .collect(),
    )
    .await?;
    if live_attempts > 0 {
        violations.push(format!("{live_attempts} attempts still live"));
    }
    let open_tasks = count(
        pool,
        "SELECT count(*) FROM worker_tasks WHERE NOT state = ANY($1)",
        TaskState::TERMINAL
            .iter()
            .map(|state| state.as_str())
            .collect(),
    )
    .await?;
    if open_tasks > 0 {
        violations.push(format!("{open_tasks} tasks not terminal"));
    }

    // The outbox drained.
    let (backlog, _) = store::outbox::backlog(pool).await?;
    if backlog > 0 {
        violations.push(format!("{backlog} outbox rows unpublished"));
    }

    // Attempt numbers strictly increase with the attempts' start.
    let (out_of_order,): (i64,) = sqlx::query_as(
        "SELECT count(*) FROM (
             SELECT attempt_number,
                    lag(attempt_number) OVER (PARTITION BY task_id ORDER BY started_at, attempt_number) AS previous
               FROM worker_task_attempts) numbered
          WHERE previous IS NOT NULL AND attempt_number <= previous",
    )
    .fetch_one(pool)
    .await?;
    if out_of_order > 0 {
        violations.push(format!(
            "{out_of_order} attempts numbered no higher than the one before them"
        ));
    }

    // Nothing dead.
    let dead: Vec<(String, String, i64, String)> = sqlx::query_as(
        "SELECT consumer, subject, delivered, reason FROM dead_letters ORDER BY created_at",
    )
    .fetch_all(pool)
    .await?;
    for (consumer, subject, delivered, reason) in dead {
        violations.push(format!(
            "dead letter of {consumer} on {subject} after {delivered} deliveries: {reason}"
        ));
    }

    // One reaper sweeping at a time.
    for (first, second) in overlapping_sweeps(sweeps, super::processes::now_ms()) {
        violations.push(format!(
            "reaper replicas {} and {} swept at once: {first:?} and {second:?}",
            first.replica, second.replica
        ));
    }
    Ok(violations)
}

/// Where a stream's messages stand with each of its durable consumers, one line each: said
/// when confirmed requests have no scan, to tell a message never delivered from one whose
/// deliveries were spent without a decision.
async fn consumers_of(bus: &Bus, stream: &str) -> Result<Vec<String>, anyhow::Error> {
    let mut stream = bus.jetstream().get_stream(stream).await?;
    let state = stream.info().await?.state.clone();
    let mut lines = vec![format!(
        "stream {stream_name}: {} messages, sequences {}..={}",
        state.messages,
        state.first_sequence,
        state.last_sequence,
        stream_name = stream.cached_info().config.name
    )];
    let mut names = stream.consumer_names();
    while let Some(name) = names.next().await {
        let name = name?;
        let info = stream
            .get_consumer::<bus::async_nats::jetstream::consumer::pull::Config>(&name)
            .await
            .map_err(|error| anyhow::anyhow!("consumer {name}: {error}"))?
            .cached_info()
            .clone();
        lines.push(format!(
            "consumer {name}: {} pending, {} awaiting acknowledgement, {} redelivered, \
             delivered to {}, acknowledged to {}, max_deliver {}",
            info.num_pending,
            info.num_ack_pending,
            info.num_redelivered,
            info.delivered.stream_sequence,
            info.ack_floor.stream_sequence,
            info.config.max_deliver
        ));
    }
    Ok(lines)
}

/// The count `sql` returns for the state names bound as `$1`.
async fn count(pool: &PgPool, sql: &'static str, states: Vec<&str>) -> Result<i64, sqlx::Error> {
    let (count,): (i64,) = sqlx::query_as(sql).bind(states).fetch_one(pool).await?;
    Ok(count)
}

/// scan id → (event id → kind) of every scan.completed, scan.failed and scan.cancelled in the
/// events stream. The event id is the message's `Nats-Msg-Id` (the outbox row): a republish
/// of the same event is the same event.
async fn terminal_events(
    bus: &Bus,
) -> Result<BTreeMap<uuid::Uuid, BTreeMap<String, &'static str>>, anyhow::Error> {
    let subjects = bus.subjects();
    let kinds = [
        (EventKind::ScanCompleted, ScanState::Completed.as_str()),
        (EventKind::ScanFailed, ScanState::Failed.as_str()),
        (EventKind::ScanCancelled, ScanState::Cancelled.as_str()),
    ];
    let mut stream = bus.jetstream().get_stream(subjects.events_stream()).await?;
    let last = stream.info().await?.state.last_sequence;
    let consumer = stream
        .create_consumer(bus::async_nats::jetstream::consumer::pull::Config {
            filter_subject: format!("{}.v1.org.*.event.scan.>", subjects.prefix()),
            ack_policy: bus::async_nats::jetstream::consumer::AckPolicy::None,
            inactive_threshold: Duration::from_secs(60),
            ..Default::default()
        })
        .await?;
    let mut events: BTreeMap<uuid::Uuid, BTreeMap<String, &'static str>> = BTreeMap::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    let mut read_to = 0;
    // Fetched in batches, each bounded in time, until the sequence the stream had when the
    // check began: no wait on a count that a server restart may have made stale.
    while read_to < last {
        anyhow::ensure!(
            tokio::time::Instant::now() < deadline,
            "the events stream was read to sequence {read_to} of {last} in a minute"
        );
        let mut batch = consumer
            .fetch()
            .max_messages(1_000)
            .expires(Duration::from_secs(1))
            .messages()
            .await?;
        let mut fetched = 0;
        while let Some(message) = batch.next().await {
            let message = message.map_err(|error| anyhow::anyhow!("{error}"))?;
            fetched += 1;
            read_to = read_to.max(
                message
                    .info()
                    .map_err(|error| anyhow::anyhow!("{error}"))?
                    .stream_sequence,
            );
            let Some(&(kind, state)) = kinds
                .iter()
                .find(|(kind, _)| subjects.event_kind_of(message.subject.as_str()) == Some(*kind))
            else {
                continue;
            };
            let scan_id = match kind {
                EventKind::ScanCompleted => {
                    v1::ScanCompleted::decode(message.payload.as_ref())?.scan_id
                }
                EventKind::ScanFailed => v1::ScanFailed::decode(message.payload.as_ref())?.scan_id,
                _ => v1::ScanCancelled::decode(message.payload.as_ref())?.scan_id,
            };
            let event_id = message
                .headers
                .as_ref()
                .and_then(|headers| headers.get(messages::HEADER_MSG_ID))
                .map(|id| id.as_str().to_owned())
                .unwrap_or_default();
            events
                .entry(uuid::Uuid::parse_str(&scan_id)?)
                .or_default()
                .insert(event_id, state);
        }
        if fetched == 0 {
            // Nothing more matches the filter: what is left are other events.
            break;
        }
    }
    Ok(events)
}
