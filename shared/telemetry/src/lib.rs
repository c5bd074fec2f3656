//! Logging and tracing set-up shared by every palisade binary.

use thiserror::Error;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// How a process logs.
#[derive(Debug, Clone, Default)]
pub struct TelemetrySettings {
    /// JSON lines instead of human-readable text (`PALISADE_LOG_FORMAT=json`).
    pub json: bool,
    /// Filter used when `RUST_LOG` is unset (`info` when empty).
    pub default_filter: String,
}

impl TelemetrySettings {
    /// Reads `PALISADE_LOG_FORMAT` (`text`, the default, or `json`).
    pub fn from_env() -> Result<Self, TelemetryError> {
        match std::env::var("PALISADE_LOG_FORMAT").as_deref() {
            Err(_) | Ok("") | Ok("text") => Ok(Self {
                json: false,
                default_filter: String::new(),
            }),
            Ok("json") => Ok(Self {
                json: true,
                default_filter: String::new(),
            }),
            Ok(other) => Err(TelemetryError::LogFormat(other.to_owned())),
        }
    }
}

#[derive(Debug, Error)]
pub enum TelemetryError {
    #[error("PALISADE_LOG_FORMAT={0:?} is not supported: use `text` or `json`")]
    LogFormat(String),
    #[error("a global logger is already installed: {0}")]
    AlreadyInstalled(String),
}

/// Keeps telemetry running; dropping it flushes.
#[derive(Debug)]
pub struct TelemetryGuard {
    _service_name: String,
}

/// Installs the global subscriber for `service_name`. Log level from `RUST_LOG` (default `info`).
pub fn init(
    service_name: &str,
    settings: &TelemetrySettings,
) -> Result<TelemetryGuard, TelemetryError> {
    let default_filter = if settings.default_filter.is_empty() {
        "info"
    } else {
        &settings.default_filter
    };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let registry = tracing_subscriber::registry().with(filter);
    let installed = if settings.json {
        registry
            .with(
                tracing_subscriber::fmt::layer()
                    .json()
                    .with_current_span(true),
            )
            .try_init()
    } else {
        registry.with(tracing_subscriber::fmt::layer()).try_init()
    };
    installed.map_err(|error| TelemetryError::AlreadyInstalled(error.to_string()))?;
    Ok(TelemetryGuard {
        _service_name: service_name.to_owned(),
    })
}
