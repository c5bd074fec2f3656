//! The dispatch service binary.

use anyhow::Context as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::arguments::answer(
        "palisade-dispatch",
        "leases plugin tasks to eligible workers (hello, acquire, renew, release, enroll)",
    );
    let telemetry_settings =
        telemetry::TelemetrySettings::from_env().context("invalid telemetry settings")?;
    let _telemetry = telemetry::init("palisade-dispatch", &telemetry_settings)?;
    let settings = dispatch::Settings::from_env().context("invalid dispatch settings")?;
    let service = dispatch::Service::build(settings)
        .await
        .context("failed to start dispatch")?;
    service
        .run_until_stopped(runtime::shutdown_on_signal())
        .await
}
