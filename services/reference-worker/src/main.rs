//! `palisade-worker`: the reference worker binary. Settings come from the environment (see
//! `reference_worker::Settings`); SIGINT or SIGTERM releases running leases and exits.

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let settings = reference_worker::Settings::from_env().context("invalid worker settings")?;
    let shutdown = CancellationToken::new();
    reference_worker::cancel_on_signal(shutdown.clone())?;
    reference_worker::run(settings, shutdown).await
}
