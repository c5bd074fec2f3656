//! Logging and tracing set-up shared by every palisade binary: log lines (text or JSON) that
//! carry the OpenTelemetry ids of their span, always; OTLP span export (gRPC or HTTP/protobuf)
//! when the standard `OTEL_EXPORTER_OTLP_*` variables ask for it.

pub mod arguments;
pub mod cost;
mod logs;
pub mod metrics;

pub use logs::{CHAIN_LINKS_MAX, ErrorChain, chain};

use std::io::IsTerminal as _;
use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;

use thiserror::Error;
use tracing_subscriber::filter::{FilterExt as _, LevelFilter};
use tracing_subscriber::fmt::MakeWriter;
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
    /// Log to standard error instead of standard output: for commands whose standard output
    /// is their answer (`palisade worker add` prints an id a script reads). Lines are then
    /// coloured only when standard error is a terminal.
    pub to_stderr: bool,
    /// How long spans not yet exported are flushed for when the process stops
    /// (`PALISADE_TRACE_FLUSH_TIMEOUT_MS`); `None`: [`SERVICE_FLUSH_TIMEOUT`], or
    /// [`ONE_SHOT_FLUSH_TIMEOUT`] for a one-shot command (`to_stderr`). A collector that hangs
    /// delays the process's exit by this much.
    pub flush_timeout: Option<Duration>,
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
    /// `PALISADE_TRACE_FLUSH_TIMEOUT_MS` too.
    pub fn from_env() -> Result<Self, TelemetryError> {
        let json = match std::env::var("PALISADE_LOG_FORMAT").as_deref() {
            Err(_) | Ok("") | Ok("text") => false,
            Ok("json") => true,
            Ok(other) => return Err(TelemetryError::LogFormat(other.to_owned())),
        };
        let flush_timeout = match std::env::var("PALISADE_TRACE_FLUSH_TIMEOUT_MS") {
            Err(_) => None,
            Ok(value) if value.is_empty() => None,
            Ok(value) => Some(Duration::from_millis(
                value
                    .parse()
                    .map_err(|_| TelemetryError::FlushTimeout(value.clone()))?,
            )),
        };
        Ok(Self {
            json,
            default_filter: String::new(),
            otlp: OtlpSettings::from_env()?,
            to_stderr: false,
            flush_timeout,
        })
    }

    /// How long the flush at exit may take: the setting, else the default for the kind of
    /// process.
    pub fn flush_timeout(&self) -> Duration {
        self.flush_timeout.unwrap_or(if self.to_stderr {
            ONE_SHOT_FLUSH_TIMEOUT
        } else {
            SERVICE_FLUSH_TIMEOUT
        })
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
    #[error("PALISADE_TRACE_FLUSH_TIMEOUT_MS={0:?} is not a number of milliseconds: use e.g. 1000")]
    FlushTimeout(String),
}

/// A service flushes the spans not yet exported for at most this long when it stops.
pub const SERVICE_FLUSH_TIMEOUT: Duration = Duration::from_secs(5);

/// A one-shot command (`palisade scan show`) flushes for at most this long at exit: a hung
/// collector delays a person's command by no more.
pub const ONE_SHOT_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Spans whose target this is give log lines their context (a worker's id, the leader lease
/// a loop serves under) but are never exported and never parent an exported span: a span
/// that lives as long as the process would be one trace that grows without end and is
/// exported only at exit, its children orphans meanwhile. What runs under it starts traces of
/// its own. `tracing::info_span!(target: telemetry::UNTRACED, "worker", …)`.
pub const UNTRACED: &str = "palisade::untraced";

/// Marks `span` failed, as OpenTelemetry's conventions have it: status ERROR with `message`,
/// the error code in `palisade.error_code`, and an `exception` event carrying both. For every
/// span whose operation failed or was refused (a refused batch, a lost lease, a failed plugin,
/// a refused request): an SRE searches `error=true` and finds them. Nothing happens to a span
/// without OpenTelemetry data (export off in tests, [`UNTRACED`]).
pub fn record_error(span: &tracing::Span, code: &str, message: &str) {
    use opentelemetry::KeyValue;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    span.set_status(opentelemetry::trace::Status::error(message.to_owned()));
    span.set_attribute("palisade.error_code", code.to_owned());
    span.add_event(
        "exception",
        vec![
            KeyValue::new("exception.type", code.to_owned()),
            KeyValue::new("exception.message", message.to_owned()),
        ],
    );
}

/// Keeps telemetry running; dropping it flushes and stops span export (on a blocking thread,
/// at most the settings' flush timeout).
#[derive(Debug)]
pub struct TelemetryGuard {
    _service_name: String,
    /// `None` only while dropping.
    provider: Option<SdkTracerProvider>,
    flush_timeout: Duration,
}

impl TelemetryGuard {
    /// Exports every finished span now (tests; a no-op when export is off).
    pub async fn flush(&self) {
        let Some(provider) = self.provider.clone() else {
            return;
        };
        let flushed = tokio::task::spawn_blocking(move || provider.force_flush()).await;
        if let Ok(Err(error)) = flushed {
            tracing::warn!(error = %chain(&error), "span flush failed");
        }
    }
}

impl Drop for TelemetryGuard {
    fn drop(&mut self) {
        let Some(provider) = self.provider.take() else {
            return;
        };
        // Shutting down blocks on the exporter; never block a runtime thread with it.
        let timeout = self.flush_timeout;
        let stopped = std::thread::spawn(move || provider.shutdown_with_timeout(timeout));
        let _ = stopped.join();
    }
}

/// The tracer provider of the process, with resource `service.name` = `service_name` unless
/// `OTEL_SERVICE_NAME` says otherwise, exporting to `otlp` when given. Without `otlp` it
/// exports nothing but still gives every span its W3C ids, for the logs and the NATS headers:
/// without a collector, a trace id shared by the lines of one scan in every service is the one
/// thread left to follow (measured: 3–5 µs per `info` span, a few dozen spans per scan). The
/// default sampler (parent-based, always on) keeps the `sampled` flag set, so a process that
/// does export records its part of a trace begun where nothing is exported.
/// Must run inside the tokio runtime (tonic).
fn tracer_provider(
    service_name: &str,
    otlp: Option<&OtlpSettings>,
) -> Result<SdkTracerProvider, TelemetryError> {
    let service_name = std::env::var("OTEL_SERVICE_NAME")
        .ok()
        .filter(|name| !name.is_empty())
        .unwrap_or_else(|| service_name.to_owned());
    let resource = Resource::builder().with_service_name(service_name).build();
    let builder = SdkTracerProvider::builder()
        .with_resource(resource)
        .with_id_generator(SpanIds::default());
    let Some(otlp) = otlp else {
        return Ok(builder.build());
    };
    Ok(builder.with_batch_exporter(span_exporter(otlp)?).build())
}

thread_local! {
    /// The id the next span this thread starts gets ([`with_span_id`]).
    static NEXT_SPAN_ID: std::cell::Cell<Option<opentelemetry::trace::SpanId>> =
        const { std::cell::Cell::new(None) };
}

/// Random ids, but for a span started inside [`with_span_id`].
#[derive(Debug, Default)]
struct SpanIds(opentelemetry_sdk::trace::RandomIdGenerator);

impl opentelemetry_sdk::trace::IdGenerator for SpanIds {
    fn new_trace_id(&self) -> opentelemetry::trace::TraceId {
        self.0.new_trace_id()
    }

    fn new_span_id(&self) -> opentelemetry::trace::SpanId {
        NEXT_SPAN_ID
            .with(std::cell::Cell::take)
            .unwrap_or_else(|| self.0.new_span_id())
    }
}

/// Runs `start`, which starts one span on this thread (reads its context), giving that span
/// `span_id` instead of a random one: a span whose id another process must find again
/// without asking (a lease's span, whose context a replayed acquire sends again). Any other
/// span started inside `start` takes the id instead, so start only the one.
pub fn with_span_id<T>(span_id: [u8; 8], start: impl FnOnce() -> T) -> T {
    let span_id = opentelemetry::trace::SpanId::from_bytes(span_id);
    NEXT_SPAN_ID.with(|next| next.set(Some(span_id)));
    let started = start();
    NEXT_SPAN_ID.with(|next| next.set(None));
    started
}

fn span_exporter(otlp: &OtlpSettings) -> Result<opentelemetry_otlp::SpanExporter, TelemetryError> {
    match otlp.protocol {
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
    .map_err(|error| TelemetryError::Exporter(error.to_string()))
}

/// Installs the global subscriber for `service_name`. Log level from `RUST_LOG` (default
/// `info`). Every span gets OpenTelemetry ids, which log lines logged in it carry and which
/// travel to other services as W3C trace context (the global propagator); with
/// `settings.otlp`, spans are also exported.
pub fn init(
    service_name: &str,
    settings: &TelemetrySettings,
) -> Result<TelemetryGuard, TelemetryError> {
    if settings.to_stderr {
        init_with_writer(service_name, settings, std::io::stderr)
    } else {
        init_with_writer(service_name, settings, std::io::stdout)
    }
}

/// [`init`] with log lines written to `make_writer` instead of stdout or stderr (tests that
/// read what a process logs).
pub fn init_with_writer<W>(
    service_name: &str,
    settings: &TelemetrySettings,
    make_writer: W,
) -> Result<TelemetryGuard, TelemetryError>
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    let default_filter = if settings.default_filter.is_empty() {
        "info"
    } else {
        &settings.default_filter
    };
    let filter =
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default_filter));
    let provider = tracer_provider(service_name, settings.otlp.as_ref())?;
    let log_format = LogFormat {
        json: settings.json,
        // Coloured only on a terminal (standard error for a command, `to_stderr`, else
        // standard output), so a file, a pipe, a script or a CI log gets plain lines.
        ansi: ansi_default()
            && if settings.to_stderr {
                std::io::stderr().is_terminal()
            } else {
                std::io::stdout().is_terminal()
            },
    };
    let layers = layers(&provider, log_format, filter, make_writer);
    let installed = tracing_subscriber::registry().with(layers).try_init();
    installed.map_err(|error| TelemetryError::AlreadyInstalled(error.to_string()))?;
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(TelemetryGuard {
        _service_name: service_name.to_owned(),
        provider: Some(provider),
        flush_timeout: settings.flush_timeout(),
    })
}

/// How log lines look.
#[derive(Debug, Clone, Copy)]
struct LogFormat {
    json: bool,
    /// Colours in text lines.
    ansi: bool,
}

/// Colours unless `NO_COLOR` is set, as `tracing_subscriber::fmt` decides by default; the
/// event format is told too, since it writes the line itself (`logs::WithTraceIds`).
fn ansi_default() -> bool {
    std::env::var("NO_COLOR").map_or(true, |value| value.is_empty())
}

/// The layers `init` installs: statement counting, OpenTelemetry spans from `provider`, and
/// log lines filtered by `log_filter` written to `make_writer`. Tests install them on a
/// scoped subscriber with a buffer as the writer.
fn layers<W>(
    provider: &SdkTracerProvider,
    log_format: LogFormat,
    log_filter: EnvFilter,
    make_writer: W,
) -> Vec<Box<dyn Layer<Registry> + Send + Sync>>
where
    W: for<'writer> MakeWriter<'writer> + Send + Sync + 'static,
{
    // `RUST_LOG` (or a quieter default such as the demo's) filters logs only: spans at
    // `info` get ids (and are exported) whatever the log level.
    let mut layers: Vec<Box<dyn Layer<Registry> + Send + Sync>> =
        vec![cost::statement_counter().boxed()];
    layers.push(
        tracing_opentelemetry::layer()
            .with_tracer(provider.tracer("palisade"))
            .with_filter(
                LevelFilter::INFO.and(tracing_subscriber::filter::filter_fn(|metadata| {
                    metadata.target() != UNTRACED
                })),
            )
            .boxed(),
    );
    layers.push(if log_format.json {
        tracing_subscriber::fmt::layer()
            .json()
            .with_current_span(true)
            .map_event_format(|format| logs::WithTraceIds::new(format, logs::Layout::Json))
            .with_writer(make_writer)
            .with_filter(log_filter)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer()
            .with_ansi(log_format.ansi)
            .map_event_format(|format| {
                logs::WithTraceIds::new(format.with_ansi(log_format.ansi), logs::Layout::Text)
            })
            .with_writer(make_writer)
            .with_filter(log_filter)
            .boxed()
    });
    layers
}

#[cfg(test)]
mod tests {
    //! Log lines carry the OpenTelemetry ids of the span they are logged in, with export off.

    use std::io;
    use std::sync::{Arc, Mutex};

    use opentelemetry::propagation::TextMapPropagator as _;
    use opentelemetry::trace::TraceContextExt as _;
    use tracing::Instrument as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;

    use super::*;

    /// Everything the log layer writes.
    #[derive(Debug, Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Captured {
        fn lines(&self) -> Vec<String> {
            let bytes = self.0.lock().unwrap().clone();
            String::from_utf8(bytes)
                .unwrap()
                .lines()
                .map(str::to_owned)
                .collect()
        }

        /// The JSON line whose message is `message`.
        fn json_line(&self, message: &str) -> serde_json::Value {
            let lines: Vec<serde_json::Value> = self
                .lines()
                .iter()
                .map(|line| serde_json::from_str(line).expect("every line is one JSON object"))
                .collect();
            lines
                .iter()
                .find(|line| line["fields"]["message"] == message)
                .unwrap_or_else(|| panic!("no line {message:?} in {lines:#?}"))
                .clone()
        }
    }

    impl io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }

        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    impl<'writer> MakeWriter<'writer> for Captured {
        type Writer = Captured;

        fn make_writer(&'writer self) -> Self::Writer {
            self.clone()
        }
    }

    /// Runs `log` under the layers `init` installs with export off, logs captured.
    fn capture(json: bool, log_filter: &str, log: impl FnOnce()) -> Captured {
        let provider = tracer_provider("palisade-telemetry-test", None).unwrap();
        let captured = Captured::default();
        let log_format = LogFormat { json, ansi: false };
        let layers = layers(
            &provider,
            log_format,
            EnvFilter::new(log_filter),
            captured.clone(),
        );
        tracing::subscriber::with_default(tracing_subscriber::registry().with(layers), log);
        captured
    }

    /// `span`'s W3C ids as OpenTelemetry has them, in hex.
    fn ids_of(span: &tracing::Span) -> (String, String) {
        let context = span.context();
        let span_context = context.span().span_context().clone();
        assert!(
            span_context.is_valid(),
            "export off, the span still has ids"
        );
        (
            span_context.trace_id().to_string(),
            span_context.span_id().to_string(),
        )
    }

    fn assert_ids(line: &serde_json::Value, (trace_id, span_id): &(String, String)) {
        assert_eq!(line["trace_id"], trace_id.as_str(), "{line}");
        assert_eq!(line["span_id"], span_id.as_str(), "{line}");
        assert_eq!(trace_id.len(), 32);
        assert_eq!(span_id.len(), 16);
    }

    #[test]
    fn json_lines_carry_the_trace_and_span_ids_of_their_span_and_none_outside() {
        let mut scan_ids = None;
        let mut child_ids = None;
        let captured = capture(true, "info", || {
            tracing::info!("before any span");
            let scan = tracing::info_span!("scan", palisade.scan_id = 7);
            scan.in_scope(|| tracing::warn!(attempt = 2, "in the scan span"));
            scan_ids = Some(ids_of(&scan));
            let child = tracing::info_span!(parent: &scan, "child");
            child.in_scope(|| tracing::info!("in the child span"));
            child_ids = Some(ids_of(&child));
            tracing::info!("after the spans");
        });
        let (scan_ids, child_ids) = (scan_ids.unwrap(), child_ids.unwrap());
        for message in ["before any span", "after the spans"] {
            let line = captured.json_line(message);
            assert!(line.get("trace_id").is_none(), "{line}");
            assert!(line.get("span_id").is_none(), "{line}");
        }
        let in_scan = captured.json_line("in the scan span");
        assert_ids(&in_scan, &scan_ids);
        // What the JSON format already carried is still there.
        assert_eq!(in_scan["level"], "WARN");
        assert_eq!(in_scan["fields"]["attempt"], 2);
        assert_eq!(in_scan["span"]["name"], "scan");
        assert_eq!(in_scan["span"]["palisade.scan_id"], 7);
        let in_child = captured.json_line("in the child span");
        assert_ids(&in_child, &child_ids);
        assert_eq!(child_ids.0, scan_ids.0, "one trace");
        assert_ne!(child_ids.1, scan_ids.1);
    }

    #[test]
    fn a_line_logged_in_a_span_the_log_filter_hides_still_carries_its_ids() {
        let mut ids = None;
        let captured = capture(true, "warn", || {
            let process = tracing::info_span!("process");
            process.in_scope(|| {
                tracing::info!("filtered out");
                tracing::warn!("redelivered");
            });
            ids = Some(ids_of(&process));
        });
        let line = captured.json_line("redelivered");
        assert_ids(&line, &ids.unwrap());
        assert!(
            line.get("span").is_none(),
            "the log filter hides the span: {line}"
        );
        assert_eq!(captured.lines().len(), 1);
    }

    #[test]
    fn a_line_in_a_debug_span_carries_the_ids_of_the_nearest_exported_span() {
        let mut ids = None;
        let captured = capture(true, "debug", || {
            let process = tracing::info_span!("process");
            process.in_scope(|| {
                tracing::debug_span!("detail").in_scope(|| tracing::info!("in detail"));
            });
            ids = Some(ids_of(&process));
        });
        let line = captured.json_line("in detail");
        assert_eq!(line["span"]["name"], "detail");
        assert_ids(&line, &ids.unwrap());
    }

    #[test]
    fn a_line_in_a_span_continuing_a_remote_trace_carries_the_remote_trace_id() {
        let remote_trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
        let traceparent = format!("00-{remote_trace_id}-00f067aa0ba902b7-01");
        let headers = std::collections::HashMap::from([("traceparent".to_owned(), traceparent)]);
        let mut ids = None;
        let captured = capture(true, "info", || {
            let process = tracing::info_span!("process");
            let remote = TraceContextPropagator::new().extract(&headers);
            process.set_parent(remote).unwrap();
            process.in_scope(|| tracing::info!("handled"));
            ids = Some(ids_of(&process));
        });
        let ids = ids.unwrap();
        assert_eq!(ids.0, remote_trace_id);
        assert_ne!(
            ids.1, "00f067aa0ba902b7",
            "the process span is a child, not the remote span"
        );
        assert_ids(&captured.json_line("handled"), &ids);
    }

    #[test]
    fn a_line_logged_in_an_instrumented_future_carries_its_span_ids() {
        let mut ids = None;
        let captured = capture(true, "info", || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .build()
                .unwrap();
            let span = tracing::info_span!("execute");
            ids = Some(ids_of(&span));
            runtime.block_on(
                async {
                    tokio::task::yield_now().await;
                    tracing::info!("after an await");
                }
                .instrument(span),
            );
        });
        assert_ids(&captured.json_line("after an await"), &ids.unwrap());
    }

    #[test]
    fn a_line_with_an_explicit_parent_carries_no_ids_it_could_not_vouch_for() {
        let captured = capture(true, "info", || {
            let other = tracing::info_span!("other");
            tracing::info_span!("entered").in_scope(|| {
                tracing::info!(parent: &other, "explicit parent");
                tracing::info!(parent: None, "explicit root");
            });
        });
        for message in ["explicit parent", "explicit root"] {
            assert!(captured.json_line(message).get("trace_id").is_none());
        }
    }

    #[test]
    fn text_lines_in_a_span_end_with_its_trace_id() {
        let mut ids = None;
        let captured = capture(false, "info", || {
            tracing::info!("outside");
            let scan = tracing::info_span!("scan");
            scan.in_scope(|| tracing::info!(attempt = 2, "inside"));
            ids = Some(ids_of(&scan));
        });
        let (trace_id, _) = ids.unwrap();
        let lines = captured.lines();
        assert_eq!(lines.len(), 2, "{lines:#?}");
        assert!(lines[0].ends_with("outside"), "{}", lines[0]);
        assert!(!lines[0].contains("trace_id"), "{}", lines[0]);
        assert!(
            lines[1].ends_with(&format!("inside attempt=2 trace_id={trace_id}")),
            "{}",
            lines[1]
        );
        assert!(lines[1].contains(" scan: "), "{}", lines[1]);
    }
}
