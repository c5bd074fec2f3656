//! The reference worker as the system tests' child process: the same code as
//! `palisade-worker`, built by cargo with the tests (so `CARGO_BIN_EXE_test-worker` is
//! always current) and signalled by them (SIGKILL, SIGSTOP).

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let _telemetry = tests::init_child_logging("palisade-worker");
    let settings = reference_worker::Settings::from_env().context("invalid worker settings")?;
    let shutdown = CancellationToken::new();
    reference_worker::cancel_on_signal(shutdown.clone())?;
    reference_worker::run(settings, shutdown).await
}
