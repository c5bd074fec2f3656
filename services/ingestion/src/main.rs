//! The ingestion service binary.

use anyhow::Context as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::arguments::answer(
        "palisade-ingestion",
        "accepts workers' result batches and completions exactly once",
    );
    let telemetry_settings =
        telemetry::TelemetrySettings::from_env().context("invalid telemetry settings")?;
    let _telemetry = telemetry::init("palisade-ingestion", &telemetry_settings)?;
    let settings = ingestion::Settings::from_env().context("invalid ingestion settings")?;
    let service = ingestion::Service::build(settings)
        .await
        .context("failed to start ingestion")?;
    service
        .run_until_stopped(runtime::shutdown_on_signal())
        .await
}
