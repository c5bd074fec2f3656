//! The reaper service binary.

use anyhow::Context as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::arguments::answer(
        "palisade-reaper",
        "recovers expired leases, retries, schedules and the outbox",
    );
    let telemetry_settings =
        telemetry::TelemetrySettings::from_env().context("invalid telemetry settings")?;
    let _telemetry = telemetry::init("palisade-reaper", &telemetry_settings)?;
    let settings = reaper::Settings::from_env().context("invalid reaper settings")?;
    let service = reaper::Service::build(settings)
        .await
        .context("failed to start reaper")?;
    service
        .run_until_stopped(runtime::shutdown_on_signal())
        .await
}
