//! The enrichment service binary.

use anyhow::Context as _;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::arguments::answer(
        "palisade-enrichment",
        "enriches CVE findings from NVD or the local CVE table",
    );
    let telemetry_settings =
        telemetry::TelemetrySettings::from_env().context("invalid telemetry settings")?;
    let _telemetry = telemetry::init("palisade-enrichment", &telemetry_settings)?;
    let settings = enrichment::Settings::from_env().context("invalid enrichment settings")?;
    let service = enrichment::Service::build(settings)
        .await
        .context("failed to start enrichment")?;
    service
        .run_until_stopped(runtime::shutdown_on_signal())
        .await
}
