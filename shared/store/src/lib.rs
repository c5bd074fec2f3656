//! palisade's PostgreSQL layer: the migrations and every SQL statement palisade runs (one file
//! each under `sql/<table>/`; `base/sql.rs` says how they become constants).
//!
//! Services never write SQL; they call this crate, which decides what is true. Its three parts:
//! - the decisions (folder `decide/`: admit, lease, ingest, advance, cancel, recover, revoke,
//!   fire), with [`Script`] and [`decide_batch`], the one way a consumer decides a fetched batch;
//! - the repositories ([`admin`], [`findings`], [`schedules`], …; folder `entities/`);
//! - the base (folder `base/`): errors, connecting and migrating, statements, states, the
//!   lease fence, the outbox, the retry policy.
//!
//! Transactions: a function that takes the pool opens and commits its own (most of them: one
//! operator command or service request each); a function that takes a connection or a
//! transaction runs in its caller's. The consumers' batch scripts run in the one transaction
//! [`decide_batch`] opens per fetched batch.
//! Every rule that says "unique", "at most one" or "never" is a constraint or a locked re-check
//! inside the writing transaction; every lease decision uses the database clock (`now()`).
//! The modules are reached by their short paths (`store::admit`, `store::findings`,
//! `store::states`): the folders group the source, not the API.

mod base;
mod decide;
mod entities;
#[cfg(feature = "testing")]
pub mod testing;

use std::time::Duration;

pub use base::database::{
    DatabaseSettings, MIGRATOR, connect, create_database_if_missing, database_exists,
    database_name, drop_database, expected_migration_version, migrate, migrate_with, ping,
    redact_url, with_database,
};
pub use base::error::StoreError;
pub use base::fence::LeaseClaim;
pub use base::outbox::{OutboxEvent, OutboxRow, ProgressEvents, Staged};
pub use base::retry::RetryPolicy;
pub use base::sql::{STATEMENTS, Statement};
pub(crate) use base::{fence, sql};
pub use base::{online_indexes, outbox, retry, schema, states, upkeep};
pub use decide::{
    Script, admit, cancel, decide_batch, fire, ingest, lease, progress, recover, revoke, savepoint,
};
pub use entities::{
    admin, artifacts, audit, bus_identities, coverage, cves, dead_letters, enrichment, enrollment,
    evidence, findings, history, observability, rate_limits, schedules,
};
pub use sqlx::{PgConnection, PgPool, Postgres, Transaction};

/// Milliseconds as the float seconds `make_interval` takes.
pub(crate) fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

/// Every file under `folder` whose extension is one of `extensions`, for the tests that read
/// the crate's own sources (`states`, `sql`).
#[cfg(test)]
pub(crate) fn source_files(
    folder: &std::path::Path,
    extensions: &[&str],
) -> Vec<std::path::PathBuf> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir(folder).expect("the crate's source folder is readable") {
        let path = entry.expect("a readable folder entry").path();
        if path.is_dir() {
            found.extend(source_files(&path, extensions));
        } else if path
            .extension()
            .is_some_and(|extension| extensions.iter().any(|wanted| extension == *wanted))
        {
            found.push(path);
        }
    }
    found
}
