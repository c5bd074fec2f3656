//! The transactional outbox: events are inserted in the transaction that makes them true, and
//! the relay (crate `outbox`) publishes them to JetStream with `Nats-Msg-Id` = the row id.

use std::collections::BTreeMap;
use std::time::Duration;

use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use crate::StoreError;

/// One event to publish.
#[derive(Debug, Clone, PartialEq)]
pub struct OutboxEvent {
    pub id: Uuid,
    pub subject: String,
    pub payload: Vec<u8>,
    /// NATS headers to publish with (trace context).
    pub headers: BTreeMap<String, String>,
    /// When set and `headers` is empty, `enqueue` fills `headers` with this scan's stored
    /// trace context, so the event joins the scan's trace. Not read back by `claim`.
    pub trace_scan_id: Option<Uuid>,
}

impl OutboxEvent {
    pub fn new(subject: String, payload: Vec<u8>) -> Self {
        Self {
            id: Uuid::now_v7(),
            subject,
            payload,
            headers: BTreeMap::new(),
            trace_scan_id: None,
        }
    }

    /// Publishes this event in scan `scan_id`'s trace (see `trace_scan_id`).
    pub fn in_trace_of(mut self, scan_id: Uuid) -> Self {
        self.trace_scan_id = Some(scan_id);
        self
    }
}

/// Inserts `events` in one statement, inside the caller's transaction.
pub async fn enqueue(conn: &mut PgConnection, events: &[OutboxEvent]) -> Result<(), StoreError> {
    if events.is_empty() {
        return Ok(());
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
    sqlx::query(
        r#"
        INSERT INTO outbox (id, subject, payload, headers)
        SELECT e.id, e.subject, e.payload,
               CASE WHEN e.headers = '{}'::jsonb AND s.trace_context IS NOT NULL
                    THEN jsonb_build_object('traceparent', s.trace_context)
                    ELSE e.headers END
        FROM UNNEST($1::uuid[], $2::text[], $3::bytea[], $4::jsonb[], $5::uuid[])
             AS e(id, subject, payload, headers, trace_scan_id)
        LEFT JOIN scans s ON s.id = e.trace_scan_id
        "#,
    )
    .bind(&ids)
    .bind(&subjects)
    .bind(&payloads)
    .bind(&headers)
    .bind(&trace_scan_ids)
    .execute(conn)
    .await?;
    Ok(())
}

/// Claims up to `limit` unpublished rows that no other relay holds, oldest first, for
/// `claim_for`; commits before returning so no connection is held while publishing.
pub async fn claim(
    pool: &PgPool,
    limit: i64,
    claim_for: Duration,
) -> Result<Vec<OutboxEvent>, StoreError> {
    let rows: Vec<(Uuid, String, Vec<u8>, serde_json::Value)> = sqlx::query_as(
        r#"
        WITH claimable AS (
            SELECT id FROM outbox
            WHERE published_at IS NULL AND (claimed_until IS NULL OR claimed_until < now())
            ORDER BY created_at
            LIMIT $1
            FOR UPDATE SKIP LOCKED
        )
        UPDATE outbox o
        SET claimed_until = now() + make_interval(secs => $2), publish_attempts = publish_attempts + 1
        FROM claimable
        WHERE o.id = claimable.id
        RETURNING o.id, o.subject, o.payload, o.headers
        "#,
    )
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
        })
        .collect();
    // v7 ids sort by creation time; publish in that order.
    events.sort_by_key(|event| event.id);
    Ok(events)
}

/// Marks rows published (their PubAck arrived).
pub async fn mark_published(pool: &PgPool, ids: &[Uuid]) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    sqlx::query("UPDATE outbox SET published_at = now(), claimed_until = NULL WHERE id = ANY($1)")
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
    sqlx::query(
        "UPDATE outbox SET claimed_until = NULL WHERE id = ANY($1) AND published_at IS NULL",
    )
    .bind(ids)
    .execute(pool)
    .await?;
    Ok(())
}

/// Rows not yet published and the age of the oldest, for lag metrics and tests.
pub async fn backlog(pool: &PgPool) -> Result<(i64, Option<f64>), StoreError> {
    let row: (i64, Option<f64>) = sqlx::query_as(
        "SELECT count(*), extract(epoch FROM now() - min(created_at))::float8 FROM outbox WHERE published_at IS NULL",
    )
    .fetch_one(pool)
    .await?;
    Ok(row)
}
