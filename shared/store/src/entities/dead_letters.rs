//! Messages that exhausted their deliveries: recorded with their reason for an operator, who
//! lists and reads them and resolves each by replaying or discarding it (`palisade
//! dead-letter`).

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::sql;
use crate::states::DeadLetterResolution;

/// One dead message.
#[derive(Debug, Clone)]
pub struct DeadLetter<'a> {
    pub consumer: &'a str,
    pub subject: &'a str,
    pub stream_sequence: u64,
    pub delivered: i64,
    pub reason: &'a str,
    pub payload: &'a [u8],
}

/// Records it once per (consumer, stream sequence).
pub async fn record(pool: &PgPool, letter: &DeadLetter<'_>) -> Result<(), StoreError> {
    sql::dead_letters::Record {
        id: Uuid::now_v7(),
        consumer: letter.consumer,
        subject: letter.subject,
        stream_sequence: letter.stream_sequence as i64,
        delivered: letter.delivered,
        reason: letter.reason,
        payload: letter.payload,
    }
    .query()
    .execute(pool)
    .await?;
    Ok(())
}

/// A dead letter as `palisade dead-letter` shows it; `payload` only when read one by one.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct DeadLetterRow {
    pub id: Uuid,
    pub consumer: String,
    pub subject: String,
    pub stream_sequence: i64,
    pub delivered: i64,
    pub reason: String,
    pub created_at: chrono::DateTime<chrono::Utc>,
    /// `replayed` or `discarded` ([`DeadLetterResolution`]); `None` while open.
    pub resolution: Option<String>,
    pub resolved_at: Option<chrono::DateTime<chrono::Utc>>,
    pub resolved_by: String,
    pub resolution_note: String,
}

/// Which dead letters to list.
#[derive(Debug, Clone, Default)]
pub struct ListFilter<'a> {
    pub consumer: Option<&'a str>,
    /// Resolved ones too.
    pub all: bool,
    /// The page after this id (newest first).
    pub after: Option<Uuid>,
    pub limit: i64,
}

/// Dead letters newest first, with the size of each payload in bytes.
pub async fn list(
    pool: &PgPool,
    filter: &ListFilter<'_>,
) -> Result<Vec<(DeadLetterRow, i64)>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Listed {
        #[sqlx(flatten)]
        row: DeadLetterRow,
        bytes: i64,
    }
    let listed: Vec<Listed> = sql::dead_letters::List {
        consumer: filter.consumer,
        include_resolved: filter.all,
        after_id: filter.after,
        limit: filter.limit,
    }
    .query_as()
    .fetch_all(pool)
    .await?;
    Ok(listed.into_iter().map(|l| (l.row, l.bytes)).collect())
}

/// One dead letter and its payload.
pub async fn get(pool: &PgPool, id: Uuid) -> Result<Option<(DeadLetterRow, Vec<u8>)>, StoreError> {
    #[derive(sqlx::FromRow)]
    struct Read {
        #[sqlx(flatten)]
        row: DeadLetterRow,
        payload: Vec<u8>,
    }
    let read: Option<Read> = sql::dead_letters::Get { id }
        .query_as()
        .fetch_optional(pool)
        .await?;
    Ok(read.map(|read| (read.row, read.payload)))
}

/// Resolves an open dead letter; `false` when it is unknown or was resolved already.
pub async fn resolve(
    pool: &PgPool,
    id: Uuid,
    resolution: DeadLetterResolution,
    by: &str,
    note: &str,
) -> Result<bool, StoreError> {
    let resolved: Option<chrono::DateTime<chrono::Utc>> = sql::dead_letters::Resolve {
        id,
        resolution: resolution.as_str(),
        who: by,
        why: note,
    }
    .query_scalar()
    .fetch_optional(pool)
    .await?;
    Ok(resolved.is_some())
}
