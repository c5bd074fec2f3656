//! The admission service binary.

use anyhow::Context as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::arguments::answer(
        "palisade-admission",
        "admits scan requests from the requests stream exactly once",
    );
    let telemetry_settings =
        telemetry::TelemetrySettings::from_env().context("invalid telemetry settings")?;
    let _telemetry = telemetry::init("palisade-admission", &telemetry_settings)?;
    let settings = admission::Settings::from_env().context("invalid admission settings")?;
    let service = admission::Service::build(settings)
        .await
        .context("failed to start admission")?;
    service
        .run_until_stopped(runtime::shutdown_on_signal())
        .await
}
