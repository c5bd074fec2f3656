//! Logging and tracing set-up shared by every palisade binary: fmt logs always; OTLP span
//! export (gRPC or HTTP/protobuf) when the standard `OTEL_EXPORTER_OTLP_*` variables ask for it.

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;

use thiserror::Error;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer, Registry};

/// How a process logs.
#[derive(Debug, Clone, Default)]
pub struct TelemetrySettings {
    /// JSON lines instead of human-readable text (`PALISADE_LOG_FORMAT=json`).
    pub json: bool,
    /// Filter used when `RUST_LOG` is unset (`info` when empty).
    pub default_filter: String,
    /// Where spans are exported; `None` (no `OTEL_EXPORTER_OTLP_*ENDPOINT` set) exports none.
    pub otlp: Option<OtlpSettings>,
}

/// OTLP span export.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OtlpSettings {
    pub protocol: OtlpProtocol,
    /// The collector; `None` lets the exporter read `OTEL_EXPORTER_OTLP_(TRACES_)ENDPOINT`
    /// itself (for HTTP it then appends `/v1/traces` to the generic variable, as specified).
    /// An explicit HTTP endpoint is the full URL including `/v1/traces`.
    pub endpoint: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OtlpProtocol {
    Grpc,
    HttpProtobuf,
}

impl OtlpSettings {
    /// `None` unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is
    /// set; protocol from `OTEL_EXPORTER_OTLP_TRACES_PROTOCOL`, then
    /// `OTEL_EXPORTER_OTLP_PROTOCOL` (`grpc`, the default, or `http/protobuf`).
    pub fn from_env() -> Result<Option<Self>, TelemetryError> {
        let set = |name: &str| std::env::var(name).is_ok_and(|value| !value.is_empty());
        if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
            return Ok(None);
        }
        let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            .ok()
            .filter(|value| !value.is_empty())
            .or_else(|| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL").ok())
            .unwrap_or_default();
        let protocol = match protocol.as_str() {
            "" | "grpc" => OtlpProtocol::Grpc,
            "http/protobuf" => OtlpProtocol::HttpProtobuf,
            other => return Err(TelemetryError::OtlpProtocol(other.to_owned())),
        };
        Ok(Some(Self {
            protocol,
            endpoint: None,
        }))
    }
}

impl TelemetrySettings {
    /// Reads `PALISADE_LOG_FORMAT` (`text`, the default, or `json`).
    pub fn from_env() -> Result<Self, TelemetryError> {
        match std::env::var("PALISADE_LOG_FORMAT").as_deref() {
            Err(_) | Ok("") | Ok("text") => Ok(Self {
                json: false,
                default_filter: String::new(),
                otlp: OtlpSettings::from_env()?,
            }),
            Ok("json") => Ok(Self {
                json: true,
                default_filter: String::new(),
                otlp: OtlpSettings::from_env()?,
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
    #[error("OTEL_EXPORTER_OTLP_PROTOCOL={0:?} is not supported: use `grpc` or `http/protobuf`")]
    OtlpProtocol(String),
    #[error("failed to build the OTLP span exporter: {0}")]
    Exporter(String),
}

/// Spans not yet exported when the process stops are flushed for at most this long.
pub const SHUTDOWN_TIMEOUT: Duration = Duration::from_secs(5);

/// Keeps telemetry running; dropping it flushes and stops span export (on a blocking thread,
/// at most `SHUTDOWN_TIMEOUT`).
#[derive(Debug)]
pub struct TelemetryGuard {
    _service_name: String,
    provider: Option<SdkTracerProvider>,
}

impl TelemetryGuard {
    /// Exports every finished span now (tests; a no-op when export is off).
    pub async fn flush(&self) {
        let Some(provider) = self.provider.clone() else {
            return;
        };
        let flushed = tokio::task::spawn_blocking(move || provider.force_flush()).await;
        if let Ok(Err(error)) = flushed {
            tracing::warn!(%error, "span flush failed");
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let Some(provider) = self.provider.take() else {
            return;
        };
        // Shutting down blocks on the exporter; never block a runtime thread with it.
        let stopped = std::thread::spawn(move || provider.shutdown_with_timeout(SHUTDOWN_TIMEOUT));
        let _ = stopped.join();
    }
}

/// The tracer provider exporting to `otlp`, with resource `service.name` = `service_name`
/// unless `OTEL_SERVICE_NAME` says otherwise. Must run inside the tokio runtime (tonic).
fn tracer_provider(
    service_name: &str,
    otlp: &OtlpSettings,
) -> Result<SdkTracerProvider, TelemetryError> {
    let exporter = match otlp.protocol {
        OtlpProtocol::Grpc => {
            let builder = opentelemetry_otlp::SpanExporter::builder().with_tonic();
            match &otlp.endpoint {
                Some(endpoint) => builder.with_endpoint(endpoint.clone()).build(),
                None => builder.build(),
            }
        }
        OtlpProtocol::HttpProtobuf => {
            let builder = opentelemetry_otlp::SpanExporter::builder()
                .with_http()
                .with_protocol(opentelemetry_otlp::Protocol::HttpBinary);
            match &otlp.endpoint {
                Some(endpoint) => builder.with_endpoint(endpoint.clone()).build(),
                None => builder.build(),
            }
        }
    }
    .map_err(|error| TelemetryError::Exporter(error.to_string()))?;
    let service_name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| service_name.to_owned());
    let resource = Resource::builder().with_service_name(service_name).build();
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build())
}

/// Installs the global subscriber for `service_name`. Log level from `RUST_LOG` (default
/// `info`). With `settings.otlp`, spans are also exported and W3C trace context is the global
/// propagator.
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
    let provider = settings
        .otlp
        .as_ref()
        .map(|otlp| tracer_provider(service_name, otlp))
        .transpose()?;
    // `RUST_LOG` (or a quieter default such as the demo's) filters logs only: spans at
    // `info` are exported whatever the log level.
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> = Vec::new();
    if let Some(provider) = &provider {
        layers.push(
            tracing_opentelemetry::layer()
                .with_tracer(provider.tracer("palisade"))
                .with_filter(LevelFilter::INFO)
                .boxed(),
        );
    }
    layers.push(if settings.json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .with_filter(filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer().with_filter(filter).boxed()
    });
    let installed = tracing_subscriber::registry().with(layers).try_init();
    installed.map_err(|error| TelemetryError::AlreadyInstalled(error.to_string()))?;
    if let Some(provider) = &provider {
        opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
        opentelemetry::global::set_tracer_provider(provider.clone());
    }
    Ok(TelemetryGuard {
        _service_name: service_name.to_owned(),
        provider,
    })
}
