//! `palisade-worker`: the reference worker binary. Settings come from the environment (see
//! `reference_worker::Settings`); SIGINT or SIGTERM releases running leases and exits.

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    telemetry::arguments::answer(
        "palisade-worker",
        "the reference worker: runs palisade's plugins on leased tasks",
    );
    let telemetry_settings =
        telemetry::TelemetrySettings::from_env().context("invalid telemetry settings")?;
    let _telemetry = telemetry::init("palisade-worker", &telemetry_settings)?;
    let settings = reference_worker::Settings::from_env().context("invalid worker settings")?;
    let shutdown = CancellationToken::new();
    reference_worker::cancel_on_signal(shutdown.clone())?;
    reference_worker::run(settings, shutdown).await
}
