//! What every palisade process needs before it can do its job: settings read from the
//! environment and validated once, PostgreSQL and NATS connections checked at start-up
//! (server version, streams, migrations), a shutdown signal, the `/healthz`, `/readyz`
//! (`health`) and `/metrics` (`metrics`) endpoints, and the `plumbing` every service starts
//! beside its own work (those endpoints and the outbox relay).

/// The allocator of every process that links this crate (the services, the `palisade`
/// command, the tests): mimalloc, measured against the system allocator on palisade's many
/// small, short-lived allocations (a quarter of the process's samples were in malloc/free;
/// docs/performance.md, "Allocator").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

pub mod artifacts;
pub mod deciders;
pub mod env;
pub mod health;
pub mod metrics;
pub mod plumbing;

pub use artifacts::ArtifactLimits;

use std::time::Duration;

use bus::{Bus, StreamSettings};
use messages::{Identity, Subjects};
use store::{DatabaseSettings, PgPool};
use thiserror::Error;
use tokio_util::sync::CancellationToken;

pub use env::SettingsError;
pub use plumbing::{Plumbing, RunningPlumbing};

/// Settings every service shares.
#[derive(Debug, Clone)]
pub struct CommonSettings {
    pub database: DatabaseSettings,
    pub nats_url: String,
    /// `NATS_CREDS`: the `.creds` file this process connects with; none for a server
    /// without authentication.
    pub nats_credentials: bus::NatsCredentials,
    /// `NATS_TLS_CA`, `NATS_TLS_CERT`, `NATS_TLS_KEY`, `NATS_TLS_REQUIRED`.
    pub nats_tls: bus::NatsTls,
    pub subjects: Subjects,
    pub streams: StreamSettings,
    /// How `/metrics` computes its database gauges (the live-worker window follows the lease
    /// TTL dispatch grants, so every process reads `PALISADE_LEASE_TTL_MS`).
    pub metrics: metrics::MetricsSettings,
    /// Whether `scan.admitted`, `task.leased` and `task.completed` are written
    /// (`PALISADE_PROGRESS_EVENTS`, `on` or `off`; default `on`).
    pub progress_events: store::ProgressEvents,
    /// Where committed artifacts are kept (`PALISADE_ARTIFACT_STORE`, `nats` or `s3`, and
    /// the `PALISADE_S3_*` settings): ingestion, the reaper and `palisade artifact get` use it.
    pub artifact_store: artifacts::ArtifactStoreSettings,
}

impl CommonSettings {
    pub const NATS_URL_DEFAULT: &'static str = "nats://127.0.0.1:4222";

    /// `DATABASE_URL`, `NATS_URL`, `NATS_CREDS`, `NATS_TLS_*`, `PALISADE_SUBJECT_PREFIX`, `PALISADE_STREAM_REPLICAS`,
    /// `PALISADE_QUOTA_REQUESTS_WAITING`, `PALISADE_QUOTA_RESULTS_WAITING`, `PALISADE_STREAM_BYTES_MAX`,
    /// `PALISADE_DB_MAX_CONNECTIONS`, `PALISADE_DB_ACQUIRE_TIMEOUT_MS`, `PALISADE_LEASE_TTL_MS`,
    /// `PALISADE_PROGRESS_EVENTS`, `PALISADE_ARTIFACT_STORE` and `PALISADE_S3_*`.
    pub fn from_env() -> Result<Self, SettingsError> {
        let mut database =
            DatabaseSettings::new(env::string("DATABASE_URL", DatabaseSettings::DEFAULT_URL));
        database.max_connections = env::parse(
            "PALISADE_DB_MAX_CONNECTIONS",
            DatabaseSettings::MAX_CONNECTIONS_DEFAULT,
        )?;
        database.acquire_timeout = std::time::Duration::from_millis(env::parse_in(
            "PALISADE_DB_ACQUIRE_TIMEOUT_MS",
            DatabaseSettings::ACQUIRE_TIMEOUT_DEFAULT.as_millis() as u64,
            100..=600_000,
        )?);
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
            nats_credentials: match env::optional_string("NATS_CREDS") {
                Some(path) => bus::NatsCredentials::from_file(std::path::Path::new(&path))
                    .map_err(|error| SettingsError::Invalid {
                        name: "NATS_CREDS",
                        value: path,
                        reason: error.to_string(),
                    })?,
                None => bus::NatsCredentials::none(),
            },
            nats_tls: nats_tls_from_env()?,
            subjects,
            streams: StreamSettings {
                replicas,
                quotas: stream_quotas_from_env()?,
            },
            metrics: metrics::MetricsSettings::from_env()?,
            progress_events: env::parse("PALISADE_PROGRESS_EVENTS", store::ProgressEvents::On)?,
            artifact_store: artifacts::ArtifactStoreSettings::from_env()?,
        })
    }
}

/// `PALISADE_QUOTA_REQUESTS_WAITING`, `PALISADE_QUOTA_RESULTS_WAITING` and
/// `PALISADE_STREAM_BYTES_MAX` ([`bus::StreamQuotas`]). Every service provisions the streams
/// with them: give every service the same values.
fn stream_quotas_from_env() -> Result<bus::StreamQuotas, SettingsError> {
    use bus::StreamQuotas as Q;
    Ok(Q {
        requests_waiting_per_client: waiting_quota_from_env(
            "PALISADE_QUOTA_REQUESTS_WAITING",
            Q::REQUESTS_WAITING_PER_CLIENT_DEFAULT,
        )?,
        results_waiting_per_worker: waiting_quota_from_env(
            "PALISADE_QUOTA_RESULTS_WAITING",
            Q::RESULTS_WAITING_PER_WORKER_DEFAULT,
        )?,
        stream_bytes_max: env::parse_in(
            "PALISADE_STREAM_BYTES_MAX",
            Q::STREAM_BYTES_MAX_DEFAULT,
            16 * 1024 * 1024..=i64::MAX,
        )?,
        chunks_stored_per_upload: Q::chunks_stored_per_upload_for(
            ArtifactLimits::from_env()?.bytes_max,
        ),
        fit_stream_bytes: env::optional_string("PALISADE_STREAM_BYTES_MAX").is_none(),
    })
}

/// A quota of waiting messages: as set, or fitted to the stream's bytes (at most `max`) when
/// the variable is not set.
fn waiting_quota_from_env(
    name: &'static str,
    max: i64,
) -> Result<bus::WaitingQuota, SettingsError> {
    Ok(match env::optional_string(name) {
        Some(_) => bus::WaitingQuota::Set(env::parse_in(name, max, 1..=100_000_000)?),
        None => bus::WaitingQuota::Fitted { max },
    })
}

/// The attempt budget of every task of a scan, when no setting gives one.
pub const MAX_ATTEMPTS_DEFAULT: i32 = 3;

/// The attempt budget of every task of an admitted scan (`PALISADE_MAX_ATTEMPTS`, default
/// [`MAX_ATTEMPTS_DEFAULT`]): admission reads it, and the reaper for the scans schedules
/// submit.
pub fn max_attempts_from_env() -> Result<i32, SettingsError> {
    env::parse_in("PALISADE_MAX_ATTEMPTS", MAX_ATTEMPTS_DEFAULT, 1..=100)
}

/// The backoff of retried work (`PALISADE_RETRY_BASE_MS`, default 5000, and
/// `PALISADE_RETRY_CAP_MS`, default 300000): failed tasks and enrichment jobs.
pub fn retry_policy_from_env() -> Result<messages::retry::RetryPolicy, SettingsError> {
    retry_policy_from_vars(
        ("PALISADE_RETRY_BASE_MS", 5_000),
        ("PALISADE_RETRY_CAP_MS", 300_000),
    )
}

/// A backoff policy read from a base and a cap variable (milliseconds, with their defaults):
/// the base above 0, the cap at least the base.
pub fn retry_policy_from_vars(
    (base_name, base_default): (&'static str, u64),
    (cap_name, cap_default): (&'static str, u64),
) -> Result<messages::retry::RetryPolicy, SettingsError> {
    let base = Duration::from_millis(env::parse(base_name, base_default)?);
    let cap = Duration::from_millis(env::parse(cap_name, cap_default)?);
    if base.is_zero() || cap < base {
        return Err(SettingsError::Invalid {
            name: cap_name,
            value: cap.as_millis().to_string(),
            reason: format!("the cap must be at least {base_name}, and the base above 0"),
        });
    }
    Ok(messages::retry::RetryPolicy::new(base, cap))
}

/// [`bus::NatsTls::from_env`], its refusal as a settings error naming the variable.
pub fn nats_tls_from_env() -> Result<bus::NatsTls, SettingsError> {
    bus::NatsTls::from_env().map_err(|error| SettingsError::Invalid {
        name: error.setting,
        value: std::env::var(error.setting).unwrap_or_default(),
        reason: error.reason,
    })
}

#[derive(Debug, Error)]
pub enum StartupError {
    #[error(transparent)]
    Store(#[from] store::StoreError),
    #[error(transparent)]
    Bus(#[from] bus::BusError),
    /// The schema is older than this build, or newer beyond the compatibility window
    /// (`store::schema`): the message names both versions and what to do.
    #[error(transparent)]
    Schema(store::schema::SchemaError),
}

/// A process's connections, shared by the services it runs.
#[derive(Debug, Clone)]
pub struct Connections {
    pub pool: PgPool,
    pub bus: Bus,
}

impl Connections {
    /// Connects to both, refuses a NATS server that is too old, provisions the streams and
    /// checks this build may run on the schema (`store::schema`: every migration it knows
    /// applied, and any newer one marked backward compatible).
    pub async fn open(
        settings: &CommonSettings,
        identity: &Identity,
    ) -> Result<Self, StartupError> {
        let pool = store::connect(&settings.database).await?;
        match store::schema::check_runnable(&pool).await {
            Ok(comparison) if !comparison.unknown.is_empty() => tracing::info!(
                applied = comparison.applied_max,
                expected = comparison.expected,
                "database schema is newer than this build; every newer migration is marked backward compatible"
            ),
            Ok(_) => {}
            Err(store::StoreError::Schema(refused)) => return Err(StartupError::Schema(refused)),
            Err(error) => return Err(error.into()),
        }
        let bus = Bus::connect(
            &settings.nats_url,
            &settings.nats_credentials,
            &settings.nats_tls,
            settings.subjects.clone(),
            identity,
        )
        .await?;
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

/// Lease timing, shared by dispatch (which grants and renews) and workers (told at hello).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseSettings {
    pub ttl: Duration,
    pub renew_interval: Duration,
}

impl LeaseSettings {
    pub const TTL_DEFAULT: Duration = Duration::from_secs(30);
    pub const RENEW_INTERVAL_DEFAULT: Duration = Duration::from_secs(10);
    pub const TTL_VAR: &'static str = "PALISADE_LEASE_TTL_MS";

    /// `PALISADE_LEASE_TTL_MS`, `PALISADE_RENEW_INTERVAL_MS`; a renew interval at or above the
    /// TTL is refused (every lease would expire between renewals).
    pub fn from_env() -> Result<Self, SettingsError> {
        let ttl = Self::ttl_from_env()?;
        let renew_interval = Duration::from_millis(env::parse(
            "PALISADE_RENEW_INTERVAL_MS",
            Self::RENEW_INTERVAL_DEFAULT.as_millis() as u64,
        )?);
        Self::new(ttl, renew_interval)
    }

    /// `PALISADE_LEASE_TTL_MS` alone, for processes that do not grant leases but measure
    /// them (`/metrics`).
    pub fn ttl_from_env() -> Result<Duration, SettingsError> {
        let ttl = Duration::from_millis(env::parse(
            Self::TTL_VAR,
            Self::TTL_DEFAULT.as_millis() as u64,
        )?);
        Self::check_ttl(ttl)?;
        Ok(ttl)
    }

    pub fn new(ttl: Duration, renew_interval: Duration) -> Result<Self, SettingsError> {
        Self::check_ttl(ttl)?;
        if renew_interval.is_zero() || renew_interval >= ttl {
            return Err(SettingsError::Invalid {
                name: "PALISADE_RENEW_INTERVAL_MS",
                value: renew_interval.as_millis().to_string(),
                reason: format!(
                    "must be above 0 and below the lease TTL ({} ms); a third of it is usual",
                    ttl.as_millis()
                ),
            });
        }
        Ok(Self {
            ttl,
            renew_interval,
        })
    }

    fn check_ttl(ttl: Duration) -> Result<(), SettingsError> {
        if ttl < Duration::from_millis(100) || ttl > Duration::from_secs(3_600) {
            return Err(SettingsError::Invalid {
                name: Self::TTL_VAR,
                value: ttl.as_millis().to_string(),
                reason: "must be 100..=3600000".into(),
            });
        }
        Ok(())
    }
}

impl Default for LeaseSettings {
    fn default() -> Self {
        Self {
            ttl: Self::TTL_DEFAULT,
            renew_interval: Self::RENEW_INTERVAL_DEFAULT,
        }
    }
}

/// Result batch limits, shared by ingestion (which enforces them) and workers (told at hello).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BatchLimits {
    pub findings_max: usize,
    pub bytes_max: usize,
}

impl BatchLimits {
    /// One INSERT of a full batch stays far below PostgreSQL's bind-parameter limit.
    pub const FINDINGS_MAX_DEFAULT: usize = 1_000;
    pub const BYTES_MAX_DEFAULT: usize = 1024 * 1024;

    /// `PALISADE_BATCH_FINDINGS_MAX`, `PALISADE_BATCH_BYTES_MAX`.
    pub fn from_env() -> Result<Self, SettingsError> {
        let findings_max = env::parse_in(
            "PALISADE_BATCH_FINDINGS_MAX",
            Self::FINDINGS_MAX_DEFAULT,
            1..=10_000,
        )?;
        let bytes_max = env::parse_in(
            "PALISADE_BATCH_BYTES_MAX",
            Self::BYTES_MAX_DEFAULT,
            1_024..=messages::limits::BATCH_BYTES_LIMIT,
        )?;
        Ok(Self {
            findings_max,
            bytes_max,
        })
    }
}

impl Default for BatchLimits {
    fn default() -> Self {
        Self {
            findings_max: Self::FINDINGS_MAX_DEFAULT,
            bytes_max: Self::BYTES_MAX_DEFAULT,
        }
    }
}

/// Records a message that exhausted its deliveries in `dead_letters` (once per consumer and
/// stream sequence), so an operator can see it and its reason; never loses it silently: an
/// `Err` (the record was not written) keeps the message held by the bus, not terminated.
pub async fn record_dead_letter(
    pool: &PgPool,
    consumer: &str,
    delivery: &bus::Delivery,
    reason: &str,
) -> Result<(), String> {
    let letter = store::dead_letters::DeadLetter {
        consumer,
        subject: delivery.subject(),
        stream_sequence: delivery.stream_sequence,
        delivered: delivery.delivered,
        reason,
        payload: delivery.payload(),
    };
    match store::dead_letters::record(pool, &letter).await {
        Ok(()) => {
            tracing::error!(
                consumer,
                subject = delivery.subject(),
                stream_sequence = delivery.stream_sequence,
                reason,
                "message dead after its last delivery; recorded in dead_letters"
            );
            Ok(())
        }
        // The message is held, not terminated, until its record is written.
        Err(error) => Err(format!(
            "could not record a dead message: {}",
            telemetry::chain(&error)
        )),
    }
}

/// The `internal` answer to a request palisade could not decide: a generic message naming an
/// error id, never the cause (database text can name tables, constraints and other tenants'
/// values). The cause goes only to the service's log line, which carries the same `error_id`,
/// so an operator finds it from what the client reports.
pub fn internal_error(
    what: &str,
    cause: &dyn std::fmt::Display,
    advice: &str,
) -> messages::v1::Error {
    let error_id = uuid::Uuid::new_v4().simple().to_string()[..16].to_owned();
    tracing::warn!(%error_id, cause = %cause, "{what} failed; answered internal");
    messages::v1::Error::new(
        messages::ErrorCode::Internal,
        format!("{what} failed inside palisade (error id {error_id}); {advice}"),
    )
}

/// Marks the current span (a request's `process` span) failed when the reply carries
/// `error`: a refused request is an ERROR span in its trace, with the error code
/// (`telemetry::record_error`).
pub fn record_refusal(error: Option<&messages::v1::Error>) {
    if let Some(error) = error {
        telemetry::record_error(&tracing::Span::current(), &error.code, &error.message);
    }
}

/// The wire lease, with a `lease` span recording the grant in the scan's trace: a child of
/// the scan's stored context, linked to the current span (the worker's acquire request, or
/// the completion whose acknowledgement carries it: its cause, but in another trace, so
/// parenting would lie). The worker's execution span is its child. A lease answered again (a
/// resent acquire) opens no second span: its `traceparent` is the scan's.
pub fn traced_lease(
    lease: &store::lease::GrantedLease,
    service: &'static str,
) -> messages::v1::Lease {
    let mut wire = lease.to_wire();
    // The lease span's id is the attempt's, so a replayed acquire (a worker asking again with
    // the same request id, to this replica or another) sends the context of the span opened
    // when the lease was granted, and the worker's work hangs under it.
    let span_id = lease_span_id(lease.attempt_id);
    if lease.replayed {
        if let Some(traceparent) = bus::trace::traceparent_with_span(&wire.traceparent, span_id) {
            wire.traceparent = traceparent;
        }
        return wire;
    }
    let span = tracing::info_span!(
        parent: None,
        "lease",
        otel.name = %format!("lease {}", lease.plugin),
        otel.kind = "internal",
        palisade.service = service,
        palisade.scan_id = %wire.scan_id,
        palisade.task_id = %lease.task_id,
        palisade.attempt_number = lease.attempt_number,
    );
    bus::trace::set_parent_from_traceparent(&span, &wire.traceparent);
    bus::trace::link_to(&span, &tracing::Span::current());
    if let Some(traceparent) =
        telemetry::with_span_id(span_id, || bus::trace::traceparent_of(&span))
    {
        wire.traceparent = traceparent;
    }
    wire
}

/// Records in the scan's trace that `by` cancelled it: a `cancel` span, a child of the scan's
/// stored context (`trace_context`), linked to the current span (the canceller's request or
/// command, in a trace of its own), so each trace leads to the other.
pub fn trace_cancel(scan_id: uuid::Uuid, trace_context: Option<&str>, by: &str, reason: &str) {
    let span = tracing::info_span!(
        parent: None,
        "cancel",
        otel.kind = "internal",
        palisade.scan_id = %scan_id,
        palisade.cancelled_by = by,
        palisade.reason = reason,
    );
    if let Some(traceparent) = trace_context {
        bus::trace::set_parent_from_traceparent(&span, traceparent);
    }
    bus::trace::link_to(&span, &tracing::Span::current());
    span.in_scope(|| tracing::info!(%scan_id, by, "scan cancelled"));
}

/// The id of the lease span of attempt `attempt_id`: the random half of the attempt's UUID
/// (never zero: its variant bits are set).
fn lease_span_id(attempt_id: uuid::Uuid) -> [u8; 8] {
    let mut span_id = [0; 8];
    span_id.copy_from_slice(&attempt_id.as_bytes()[8..]);
    span_id
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renew_interval_must_be_below_the_ttl() {
        let ttl = Duration::from_secs(30);
        assert!(LeaseSettings::new(ttl, Duration::from_secs(10)).is_ok());
        assert!(LeaseSettings::new(ttl, ttl).is_err());
        assert!(LeaseSettings::new(ttl, Duration::from_secs(31)).is_err());
        assert!(LeaseSettings::new(ttl, Duration::ZERO).is_err());
    }

    #[test]
    fn an_internal_answer_names_its_error_id_and_not_its_cause() {
        let cause = "duplicate key value violates unique constraint \"scans_org_key\"";
        let error = internal_error("deciding the request", &cause, "retry");
        assert_eq!(error.error_code(), Some(messages::ErrorCode::Internal));
        assert!(!error.message.contains("constraint"), "{}", error.message);
        let error_id = error
            .message
            .split("error id ")
            .nth(1)
            .and_then(|rest| rest.split(')').next())
            .expect("an error id");
        assert_eq!(error_id.len(), 16);
        assert!(error_id.chars().all(|c| c.is_ascii_hexdigit()));
        let other = internal_error("deciding the request", &cause, "retry");
        assert_ne!(error.message, other.message, "each answer has its own id");
    }
}
