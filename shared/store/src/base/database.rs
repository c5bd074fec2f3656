//! Reaching PostgreSQL: the pool ([`connect`]), the database itself (create, drop, name in a
//! URL, redaction for messages) and the schema ([`migrate`], then the online index builds).

use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{PgPool, Postgres};

use super::{online_indexes, schema, sql};
use crate::StoreError;

/// The embedded migrations under `migrations/`.
pub static MIGRATOR: sqlx::migrate::Migrator = sqlx::migrate!("../../migrations");

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
}
