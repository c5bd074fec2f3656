//! The reference worker as the system tests' child process: the same code as
//! `palisade-worker`, built by cargo with the tests (so `CARGO_BIN_EXE_test-worker` is
//! always current) and signalled by them (SIGKILL, SIGSTOP).

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .init();
    let settings = reference_worker::Settings::from_env().context("invalid worker settings")?;
    let shutdown = CancellationToken::new();
    reference_worker::cancel_on_signal(shutdown.clone())?;
    reference_worker::run(settings, shutdown).await
}
