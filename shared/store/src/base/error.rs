//! [`StoreError`]: failures of the database itself, and how consumers classify them
//! (unavailable: hold the work; transient: retry it; data refused: refuse it).

use thiserror::Error;

use super::schema;

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

#[cfg(test)]
mod tests {
    use super::*;

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
