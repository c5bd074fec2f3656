//! Rolling-window rate limits shared by every process (issue 26): at most `limit` requests to
//! an upstream start in any `window`, counted in PostgreSQL with its clock, so replicas share
//! one budget and a restart does not reset it. A caller takes a start ([`take`]) before each
//! request and sleeps the wait it is told otherwise.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::{StoreError, sql};

/// The NVD API's limit (its row is inserted by the migration).
pub const NVD: &str = "nvd";

/// Why no start was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Taken {
    /// A request may start now; it is counted.
    Started,
    /// The window is full: try again after this long.
    Wait(Duration),
}

/// Counts a request of `name` starting now if fewer than `limit` started in the last
/// `window`; else says how long until the oldest of them leaves it. The limit's row is locked
/// for the transaction, so concurrent callers (any process) are counted one at a time.
pub async fn take(
    pool: &PgPool,
    name: &str,
    limit: u32,
    window: Duration,
) -> Result<Taken, StoreError> {
    let mut tx = pool.begin().await?;
    let held: Option<(Vec<DateTime<Utc>>, DateTime<Utc>)> = sql::rate_limits::Hold {
        name,
        window_seconds: crate::seconds(window),
    }
    .query_as()
    .fetch_optional(&mut *tx)
    .await?;
    let Some((mut live, now)) = held else {
        return Err(StoreError::Corrupt(format!(
            "no rate limit named {name:?} in rate_limits: run `palisade migrate`"
        )));
    };
    if live.len() >= limit.max(1) as usize {
        tx.commit().await?;
        let window = chrono::TimeDelta::from_std(window).unwrap_or(chrono::TimeDelta::MAX);
        let leaves = live[live.len() - limit.max(1) as usize] + window;
        let wait = (leaves - now).to_std().unwrap_or(Duration::ZERO);
        return Ok(Taken::Wait(wait.max(Duration::from_millis(1))));
    }
    live.push(now);
    sql::rate_limits::Set {
        name,
        starts: &live,
    }
    .query()
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    Ok(Taken::Started)
}
