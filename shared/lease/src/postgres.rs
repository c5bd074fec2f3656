//! The PostgreSQL lease store: one row per name in `leader_leases`, each operation one
//! statement, so the database decides every race.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use crate::{LeaseError, Release, Renewal, Store, Term, term_bounds, truncate_to_millis};

/// Leases in the `leader_leases` table (migration `20261129000005_background.sql`).
///
/// Decisions use the caller's `now`, not the database's `now()`, so this store and
/// [`crate::MemoryStore`] behave identically under one conformance suite; `updated_at` records
/// the database's own time of each write, for diagnosing clock skew.
#[derive(Debug, Clone)]
pub struct PgStore {
    pool: PgPool,
}

impl PgStore {
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }
}

/// Inserts a free lease or takes over an expired or own one. A conflicting insert waits for
/// the row's writer and re-checks the `WHERE` against its committed version, so of many
/// acquirers at one instant exactly one gets a row back. An own unexpired lease keeps its term
/// start (sticky) and never shortens (a late-landing attempt carries an older `now`); an
/// expired one, own or not, starts a new term.
const ACQUIRE_SQL: &str = "
INSERT INTO leader_leases AS held (name, owner, term_started_at, expires_at, updated_at)
VALUES ($1, $2, $3, $4, now())
ON CONFLICT (name) DO UPDATE SET
    owner = EXCLUDED.owner,
    term_started_at = CASE
        WHEN held.owner = EXCLUDED.owner AND held.expires_at > EXCLUDED.term_started_at
            THEN held.term_started_at
        ELSE EXCLUDED.term_started_at
    END,
    expires_at = CASE
        WHEN held.owner = EXCLUDED.owner AND held.expires_at > EXCLUDED.term_started_at
            THEN GREATEST(held.expires_at, EXCLUDED.expires_at)
        ELSE EXCLUDED.expires_at
    END,
    updated_at = now()
WHERE held.owner = EXCLUDED.owner OR held.expires_at <= EXCLUDED.term_started_at
RETURNING term_started_at, expires_at";

/// Extends only the caller's unexpired row, never shortening it; never inserts, so it cannot
/// resurrect a lease.
const RENEW_SQL: &str = "
UPDATE leader_leases
SET expires_at = GREATEST(expires_at, $4), updated_at = now()
WHERE name = $1 AND owner = $2 AND expires_at > $3
RETURNING expires_at";

/// Deletes only the caller's unexpired row; an expired or foreign row is left to its fate.
const RELEASE_SQL: &str = "
DELETE FROM leader_leases
WHERE name = $1 AND owner = $2 AND expires_at > $3";

impl Store for PgStore {
    async fn acquire(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<Option<Term>, LeaseError> {
        let (now, expires_at) = term_bounds(now, ttl)?;
        let row: Option<(DateTime<Utc>, DateTime<Utc>)> = sqlx::query_as(ACQUIRE_SQL)
            .bind(name)
            .bind(owner)
            .bind(now)
            .bind(expires_at)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|(started_at, expires_at)| Term {
            name: name.to_owned(),
            owner: owner.to_owned(),
            started_at,
            expires_at,
        }))
    }

    async fn renew(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
        ttl: Duration,
    ) -> Result<Renewal, LeaseError> {
        let (now, expires_at) = term_bounds(now, ttl)?;
        let renewed: Option<DateTime<Utc>> = sqlx::query_scalar(RENEW_SQL)
            .bind(name)
            .bind(owner)
            .bind(now)
            .bind(expires_at)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match renewed {
            Some(expires_at) => Renewal::Renewed { expires_at },
            None => Renewal::Refused,
        })
    }

    async fn release(
        &self,
        name: &str,
        owner: &str,
        now: DateTime<Utc>,
    ) -> Result<Release, LeaseError> {
        let deleted = sqlx::query(RELEASE_SQL)
            .bind(name)
            .bind(owner)
            .bind(truncate_to_millis(now))
            .execute(&self.pool)
            .await?
            .rows_affected();
        assert!(deleted <= 1, "name is the primary key of leader_leases");
        Ok(if deleted == 1 {
            Release::Released
        } else {
            Release::Lost
        })
    }
}
