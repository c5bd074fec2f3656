//! Messages that exhausted their deliveries: recorded with their reason for an operator.

use sqlx::PgPool;
use uuid::Uuid;

use crate::StoreError;
use crate::sql;

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
    sql::query(sql::dead_letters::RECORD)
        .bind(Uuid::now_v7())
        .bind(letter.consumer)
        .bind(letter.subject)
        .bind(letter.stream_sequence as i64)
        .bind(letter.delivered)
        .bind(letter.reason)
        .bind(letter.payload)
        .execute(pool)
        .await?;
    Ok(())
}
