//! Index builds on tables that grow, done without blocking their writes (issue 27, item 2).
//!
//! An index built inside a migration's transaction takes a `SHARE` lock on its table for the
//! whole build: every insert, update and delete of the table waits, and so does every statement
//! queued behind them. On a large table that is an outage. So a migration that needs an index on
//! a table that grows does not build it: it records that the index belongs to it (and marks
//! itself backward compatible), and `palisade migrate` builds every index of
//! [`ONLINE_INDEXES`] afterwards with `CREATE INDEX CONCURRENTLY` on a connection of its own,
//! outside any transaction. Such a build takes only a `SHARE UPDATE EXCLUSIVE` lock (writes go
//! on; another schema change of the table waits) and waits for the transactions already
//! writing the table to end.
//!
//! Rerun-safe: a build that failed or was interrupted (the process killed, the connection
//! lost, a unique index over duplicates) leaves an INVALID index of that name, which PostgreSQL
//! maintains on every write but never reads; `CREATE INDEX … IF NOT EXISTS` would keep it. So
//! each build first reads the index's state and drops an INVALID one (`DROP INDEX
//! CONCURRENTLY`), then builds; a valid one is left alone. One process builds at a time, under
//! a session advisory lock taken with `pg_try_advisory_lock` and polled: a session waiting for
//! the lock would hold a snapshot the build must wait out, so waiting could deadlock.
//!
//! [`preflight`] counts, before anything changes, the rows that would make a build fail (a
//! unique index over duplicates) and refuses with what to fix, as the hardening PR's duplicate
//! active scan check did.

use std::time::Duration;

use crate::schema::SchemaError;
use crate::{PgPool, StoreError, sql};

/// An index `palisade migrate` builds concurrently after the migrations.
#[derive(Debug, Clone, Copy)]
pub struct OnlineIndex {
    pub name: &'static str,
    pub table: &'static str,
    /// The migration that asks for it.
    pub migration: i64,
    /// `CREATE [UNIQUE] INDEX CONCURRENTLY IF NOT EXISTS <name> …`.
    pub build: &'static str,
    /// `DROP INDEX CONCURRENTLY IF EXISTS <name>`.
    pub drop: &'static str,
    /// What would make the build fail, counted before anything changes.
    pub preflight: Option<Preflight>,
}

/// A statement counting the rows a build would fail on (`SELECT count(*) …`, one `bigint`), and
/// what the operator must do about them.
#[derive(Debug, Clone, Copy)]
pub struct Preflight {
    pub statement: &'static str,
    pub remedy: &'static str,
}

/// Every index built concurrently, oldest migration first.
pub static ONLINE_INDEXES: &[OnlineIndex] = &[OnlineIndex {
    name: "scans_target_created_idx",
    table: "scans",
    migration: 20261205000028,
    build: sql::scans::BY_TARGET_INDEX_BUILD,
    drop: sql::scans::BY_TARGET_INDEX_DROP,
    preflight: None,
}];

/// From this migration on, a migration builds no index on a table an earlier migration created
/// (the unit test below enforces it): such an index belongs in [`ONLINE_INDEXES`]. Migrations
/// 24 and 25, older, build theirs inside their transaction (`docs/deploy.md` says what they
/// lock).
pub const ONLINE_SINCE: i64 = 20261205000028;

/// How long to wait between attempts at the build lock while another process holds it.
const LOCK_POLL: Duration = Duration::from_millis(500);

/// An index's state in the current schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexState {
    Absent,
    /// Left by a failed or interrupted concurrent build: maintained, never read.
    Invalid,
    Valid,
}

/// The state of the index `name`.
pub async fn state(pool: &PgPool, name: &str) -> Result<IndexState, StoreError> {
    let valid: Option<bool> = sql::database::IndexState { index_name: name }
        .query_scalar()
        .fetch_optional(pool)
        .await?;
    Ok(match valid {
        None => IndexState::Absent,
        Some(false) => IndexState::Invalid,
        Some(true) => IndexState::Valid,
    })
}

/// Refuses, changing nothing, when a build of `indexes` not yet valid would fail on the rows
/// its table holds. A table a pending migration has yet to create has nothing to check.
pub async fn preflight(pool: &PgPool, indexes: &[OnlineIndex]) -> Result<(), StoreError> {
    for index in indexes {
        let Some(check) = index.preflight else {
            continue;
        };
        if state(pool, index.name).await? == IndexState::Valid {
            continue;
        }
        let offending: i64 = match sql::query_scalar(check.statement).fetch_one(pool).await {
            Ok(count) => count,
            Err(sqlx::Error::Database(error)) if error.code().as_deref() == Some("42P01") => 0,
            Err(error) => return Err(error.into()),
        };
        if offending > 0 {
            return Err(SchemaError::IndexWouldFail {
                index: index.name,
                table: index.table,
                offending,
                remedy: check.remedy,
            }
            .into());
        }
    }
    Ok(())
}

/// What [`build`] did to one index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Built {
    /// Valid already: nothing done.
    AlreadyValid,
    Built,
    /// An INVALID one was dropped first.
    Rebuilt,
}

/// Builds every index of `indexes` that is not valid, concurrently, one at a time, under the
/// build lock; an INVALID one is dropped first. Logs each build's start and end (a build on a
/// large table takes minutes, and writes go on meanwhile).
pub async fn build(
    pool: &PgPool,
    indexes: &[OnlineIndex],
) -> Result<Vec<(&'static str, Built)>, StoreError> {
    let mut pending = Vec::new();
    for index in indexes {
        if state(pool, index.name).await? != IndexState::Valid {
            pending.push(index);
        }
    }
    if pending.is_empty() {
        return Ok(indexes
            .iter()
            .map(|index| (index.name, Built::AlreadyValid))
            .collect());
    }
    // The lock is a session's: every statement below runs on this one connection.
    let mut conn = pool.acquire().await?;
    let mut waited = false;
    while !sql::query_scalar::<bool>(sql::database::TRY_LOCK_ONLINE_INDEXES)
        .fetch_one(&mut *conn)
        .await?
    {
        if !waited {
            tracing::info!("another palisade migrate is building indexes; waiting for it");
            waited = true;
        }
        tokio::time::sleep(LOCK_POLL).await;
    }
    let built = build_locked(&mut conn, pool, indexes).await;
    let unlocked = sql::query_scalar::<bool>(sql::database::UNLOCK_ONLINE_INDEXES)
        .fetch_one(&mut *conn)
        .await;
    let built = built?;
    unlocked?;
    Ok(built)
}

async fn build_locked(
    conn: &mut sqlx::PgConnection,
    pool: &PgPool,
    indexes: &[OnlineIndex],
) -> Result<Vec<(&'static str, Built)>, StoreError> {
    let mut built = Vec::with_capacity(indexes.len());
    for index in indexes {
        // Read again under the lock: another process may have built it meanwhile.
        let outcome = match state(pool, index.name).await? {
            IndexState::Valid => Built::AlreadyValid,
            IndexState::Invalid => {
                tracing::warn!(
                    index = index.name,
                    table = index.table,
                    "an interrupted build left the index INVALID; dropping it to build it again"
                );
                sql::query(index.drop).execute(&mut *conn).await?;
                Built::Rebuilt
            }
            IndexState::Absent => Built::Built,
        };
        if outcome != Built::AlreadyValid {
            let started = std::time::Instant::now();
            tracing::info!(
                index = index.name,
                table = index.table,
                "building index concurrently; writes to the table go on"
            );
            sql::query(index.build).execute(&mut *conn).await?;
            tracing::info!(
                index = index.name,
                table = index.table,
                seconds = started.elapsed().as_secs_f64(),
                "index built"
            );
        }
        built.push((index.name, outcome));
    }
    Ok(built)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_online_index_is_built_and_dropped_concurrently_by_its_own_name() {
        for index in ONLINE_INDEXES {
            let build = index
                .build
                .split("\n")
                .filter(|line| !line.starts_with("--"))
                .collect::<String>();
            assert!(
                build.contains(&format!(
                    "INDEX CONCURRENTLY IF NOT EXISTS {} ON {} ",
                    index.name, index.table
                )),
                "{}: {build}",
                index.name
            );
            assert!(
                index
                    .drop
                    .trim_end()
                    .ends_with(&format!("DROP INDEX CONCURRENTLY IF EXISTS {}", index.name)),
                "{}",
                index.name
            );
            assert!(crate::schema::known_versions().contains(&index.migration));
        }
    }

    #[test]
    fn newer_migrations_build_no_index_on_a_table_they_did_not_create() {
        let index =
            regex::Regex::new(r"(?i)CREATE\s+(?:UNIQUE\s+)?INDEX\b[^;]*?\bON\s+(?:ONLY\s+)?(\w+)")
                .unwrap();
        let table =
            regex::Regex::new(r"(?i)CREATE\s+TABLE\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)").unwrap();
        let mut checked = 0;
        let mut offending = Vec::new();
        for migration in crate::MIGRATOR.iter().filter(|m| m.version >= ONLINE_SINCE) {
            checked += 1;
            let created: Vec<&str> = table
                .captures_iter(migration.sql.as_str())
                .map(|found| found.get(1).unwrap().as_str())
                .collect();
            for found in index.captures_iter(migration.sql.as_str()) {
                let on = found.get(1).unwrap().as_str();
                if !created.contains(&on) {
                    offending.push(format!("migration {}: an index on {on}", migration.version));
                }
            }
        }
        assert!(checked > 0, "found the migrations since {ONLINE_SINCE}");
        assert!(
            offending.is_empty(),
            "an index on a table that may be large blocks its writes for the whole build when \
             built in a migration; add it to ONLINE_INDEXES instead:\n{}",
            offending.join("\n")
        );
        // The rule sees what it must: an index on an existing table, not one on a new table.
        assert!(index.is_match("CREATE UNIQUE INDEX IF NOT EXISTS x ON scans (id)"));
        assert!(table.is_match("CREATE TABLE IF NOT EXISTS schedule_fires ("));
    }
}
