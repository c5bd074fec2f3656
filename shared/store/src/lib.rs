//! palisade's PostgreSQL layer: the migrations and every SQL statement palisade runs (one file
//! each under `sql/<table>/`; `src/sql.rs` says how they become constants).
//!
//! Services never write SQL; they call repository functions here, each taking the connection
//! or transaction it runs in, so a service decides the transaction boundary (one per message,
//! or one per fetched batch decided set-wise by a decision script: `admit`, `ingest`) and this
//! crate decides what is true.
//! Every rule that says "unique", "at most one" or "never" is a constraint or a locked re-check
//! inside the writing transaction; every lease decision uses the database clock (`now()`).

pub mod admin;
pub mod admit;
pub mod artifacts;
pub mod audit;
pub mod bus_identities;
pub mod cancel;
pub mod cves;
pub mod dead_letters;
pub mod enrichment;
pub mod evidence;
pub mod findings;
pub mod history;
pub mod ingest;
pub mod lease;
pub mod observability;
pub mod online_indexes;
pub mod outbox;
pub mod progress;
pub mod rate_limits;
pub mod recover;
pub mod retry;
pub mod revoke;
pub mod schedules;
pub mod schema;
pub mod states;
#[cfg(feature = "testing")]
pub mod testing;

mod fence;
mod sql;

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use thiserror::Error;

pub use fence::LeaseClaim;
pub use outbox::{OutboxEvent, OutboxRow, ProgressEvents, Staged};
pub use retry::RetryPolicy;
pub use sql::{STATEMENTS, Statement};
pub use sqlx::{PgConnection, PgPool, Postgres, Transaction};

/// The embedded migrations under `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

/// Failures of the database itself. Refusals that a sender caused (bad input, lost lease)
/// are not errors here: repository functions return them as outcomes.
#[derive(Debug, Error)]
pub enum StoreError {
    #[error(
        "cannot connect to PostgreSQL at {url}: {source}; start PostgreSQL or set DATABASE_URL"
    )]
    Connect {
        url: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("database migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The database is not what this build may migrate or run on (see [`schema`]).
    #[error(transparent)]
    Schema(#[from] schema::SchemaError),
    #[error(
        "cannot create database {database}: {source}; create it as an administrator (`CREATE DATABASE {database} OWNER <the role in DATABASE_URL>`), or give the role CREATEDB"
    )]
    CreateDatabase {
        database: String,
        #[source]
        source: sqlx::Error,
    },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
    #[error("corrupt row: {0}")]
    Corrupt(String),
    /// A concurrent transaction committed a row a set-wise decision had read as absent. Not
    /// transient in [`StoreError::is_transient`]'s sense: the caller decides again one by one.
    #[error("decided against a concurrent commit: {0}")]
    Raced(String),
}

impl StoreError {
    /// True when running the same work again may succeed: lost connections, deadlocks,
    /// serialization failures, pool timeouts. False for bugs and constraint violations.
    pub fn is_transient(&self) -> bool {
        self.is_unavailable()
            || matches!(self, StoreError::Database(sqlx::Error::Database(db))
            // serialization_failure, deadlock_detected, lock_not_available,
            // query_canceled (a statement timeout)
            if db.code().is_some_and(|code| {
                matches!(code.as_ref(), "40001" | "40P01" | "55P03" | "57014")
            }))
    }

    /// True when PostgreSQL itself could not be reached or used: no connection (refused,
    /// lost, the pool exhausted or closed), or the server shutting down, starting or full.
    /// Nothing about the work is at fault, so consumers hold it for as long as this lasts
    /// (`bus::Decision::Hold`) rather than spend its deliveries. Contention (a deadlock, a
    /// statement timeout) is transient but not this: it may be the work's own doing, so it is
    /// retried within the message's budget.
    pub fn is_unavailable(&self) -> bool {
        match self {
            StoreError::Connect { .. } => true,
            StoreError::Database(
                sqlx::Error::Io(_) | sqlx::Error::PoolTimedOut | sqlx::Error::PoolClosed,
            ) => true,
            // A server that closed the connection before answering the TLS question (stopping,
            // starting, or a proxy in front of one that is down): sqlx reads no byte and
            // reports it as a protocol error, `unexpected response from SSLRequest: 0x00`.
            StoreError::Database(sqlx::Error::Protocol(message)) => {
                message.starts_with(SSL_REQUEST_UNANSWERED)
            }
            StoreError::Database(sqlx::Error::Database(db)) => db.code().is_some_and(|code| {
                // connection exceptions (class 08), admin_shutdown, crash_shutdown,
                // cannot_connect_now, too_many_connections
                code.starts_with("08")
                    || matches!(code.as_ref(), "57P01" | "57P02" | "57P03" | "53300")
            }),
            _ => false,
        }
    }

    /// True when PostgreSQL refused the data itself (a data exception, class 22, such as a NUL
    /// in text; or an integrity constraint, class 23): writing the same data again fails the
    /// same way. The error's text names what was refused.
    pub fn is_data_refused(&self) -> bool {
        matches!(self, StoreError::Database(sqlx::Error::Database(db))
            if db
                .code()
                .is_some_and(|code| code.starts_with("22") || code.starts_with("23")))
    }
}

/// The start of sqlx's error for a connection closed before the server answered the TLS
/// request (no byte read): PostgreSQL not answering, not a broken protocol.
const SSL_REQUEST_UNANSWERED: &str = "unexpected response from SSLRequest: 0x00";

/// How to reach PostgreSQL.
#[derive(Debug, Clone)]
pub struct DatabaseSettings {
    pub url: String,
    /// Connections per process; the hot paths hold one only for a transaction.
    pub max_connections: u32,
    pub acquire_timeout: Duration,
}

impl DatabaseSettings {
    pub const DEFAULT_URL: &'static str = "postgres://postgres@127.0.0.1:5432/palisade";
    pub const MAX_CONNECTIONS_DEFAULT: u32 = 16;
    pub const ACQUIRE_TIMEOUT_DEFAULT: Duration = Duration::from_secs(10);

    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            max_connections: Self::MAX_CONNECTIONS_DEFAULT,
            acquire_timeout: Self::ACQUIRE_TIMEOUT_DEFAULT,
        }
    }
}

/// Opens a pool; fails fast with a message that says how to fix it.
pub async fn connect(settings: &DatabaseSettings) -> Result<PgPool, StoreError> {
    let options: PgConnectOptions = settings.url.parse().map_err(|source| StoreError::Connect {
        url: redact_url(&settings.url),
        source,
    })?;
    // (Every statement is planned for its own arguments by running unnamed: see `sql.rs`.)
    // Random reads are priced as what they are here, cached or on SSD: with PostgreSQL's default
    // (4, for spinning disks) the set-wise statements read whole tables of a few thousand rows
    // and hash them rather than look up the batch's rows by index (`palisade bench`: 400 rows
    // read sequentially per scan, 70 at 1.1, and a faster burn-down).
    let options = options.options([("random_page_cost", "1.1")]);
    PgPoolOptions::new()
        .max_connections(settings.max_connections)
        .acquire_timeout(settings.acquire_timeout)
        .connect_with(options)
        .await
        .map_err(|source| StoreError::Connect {
            url: redact_url(&settings.url),
            source,
        })
}

/// Whether the database named in `url` exists (asked of the server's `postgres` database).
pub async fn database_exists(url: &str) -> Result<bool, StoreError> {
    use sqlx::migrate::MigrateDatabase as _;
    Postgres::database_exists(url)
        .await
        .map_err(|source| StoreError::Connect {
            url: redact_url(url),
            source,
        })
}

/// Creates the database named in `url` if it does not exist.
pub async fn create_database_if_missing(url: &str) -> Result<(), StoreError> {
    use sqlx::migrate::MigrateDatabase as _;
    if !database_exists(url).await? {
        Postgres::create_database(url)
            .await
            .map_err(|source| StoreError::CreateDatabase {
                database: database_name(url).to_owned(),
                source,
            })?;
    }
    Ok(())
}

/// Applies every pending migration, after [`schema::preflight`] and
/// [`online_indexes::preflight`] found nothing that would stop them part-way (the server's
/// version, the privilege to create, a schema newer than this build, rows an index build would
/// fail on), then builds the indexes on tables that grow concurrently
/// ([`online_indexes::build`]). Safe to run from many replicas at once (sqlx takes an advisory
/// lock, the builds another) and to re-run after a partial failure (each migration is one
/// transaction and every statement is idempotent; an INVALID index is dropped and built again).
pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    migrate_with(pool, &schema::Requirements::default()).await?;
    Ok(())
}

/// [`migrate`] demanding `requirements`; what it applied.
pub async fn migrate_with(
    pool: &PgPool,
    requirements: &schema::Requirements,
) -> Result<schema::Plan, StoreError> {
    let plan = schema::preflight(pool, requirements).await?;
    online_indexes::preflight(pool, online_indexes::ONLINE_INDEXES).await?;
    // Run even when nothing is pending: sqlx also refuses an applied migration whose file
    // changed since (its checksum).
    MIGRATOR.run(pool).await?;
    // Then the indexes on tables that grow, concurrently, outside any transaction.
    online_indexes::build(pool, online_indexes::ONLINE_INDEXES).await?;
    Ok(plan)
}

/// The newest migration version this build knows.
pub fn expected_migration_version() -> i64 {
    schema::known_versions().last().copied().unwrap_or(0)
}

/// One round trip to the database (`SELECT 1`), for `/readyz`.
pub async fn ping(pool: &PgPool) -> Result<(), StoreError> {
    sql::query(sql::database::PING).execute(pool).await?;
    Ok(())
}

/// `url` with its database name replaced by `database` (the path after the host; query
/// parameters kept).
pub fn with_database(url: &str, database: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(base, query)| (base, Some(query)));
    let scheme_end = base.find("://").map_or(0, |index| index + 3);
    let host = match base[scheme_end..].find('/') {
        Some(index) => &base[..scheme_end + index],
        None => base,
    };
    match query {
        Some(query) => format!("{host}/{database}?{query}"),
        None => format!("{host}/{database}"),
    }
}

/// The database name in `url` (the path after the host, without query parameters).
pub fn database_name(url: &str) -> &str {
    let base = url.split_once('?').map_or(url, |(base, _)| base);
    let scheme_end = base.find("://").map_or(0, |index| index + 3);
    match base[scheme_end..].find('/') {
        Some(index) => &base[scheme_end + index + 1..],
        None => "",
    }
}

/// `url` without its password, for messages.
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme_end), Some(at)) if at > scheme_end => {
            let credentials = &url[scheme_end + 3..at];
            match credentials.split_once(':') {
                Some((user, _password)) => {
                    format!("{}{}:***{}", &url[..scheme_end + 3], user, &url[at..])
                }
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

/// Milliseconds as the float seconds `make_interval` takes.
pub(crate) fn seconds(duration: Duration) -> f64 {
    duration.as_secs_f64()
}

/// Opens a savepoint inside `tx`: one message of a batch is decided in it, and rolled back
/// alone when that message is refused or fails.
pub async fn savepoint<'c>(
    tx: &'c mut Transaction<'_, Postgres>,
) -> Result<Transaction<'c, Postgres>, StoreError> {
    use sqlx::Acquire as _;
    Ok((&mut **tx).begin().await?)
}

/// A decision script over one fetched batch, in its two forms.
pub trait Script {
    /// One outcome per message, in the batch's order.
    type Outcomes: Send;
    /// A fixed number of statements for the whole batch; its events go to `staged`.
    fn set_wise(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> impl Future<Output = Result<Self::Outcomes, StoreError>> + Send;
    /// One message per savepoint: more statements, but a message the schema refuses fails
    /// alone.
    fn one_by_one(
        &self,
        tx: &mut Transaction<'static, Postgres>,
        staged: &mut Staged,
    ) -> impl Future<Output = Result<Self::Outcomes, StoreError>> + Send;
}

/// The one fallback policy of every consumer: decides the batch set-wise in one transaction;
/// when a set-wise statement fails for a reason retrying cannot fix (a row the schema refuses),
/// decides it again one message per savepoint in a fresh transaction, so that the message at
/// fault is refused alone and its neighbours go through. A transient failure is returned: the
/// caller has the whole batch redelivered. The events of the committed transaction come back
/// staged, for the caller to publish.
pub async fn decide_batch<S: Script + Sync>(
    pool: &PgPool,
    progress_events: outbox::ProgressEvents,
    script: &S,
) -> Result<(S::Outcomes, Staged), StoreError> {
    let set_wise = async {
        let mut staged = Staged::new(progress_events);
        let mut tx = pool.begin().await?;
        let outcomes = script.set_wise(&mut tx, &mut staged).await?;
        tx.commit().await?;
        Ok::<_, StoreError>((outcomes, staged))
    };
    match set_wise.await {
        Err(error) if !error.is_transient() => {
            tracing::warn!(%error, "a set-wise statement failed; deciding the batch one message at a time");
            let mut staged = Staged::new(progress_events);
            let mut tx = pool.begin().await?;
            let outcomes = script.one_by_one(&mut tx, &mut staged).await?;
            tx.commit().await?;
            Ok((outcomes, staged))
        }
        outcome => outcome,
    }
}

/// Drops the database named in `url` (demo and test clean-up), closing its other sessions.
pub async fn drop_database(url: &str) -> Result<(), StoreError> {
    use sqlx::migrate::MigrateDatabase as _;
    Postgres::force_drop_database(url)
        .await
        .map_err(|source| StoreError::Connect {
            url: redact_url(url),
            source,
        })
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_database_of_a_url() {
        assert_eq!(
            database_name("postgres://u:p@h:5432/db?sslmode=require"),
            "db"
        );
        assert_eq!(database_name("postgres://h/db"), "db");
        assert_eq!(database_name("postgres://h"), "");
    }

    #[test]
    fn redacts_passwords_only() {
        assert_eq!(
            redact_url("postgres://u:secret@h:5432/db"),
            "postgres://u:***@h:5432/db"
        );
        assert_eq!(redact_url("postgres://u@h/db"), "postgres://u@h/db");
        assert_eq!(redact_url("postgres://h/db"), "postgres://h/db");
    }

    #[test]
    fn unavailable_is_about_postgres_not_the_work() {
        let refused = StoreError::Database(sqlx::Error::Io(std::io::Error::from(
            std::io::ErrorKind::ConnectionRefused,
        )));
        let pool = StoreError::Database(sqlx::Error::PoolTimedOut);
        // What a connection attempt reports while PostgreSQL is stopping or starting.
        let unanswered = StoreError::Database(sqlx::Error::Protocol(
            "unexpected response from SSLRequest: 0x00 (sqlx-postgres/src/connection/tls.rs:95)"
                .into(),
        ));
        for error in [&refused, &pool, &unanswered] {
            assert!(error.is_unavailable() && error.is_transient(), "{error}");
        }
        let bug = StoreError::Corrupt("a row".into());
        assert!(!bug.is_unavailable() && !bug.is_transient());
        let raced = StoreError::Raced("a key".into());
        assert!(!raced.is_unavailable() && !raced.is_transient());
        let garbled = StoreError::Database(sqlx::Error::Protocol(
            "unexpected response from SSLRequest: 0x45".into(),
        ));
        assert!(!garbled.is_unavailable(), "a server that answered, wrongly");
    }
}
