//! The transactional outbox: events are inserted in the transaction that makes them true, and
//! published to JetStream with `Nats-Msg-Id` = the row id.
//!
//! Two ways out, one table. A service's hot path [`stage`]s its events: the rows are written
//! already claimed for [`HANDOFF`] and handed back, and the committer publishes them right after
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

    /// Publishes this event in scan `scan_id`'s trace (see `trace_scan_id`).
    pub fn in_trace_of(mut self, scan_id: Uuid) -> Self {
        self.trace_scan_id = Some(scan_id);
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
/// Long enough for a busy committer to publish and mark it; a re-publish after it is harmless
/// (the stream drops a repeated `Nats-Msg-Id`), it only costs a message.
pub const HANDOFF: Duration = Duration::from_secs(10);

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
    events: Vec<OutboxEvent>,
}

impl Staged {
    pub fn new(progress_events: ProgressEvents) -> Self {
        Self {
            progress_events,
            events: Vec::new(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.events.is_empty()
    }

    pub fn len(&self) -> usize {
        self.events.len()
    }

    /// Where the events staged from now on begin (before a savepoint).
    pub(crate) fn mark(&self) -> usize {
        self.events.len()
    }

    /// Forgets what was staged since `mark` (its savepoint was rolled back).
    pub(crate) fn roll_back_to(&mut self, mark: usize) {
        self.events.truncate(mark);
    }

    /// The events as stored, headers included, in the order they were staged.
    pub fn into_events(self) -> Vec<OutboxEvent> {
        self.events
    }
}

/// Inserts `events` in one statement, inside the caller's transaction, for the relay's poll to
/// publish (paths that run no relay of their own: the operator's commands).
pub async fn enqueue(conn: &mut PgConnection, events: &[OutboxEvent]) -> Result<(), StoreError> {
    insert(conn, events, None).await?;
    Ok(())
}

/// Inserts `events` in one statement, inside the caller's transaction, claimed by the caller
/// for [`HANDOFF`], and adds them as stored (with the scan's trace context filled in) to
/// `staged`, which the caller publishes after its commit.
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
    let headers = insert(conn, &events, Some(HANDOFF)).await?;
    for (event, (id, headers)) in events.iter_mut().zip(headers) {
        debug_assert_eq!(event.id, id);
        event.headers = serde_json::from_value(headers).unwrap_or_default();
    }
    staged.events.append(&mut events);
    Ok(())
}

/// The one insert: rows claimed for `claimed_for` when set; returns each row's id and stored
/// headers, in the order of `events`.
async fn insert(
    conn: &mut PgConnection,
    events: &[OutboxEvent],
    claimed_for: Option<Duration>,
) -> Result<Vec<(Uuid, serde_json::Value)>, StoreError> {
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
    let mut stored: Vec<(Uuid, serde_json::Value)> = sql::query_as(sql::outbox::INSERT_MANY)
        .bind(&ids)
        .bind(&subjects)
        .bind(&payloads)
        .bind(&headers)
        .bind(&trace_scan_ids)
        .bind(claimed_for.map(crate::seconds))
        .fetch_all(conn)
        .await?;
    // RETURNING follows no order; give the rows back in the order of `events`.
    let position: std::collections::HashMap<Uuid, usize> = ids
        .iter()
        .enumerate()
        .map(|(index, id)| (*id, index))
        .collect();
    stored.sort_by_key(|(id, _)| position[id]);
    Ok(stored)
}

/// Claims up to `limit` unpublished rows that no other relay holds, oldest first, for
/// `claim_for`; commits before returning so no connection is held while publishing.
pub async fn claim(
    pool: &PgPool,
    limit: i64,
    claim_for: Duration,
) -> Result<Vec<OutboxEvent>, StoreError> {
    let rows: Vec<(Uuid, String, Vec<u8>, serde_json::Value)> = sql::query_as(sql::outbox::CLAIM)
        .bind(limit)
        .bind(crate::seconds(claim_for))
        .fetch_all(pool)
        .await?;
    let mut events: Vec<OutboxEvent> = rows
        .into_iter()
        .map(|(id, subject, payload, headers)| OutboxEvent {
            id,
            subject,
            payload,
            headers: serde_json::from_value(headers).unwrap_or_default(),
            trace_scan_id: None,
            kind: None,
        })
        .collect();
    // v7 ids sort by creation time; publish in that order.
    events.sort_by_key(|event| event.id);
    Ok(events)
}

/// Removes rows once published (their PubAck arrived), whoever published them: the event is on
/// the stream, which keeps it. One statement for any number of rows.
pub async fn remove_published(pool: &PgPool, ids: &[Uuid]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    sql::query(sql::outbox::REMOVE_PUBLISHED)
        .bind(ids)
        .execute(pool)
        .await?;
    Ok(())
}

/// Gives claimed rows back so another pass can publish them at once.
pub async fn unclaim(pool: &PgPool, ids: &[Uuid]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    sql::query(sql::outbox::UNCLAIM)
        .bind(ids)
        .execute(pool)
        .await?;
    Ok(())
}

/// Rows not yet published and the age of the oldest, for lag metrics and tests.
pub async fn backlog(pool: &PgPool) -> Result<(i64, Option<f64>), StoreError> {
    let row: (i64, Option<f64>) = sql::query_as(sql::outbox::BACKLOG).fetch_one(pool).await?;
    Ok(row)
}
