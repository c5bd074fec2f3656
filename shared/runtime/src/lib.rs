//! What every palisade process needs before it can do its job: settings read from the
//! environment and validated once, PostgreSQL and NATS connections checked at start-up
//! (server version, streams, migrations), and a shutdown signal.

pub mod env;

use std::time::Duration;

use bus::{Bus, StreamSettings};
use messages::Subjects;
use store::{DatabaseSettings, PgPool};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

pub use env::SettingsError;

/// Settings every service shares.
#[derive(Debug, Clone)]
pub struct CommonSettings {
    pub database: DatabaseSettings,
    pub nats_url: String,
    pub subjects: Subjects,
    pub streams: StreamSettings,
}

impl CommonSettings {
    pub const NATS_URL_DEFAULT: &'static str = "nats://127.0.0.1:4222";

    /// `DATABASE_URL`, `NATS_URL`, `PALISADE_SUBJECT_PREFIX`, `PALISADE_STREAM_REPLICAS`,
    /// `PALISADE_DB_MAX_CONNECTIONS`.
    pub fn from_env() -> Result<Self, SettingsError> {
        let mut database = DatabaseSettings::new(env::string("DATABASE_URL", DatabaseSettings::DEFAULT_URL));
        database.max_connections = env::parse(
            "PALISADE_DB_MAX_CONNECTIONS",
            DatabaseSettings::MAX_CONNECTIONS_DEFAULT,
        )?;
        let prefix = env::string("PALISADE_SUBJECT_PREFIX", Subjects::DEFAULT_PREFIX);
        let subjects = Subjects::new(&prefix).map_err(|error| SettingsError::Invalid {
            name: "PALISADE_SUBJECT_PREFIX",
            value: prefix.clone(),
            reason: error.to_string(),
        })?;
        let replicas: usize = env::parse("PALISADE_STREAM_REPLICAS", 1)?;
        if !(1..=5).contains(&replicas) {
            return Err(SettingsError::Invalid {
                name: "PALISADE_STREAM_REPLICAS",
                value: replicas.to_string(),
                reason: "use 1 for a single server, 3 (or 5) on a cluster".into(),
            });
        }
        Ok(Self {
            database,
            nats_url: env::string("NATS_URL", Self::NATS_URL_DEFAULT),
            subjects,
            streams: StreamSettings { replicas },
        })
    }
}

#[derive(Debug, Error)]
pub enum StartupError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Bus(#[from] bus::BusError),
    #[error(
        "database schema is at migration {applied:?}, this build expects {expected}: run `palisade migrate` first"
    )]
    SchemaBehind { applied: Option<i64>, expected: i64 },
}

/// A process's connections, shared by the services it runs.
#[derive(Debug, Clone)]
pub struct Connections {
    pub pool: PgPool,
    pub bus: Bus,
}

impl Connections {
    /// Connects to both, refuses a NATS server that is too old, provisions the streams and
    /// checks the schema is migrated.
    pub async fn open(settings: &CommonSettings, client_name: &str) -> Result<Self, StartupError> {
        let pool = store::connect(&settings.database).await?;
        let applied = store::applied_migration_version(&pool).await.unwrap_or(None);
        let expected = store::expected_migration_version();
        if applied.is_none_or(|applied| applied < expected) {
            return Err(StartupError::SchemaBehind { applied, expected });
        }
        let bus = Bus::connect(&settings.nats_url, settings.subjects.clone(), client_name).await?;
        bus.provision(&settings.streams).await?;
        Ok(Self { pool, bus })
    }
}

/// Cancelled on SIGINT or SIGTERM.
pub fn shutdown_on_signal() -> CancellationToken {
    let token = CancellationToken::new();
    let cancel = token.clone();
    tokio::spawn(async move {
        let ctrl_c = tokio::signal::ctrl_c();
        #[cfg(unix)]
        {
            let mut terminate =
                tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
                    .expect("SIGTERM handler installs");
            tokio::select! {
                _ = ctrl_c => {}
                _ = terminate.recv() => {}
            }
        }
        #[cfg(not(unix))]
        let _ = ctrl_c.await;
        tracing::info!("shutdown requested");
        cancel.cancel();
    });
    token
}

/// `Duration` from milliseconds, for settings.
pub fn millis(ms: u64) -> Duration {
    Duration::from_millis(ms)
}
