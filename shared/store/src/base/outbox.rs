//! The transactional outbox: events are inserted in the transaction that makes them true, and
//! published to JetStream with `Nats-Msg-Id` = the event's id.
//!
//! A decision's events are one row of `outbox_batches` ([`OutboxRow`]): one row version per
//! decision, not one per event. Rows an older build wrote to `outbox` (one event each) are
//! claimed and published the same way.
//!
//! Two ways out. A service's hot path [`stage`]s its events: the row is written already
//! claimed for [`HANDOFF`] and handed back, and the committer publishes it right after
//! its commit (`outbox::Relay::hand_off`), so an event costs no claim and waits for no poll. The
//! relay's poll ([`claim`]) publishes every row nobody published: [`enqueue`]d ones (the
//! operator's commands, which run no relay) at once, staged ones only once their hand-off lapsed
//! (the committer crashed between commit and publish, or NATS refused it).

use std::collections::BTreeMap;
use std::time::Duration;

use messages::{EventKind, Subjects};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;
use crate::sql;

/// One event to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    pub id: Uuid,
    pub subject: String,
    pub payload: Vec<u8>,
    /// NATS headers to publish with (trace context).
    pub headers: BTreeMap<String, String>,
    /// When set and `headers` is empty, the insert fills `headers` with this scan's stored
    /// trace context, so the event joins the scan's trace. Not read back by `claim`.
    pub trace_scan_id: Option<Uuid>,
    /// What the event says; `None` when read back by `claim` (only the subject is stored).
    pub kind: Option<EventKind>,
}

impl OutboxEvent {
    /// An event of the services' own (task events), on `<prefix>.v1.event.<name>`.
    pub fn new(subjects: &Subjects, kind: EventKind, payload: Vec<u8>) -> Self {
        Self::on(subjects.event(kind), kind, payload)
    }

    /// A tenant's event (scan events), on `<prefix>.v1.org.<organization_id>.event.<name>`,
    /// where only that organization's clients may read it.
    pub fn for_tenant(
        subjects: &Subjects,
        organization_id: &Uuid,
        kind: EventKind,
        payload: Vec<u8>,
    ) -> Self {
        Self::on(subjects.tenant_event(organization_id, kind), kind, payload)
    }

    fn on(subject: String, kind: EventKind, payload: Vec<u8>) -> Self {
        Self {
            id: Uuid::now_v7(),
            subject,
            payload,
            headers: BTreeMap::new(),
            trace_scan_id: None,
            kind: Some(kind),
        }
    }

    /// Publishes this event in scan `scan_id`'s trace (see `trace_scan_id`); an event of no
    /// scan (`None`: a task without one) keeps the relay's.
    pub fn in_trace_of(mut self, scan_id: impl Into<Option<Uuid>>) -> Self {
        self.trace_scan_id = scan_id.into();
        self
    }
}

/// The events that report progress rather than an outcome (`scan.admitted`, `task.leased`,
/// `task.completed`). Nothing in palisade consumes them, so an operator may turn them off
/// (`PALISADE_PROGRESS_EVENTS=off`) to save a write and a message each; the outcomes
/// (`scan.completed`, `scan.failed`, …) and `task.ready` are always written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ProgressEvents {
    #[default]
    On,
    Off,
}

impl ProgressEvents {
    /// Whether an event of `kind` is written.
    pub fn writes(self, kind: EventKind) -> bool {
        self == ProgressEvents::On
            || !matches!(
                kind,
                EventKind::ScanAdmitted | EventKind::TaskLeased | EventKind::TaskCompleted
            )
    }
}

impl std::str::FromStr for ProgressEvents {
    type Err = String;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        match value {
            "on" => Ok(ProgressEvents::On),
            "off" => Ok(ProgressEvents::Off),
            _ => Err("expected on or off".into()),
        }
    }
}

/// How long a staged row belongs to its committer before the relay's poll may publish it.
/// Long enough for a busy committer to publish and remove it; a re-publish after it is
/// harmless (the stream drops a repeated `Nats-Msg-Id`), it only costs a message.
pub const HANDOFF: Duration = Duration::from_secs(10);

/// One outbox row: the events one decision wrote, published together and removed together
/// once every one of them is on the stream. A row an older build wrote holds one event.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxRow {
    pub id: Uuid,
    pub events: Vec<OutboxEvent>,
}

/// Events a transaction staged, for its committer to publish right after the commit.
///
/// A rolled-back savepoint takes its events with it ([`Staged::mark`], [`Staged::roll_back_to`]):
/// no event is published for a row that was not committed. Dropping a `Staged` loses nothing:
/// the relay's poll publishes the rows once [`HANDOFF`] has passed.
///
/// It also holds which optional events the transaction writes ([`ProgressEvents`]): the decision
/// scripts build every event, and [`stage`] leaves out the ones not wanted, in one place.
#[derive(Debug, Default)]
#[must_use = "hand staged events to the relay after the commit, or they wait out the hand-off"]
pub struct Staged {
    progress_events: ProgressEvents,
    rows: Vec<OutboxRow>,
}

impl Staged {
    pub fn new(progress_events: ProgressEvents) -> Self {
        Self {
            progress_events,
            rows: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    /// How many events were staged.
    pub fn len(&self) -> usize {
        self.rows.iter().map(|row| row.events.len()).sum()
    }

    /// Where the rows staged from now on begin (before a savepoint).
    pub(crate) fn mark(&self) -> usize {
        self.rows.len()
    }

    /// Forgets what was staged since `mark` (its savepoint was rolled back).
    pub(crate) fn roll_back_to(&mut self, mark: usize) {
        self.rows.truncate(mark);
    }

    /// The rows as stored, headers included, in the order they were staged.
    pub fn into_rows(self) -> Vec<OutboxRow> {
        self.rows
    }
}

/// Writes `events` as one row, inside the caller's transaction, for the relay's poll to
/// publish (paths that run no relay of their own: the operator's commands).
pub async fn enqueue(conn: &mut PgConnection, events: &[OutboxEvent]) -> Result<(), StoreError> {
    insert(conn, Uuid::now_v7(), events, None).await?;
    Ok(())
}

/// Writes `events` as one row, inside the caller's transaction, claimed by the caller for
/// [`HANDOFF`], and adds it as stored (with the scan's trace context filled in) to `staged`,
/// which the caller publishes after its commit.
pub async fn stage(
    conn: &mut PgConnection,
    staged: &mut Staged,
    mut events: Vec<OutboxEvent>,
) -> Result<(), StoreError> {
    events.retain(|event| {
        event
            .kind
            .is_none_or(|kind| staged.progress_events.writes(kind))
    });
    if events.is_empty() {
        return Ok(());
    }
    let id = Uuid::now_v7();
    let headers = insert(conn, id, &events, Some(HANDOFF)).await?;
    for (event, headers) in events.iter_mut().zip(headers) {
        event.headers = serde_json::from_value(headers).unwrap_or_default();
    }
    staged.rows.push(OutboxRow { id, events });
    Ok(())
}

/// The one insert: one row `id` holding `events`, claimed for `claimed_for` when set; returns
/// each event's stored headers, in the order of `events`.
async fn insert(
    conn: &mut PgConnection,
    id: Uuid,
    events: &[OutboxEvent],
    claimed_for: Option<Duration>,
) -> Result<Vec<serde_json::Value>, StoreError> {
    if events.is_empty() {
        return Ok(Vec::new());
    }
    let ids: Vec<Uuid> = events.iter().map(|event| event.id).collect();
    let subjects: Vec<&str> = events.iter().map(|event| event.subject.as_str()).collect();
    let payloads: Vec<&[u8]> = events
        .iter()
        .map(|event| event.payload.as_slice())
        .collect();
    let headers: Vec<serde_json::Value> = events
        .iter()
        .map(|event| serde_json::to_value(&event.headers).expect("string map serializes"))
        .collect();
    let trace_scan_ids: Vec<Option<Uuid>> =
        events.iter().map(|event| event.trace_scan_id).collect();
    let stored: Vec<serde_json::Value> = sql::outbox::InsertBatch {
        id,
        event_ids: &ids,
        subjects: &subjects,
        payloads: &payloads,
        headers: &headers,
        trace_scan_ids: &trace_scan_ids,
        claimed_for_seconds: claimed_for.map(crate::seconds),
    }
    .query_scalar()
    .fetch_one(conn)
    .await?;
    if stored.len() != events.len() {
        return Err(StoreError::Corrupt(format!(
            "outbox row {id}: {} events written, {} stored",
            events.len(),
            stored.len()
        )));
    }
    Ok(stored)
}

/// One row as the poll reads it: id, event ids, subjects, payloads, headers.
type ClaimedRow = (
    Uuid,
    Vec<Uuid>,
    Vec<String>,
    Vec<Vec<u8>>,
    Vec<serde_json::Value>,
);

/// Claims unpublished rows that no other relay holds, oldest first, for `claim_for`, until
/// they carry about `limit` events; commits before returning so no connection is held while
/// publishing.
pub async fn claim(
    pool: &PgPool,
    limit: i64,
    claim_for: Duration,
) -> Result<Vec<OutboxRow>, StoreError> {
    let claimed: Vec<ClaimedRow> = sql::outbox::Claim {
        limit,
        claim_for_seconds: crate::seconds(claim_for),
    }
    .query_as()
    .fetch_all(pool)
    .await?;
    let mut rows: Vec<OutboxRow> = claimed
        .into_iter()
        .map(|(id, event_ids, subjects, payloads, headers)| OutboxRow {
            id,
            events: event_ids
                .into_iter()
                .zip(subjects)
                .zip(payloads)
                .zip(headers)
                .map(|(((id, subject), payload), headers)| OutboxEvent {
                    id,
                    subject,
                    payload,
                    headers: serde_json::from_value(headers).unwrap_or_default(),
                    trace_scan_id: None,
                    kind: None,
                })
                .collect(),
        })
        .collect();
    // v7 ids sort by creation time; publish in that order.
    rows.sort_by_key(|row| row.id);
    Ok(rows)
}

/// Removes rows once every event of theirs is published (its PubAck arrived), whoever
/// published them: the events are on the stream, which keeps them. One statement for any
/// number of rows.
pub async fn remove_published(pool: &PgPool, ids: &[Uuid]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    sql::outbox::RemovePublished { ids }
        .query()
        .execute(pool)
        .await?;
    Ok(())
}

/// Gives claimed rows back so another pass can publish them at once, without their events in
/// `published` (acknowledged by the stream: a row that failed in part keeps only the rest).
pub async fn unclaim(pool: &PgPool, ids: &[Uuid], published: &[Uuid]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    sql::outbox::Unclaim {
        ids,
        published_event_ids: published,
    }
    .query()
    .execute(pool)
    .await?;
    Ok(())
}

/// Events not yet published and the age of the oldest, for lag metrics and tests.
pub async fn backlog(pool: &PgPool) -> Result<(i64, Option<f64>), StoreError> {
    let row: (i64, Option<f64>) = sql::query_as(sql::outbox::BACKLOG).fetch_one(pool).await?;
    Ok(row)
}
