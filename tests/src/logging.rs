//! Logs of the tests and of the processes they start.

/// Logs of a test's child process (`test-service`, `test-worker`): plain text on stderr, which
/// the test may send to a file, filtered by `RUST_LOG` (default `warn`). With
/// `OTEL_EXPORTER_OTLP_ENDPOINT` set, installs what the production binaries install instead (`telemetry::init` as
/// `service_name`, exporting spans); keep the guard until the process ends.
pub fn init_child_logging(service_name: &str) -> Option<telemetry::TelemetryGuard> {
    let otlp = telemetry::OtlpSettings::from_env().expect("valid OTLP settings");
    if otlp.is_some() {
        let mut settings = telemetry::TelemetrySettings::from_env().expect("valid settings");
        settings.default_filter = "warn".into();
        settings.to_stderr = true;
        return Some(telemetry::init(service_name, &settings).expect("telemetry installs"));
    }
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    None
}

/// Statement counting (as in every palisade process) and, with `TEST_LOG` set, logs filtered
/// by `RUST_LOG`. A test that installed its own subscriber first (`telemetry::init`) keeps it.
pub fn init_test_logging() {
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;
    let logs = std::env::var_os("TEST_LOG").is_some().then(|| {
        tracing_subscriber::fmt::layer()
            .with_test_writer()
            .with_filter(tracing_subscriber::EnvFilter::from_default_env())
    });
    let _ = tracing_subscriber::registry()
        .with(telemetry::cost::statement_counter())
        .with(logs)
        .try_init();
}
