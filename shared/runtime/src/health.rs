//! The HTTP endpoints every palisade process serves: `GET /metrics` (see `metrics`),
//! `GET /healthz` answers 200 while the process runs; `GET /readyz` answers 200 when
//! PostgreSQL answers, NATS is connected, palisade's streams (the four and the artifact
//! bucket's) exist and the schema is one this build runs on, else 503 naming each failing check
//! and what to do about it. Readiness is re-checked at most once per [`READINESS_AGE_MAX`], so
//! a storm of probes costs PostgreSQL one query.
//!
//! One server per process: the service binaries start it from their `run_until_stopped`, the
//! all-in-one `System` starts one for all the services it runs.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bus::Bus;
use bus::async_nats::connection::State as NatsState;
use serde::Serialize;
use store::PgPool;
use thiserror::Error;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::MetricsSource;
use crate::{CommonSettings, Connections, SettingsError, env};

/// The variable that sets where the health endpoints listen.
pub const HTTP_ADDR_VAR: &str = "PALISADE_HTTP_ADDR";
/// Where the health endpoints listen unless [`HTTP_ADDR_VAR`] says otherwise.
pub const HTTP_ADDR_DEFAULT: SocketAddr = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), 9090);
/// One check may take this long before it counts as failing, so a probe is answered within
/// about this even when a dependency hangs.
pub const CHECK_TIME_MAX: Duration = Duration::from_secs(1);
/// A readiness answer is reused for this long: probes cannot load PostgreSQL, and an outage
/// shows within this plus [`CHECK_TIME_MAX`].
pub const READINESS_AGE_MAX: Duration = Duration::from_secs(1);

/// The names of the checks, as they appear in the `/readyz` body.
pub mod checks {
    pub const POSTGRES: &str = "postgres";
    pub const NATS: &str = "nats";
    pub const STREAMS: &str = "streams";
    pub const MIGRATIONS: &str = "migrations";
    /// No durable consumer of this process holds messages it cannot decide.
    pub const CONSUMERS: &str = "consumers";
}

#[derive(Debug, Error)]
pub enum HealthError {
    #[error(
        "cannot listen on {addr} for /healthz and /readyz: {source}; set PALISADE_HTTP_ADDR to a free host:port, or to `off`"
    )]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// `PALISADE_HTTP_ADDR`: a `host:port` (default `0.0.0.0:9090`), or `off` / `disabled` for no
/// health server.
pub fn http_addr_from_env() -> Result<Option<SocketAddr>, SettingsError> {
    parse_http_addr(&env::string(HTTP_ADDR_VAR, ""))
}

/// Parses a [`HTTP_ADDR_VAR`] value; empty means the default.
pub fn parse_http_addr(value: &str) -> Result<Option<SocketAddr>, SettingsError> {
    let trimmed = value.trim();
    if trimmed.is_empty() {
        return Ok(Some(HTTP_ADDR_DEFAULT));
    }
    if trimmed.eq_ignore_ascii_case("off") || trimmed.eq_ignore_ascii_case("disabled") {
        return Ok(None);
    }
    trimmed
        .parse()
        .map(Some)
        .map_err(|error| SettingsError::Invalid {
            name: HTTP_ADDR_VAR,
            value: value.to_owned(),
            reason: format!("{error}; use host:port such as 0.0.0.0:9090, or `off`"),
        })
}

/// Binds `addr` (port 0 picks a free port) and serves `/healthz` and `/readyz` until
/// `shutdown`; returns the bound address.
pub async fn serve_health(
    addr: SocketAddr,
    common: &CommonSettings,
    connections: Connections,
    shutdown: CancellationToken,
) -> Result<SocketAddr, HealthError> {
    HealthServer::new(addr, common, connections)
        .serve(shutdown)
        .await
}

/// A health server not started yet: where it will listen and what it checks. Cheap to clone.
#[derive(Debug, Clone)]
pub struct HealthServer {
    addr: SocketAddr,
    readiness: Arc<Readiness>,
    metrics: Arc<MetricsSource>,
}

/// One check's result in the `/readyz` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct CheckReport {
    pub name: &'static str,
    /// `ok` or `failing`.
    pub state: &'static str,
    /// What is wrong and what to do, when failing.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

/// The `/readyz` body.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ReadinessReport {
    /// `ready` or `not_ready`.
    pub status: &'static str,
    pub checks: Vec<CheckReport>,
    /// Every failing check's message, joined, when not ready.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl HealthServer {
    pub fn new(addr: SocketAddr, common: &CommonSettings, connections: Connections) -> Self {
        let subjects = connections.bus.subjects();
        let streams = [
            subjects.requests_stream(),
            subjects.events_stream(),
            subjects.results_stream(),
            subjects.uploads_stream(),
            subjects.artifacts_stream(),
        ];
        Self {
            addr,
            metrics: Arc::new(MetricsSource::new(
                connections.pool.clone(),
                connections.bus.clone(),
                common.metrics,
            )),
            readiness: Arc::new(Readiness {
                pool: connections.pool,
                bus: connections.bus,
                database_url: store::redact_url(&common.database.url),
                nats_url: common.nats_url.clone(),
                streams,
                cached: Mutex::new(None),
            }),
        }
    }

    /// Binds and serves in a task of its own until `shutdown`; returns the bound address.
    pub async fn serve(&self, shutdown: CancellationToken) -> Result<SocketAddr, HealthError> {
        let bind_error = |source| HealthError::Bind {
            addr: self.addr,
            source,
        };
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .map_err(bind_error)?;
        let bound = listener.local_addr().map_err(bind_error)?;
        let app = router(self.readiness.clone(), self.metrics.clone());
        tokio::spawn(async move {
            let served = axum::serve(listener, app)
                .with_graceful_shutdown(shutdown.cancelled_owned())
                .await;
            if let Err(error) = served {
                tracing::error!(error = %telemetry::chain(&error), addr = %bound, "health server stopped");
            }
        });
        tracing::info!(addr = %bound, "serving /healthz, /readyz and /metrics");
        Ok(bound)
    }
}

/// The routes, all on one listener.
fn router(readiness: Arc<Readiness>, metrics: Arc<MetricsSource>) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(readiness)
        .merge(
            Router::new()
                .route("/metrics", get(metrics_text))
                .with_state(metrics),
        )
}

async fn metrics_text(State(metrics): State<Arc<MetricsSource>>) -> Response {
    let text =
        telemetry::cost::in_lane(telemetry::cost::lanes::OBSERVABILITY, metrics.render()).await;
    (
        [(
            axum::http::header::CONTENT_TYPE,
            crate::metrics::CONTENT_TYPE,
        )],
        text,
    )
        .into_response()
}

async fn healthz() -> &'static str {
    "ok"
}

async fn readyz(State(readiness): State<Arc<Readiness>>) -> Response {
    let report =
        telemetry::cost::in_lane(telemetry::cost::lanes::OBSERVABILITY, readiness.report()).await;
    let status = if report.message.is_none() {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (status, axum::Json(report.as_ref().clone())).into_response()
}

/// What `/readyz` checks, and its last answer.
struct Readiness {
    pool: PgPool,
    bus: Bus,
    /// Without its password.
    database_url: String,
    nats_url: String,
    streams: [String; 5],
    /// The last answer and when it was made; the lock also makes concurrent probes wait for
    /// one check instead of each running their own.
    cached: Mutex<Option<(Instant, Arc<ReadinessReport>)>>,
}

impl std::fmt::Debug for Readiness {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readiness")
            .field("database_url", &self.database_url)
            .field("nats_url", &self.nats_url)
            .field("streams", &self.streams)
            .finish_non_exhaustive()
    }
}

impl Readiness {
    /// The cached answer while it is fresh, else a new one (logged when readiness changed).
    async fn report(&self) -> Arc<ReadinessReport> {
        let mut cached = self.cached.lock().await;
        if let Some((checked_at, report)) = cached.as_ref()
            && checked_at.elapsed() < READINESS_AGE_MAX
        {
            return report.clone();
        }
        let report = Arc::new(self.check().await);
        let was_ready = cached
            .as_ref()
            .is_none_or(|(_, previous)| previous.message.is_none());
        match (&report.message, was_ready) {
            (Some(message), true) => tracing::warn!(%message, "not ready"),
            (None, false) => tracing::info!("ready again"),
            _ => {}
        }
        *cached = Some((Instant::now(), report.clone()));
        report
    }

    /// Runs every check at once, each bounded by [`CHECK_TIME_MAX`].
    async fn check(&self) -> ReadinessReport {
        let (postgres, streams, migrations) = tokio::join!(
            self.check_postgres(),
            self.check_streams(),
            self.check_migrations()
        );
        let nats = self.check_nats();
        let checks: Vec<CheckReport> = [
            (checks::POSTGRES, postgres),
            (checks::NATS, nats),
            (checks::STREAMS, streams),
            (checks::MIGRATIONS, migrations),
            (
                checks::CONSUMERS,
                check_consumers(&bus::consume::held_messages()),
            ),
        ]
        .into_iter()
        .map(|(name, result)| match result {
            Ok(()) => CheckReport {
                name,
                state: "ok",
                message: None,
            },
            Err(message) => CheckReport {
                name,
                state: "failing",
                message: Some(message),
            },
        })
        .collect();
        let failing: Vec<&str> = checks
            .iter()
            .filter_map(|check| check.message.as_deref())
            .collect();
        ReadinessReport {
            status: if failing.is_empty() {
                "ready"
            } else {
                "not_ready"
            },
            message: (!failing.is_empty()).then(|| failing.join("; ")),
            checks,
        }
    }

    async fn check_postgres(&self) -> Result<(), String> {
        match tokio::time::timeout(CHECK_TIME_MAX, store::ping(&self.pool)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(error)) => Err(format!(
                "PostgreSQL unreachable at {}: {error}; check that it runs and that DATABASE_URL points at it",
                self.database_url
            )),
            Err(_) => Err(format!(
                "PostgreSQL unreachable at {}: no answer to SELECT 1 within {} ms; check that it runs, that DATABASE_URL points at it, and that it is not overloaded",
                self.database_url,
                CHECK_TIME_MAX.as_millis()
            )),
        }
    }

    fn check_nats(&self) -> Result<(), String> {
        match self.bus.client().connection_state() {
            NatsState::Connected => Ok(()),
            state => Err(format!(
                "NATS not connected at {} ({state}); the client reconnects by itself, check that the server runs and that NATS_URL points at it",
                self.nats_url
            )),
        }
    }

    async fn check_streams(&self) -> Result<(), String> {
        if self.bus.client().connection_state() != NatsState::Connected {
            return Err("JetStream streams not checked while NATS is not connected".to_owned());
        }
        let lookups = self.streams.iter().map(|name| async move {
            match tokio::time::timeout(CHECK_TIME_MAX, self.bus.jetstream().get_stream(name)).await
            {
                Ok(Ok(_)) => None,
                Ok(Err(error)) if stream_missing(&error) => {
                    Some((true, format!("{name} ({error})")))
                }
                Ok(Err(error)) => Some((false, format!("{name} ({error})"))),
                Err(_) => Some((
                    false,
                    format!(
                        "{name} (no answer within {} ms)",
                        CHECK_TIME_MAX.as_millis()
                    ),
                )),
            }
        });
        let failing: Vec<(bool, String)> = futures::future::join_all(lookups)
            .await
            .into_iter()
            .flatten()
            .collect();
        let listed = |missing: bool| {
            failing
                .iter()
                .filter(|(is_missing, _)| *is_missing == missing)
                .map(|(_, stream)| stream.as_str())
                .collect::<Vec<_>>()
        };
        let (missing, unanswered) = (listed(true), listed(false));
        let mut problems = Vec::new();
        if !missing.is_empty() {
            problems.push(format!(
                "JetStream streams missing: {}; restart a palisade service to provision them",
                missing.join(", ")
            ));
        }
        // On a cluster, a stream whose leader was lost answers nothing until its replicas
        // elect another (seconds); restarting palisade would not help.
        if !unanswered.is_empty() {
            problems.push(format!(
                "JetStream streams not answering: {}; on a NATS cluster that lost a server this lasts until the stream elects a new leader (seconds), else check the NATS servers",
                unanswered.join(", ")
            ));
        }
        if problems.is_empty() {
            Ok(())
        } else {
            Err(problems.join("; "))
        }
    }

    async fn check_migrations(&self) -> Result<(), String> {
        let checked =
            tokio::time::timeout(CHECK_TIME_MAX, store::schema::check_runnable(&self.pool)).await;
        match checked {
            // The same window as at start-up: a newer schema only if every newer migration is
            // marked backward compatible (`store::schema`).
            Ok(Ok(_)) => Ok(()),
            Ok(Err(store::StoreError::Schema(refused))) => Err(refused.to_string()),
            Ok(Err(error)) => Err(format!(
                "migration version unknown ({error}); it is checked again once PostgreSQL answers"
            )),
            Err(_) => Err(format!(
                "migration version unknown: PostgreSQL did not answer within {} ms",
                CHECK_TIME_MAX.as_millis()
            )),
        }
    }
}

/// Failing while a durable consumer holds messages it could not decide (PostgreSQL or NATS
/// unavailable): it fetches nothing until they are decided.
/// Whether a stream lookup failed because the stream does not exist (as opposed to going
/// unanswered while its leader is elected).
fn stream_missing(error: &bus::async_nats::jetstream::context::GetStreamError) -> bool {
    use bus::async_nats::jetstream::context::GetStreamErrorKind;
    matches!(
        error.kind(),
        GetStreamErrorKind::JetStream(error)
            if error.error_code() == bus::async_nats::jetstream::ErrorCode::STREAM_NOT_FOUND
    )
}

fn check_consumers(held: &[(String, usize)]) -> Result<(), String> {
    if held.is_empty() {
        return Ok(());
    }
    let holding: Vec<String> = held
        .iter()
        .map(|(consumer, count)| format!("{consumer} holds {count}"))
        .collect();
    Err(format!(
        "consumers hold messages they cannot decide yet ({}); they fetch nothing until \
         PostgreSQL and NATS answer again, then decide them",
        holding.join(", ")
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn consumers_fail_readiness_only_while_holding() {
        assert_eq!(check_consumers(&[]), Ok(()));
        let message = check_consumers(&[("admission".into(), 5), ("ingestion".into(), 1)])
            .expect_err("holding is not ready");
        assert!(
            message.contains("admission holds 5") && message.contains("ingestion holds 1"),
            "{message}"
        );
    }

    #[test]
    fn http_addr_defaults_turns_off_and_names_the_variable() {
        assert_eq!(parse_http_addr("").unwrap(), Some(HTTP_ADDR_DEFAULT));
        assert_eq!(parse_http_addr(" off ").unwrap(), None);
        assert_eq!(parse_http_addr("Disabled").unwrap(), None);
        assert_eq!(
            parse_http_addr("127.0.0.1:0").unwrap(),
            Some("127.0.0.1:0".parse().unwrap())
        );
        let error = parse_http_addr("localhost").unwrap_err().to_string();
        assert!(error.contains(HTTP_ADDR_VAR), "{error}");
    }
}
