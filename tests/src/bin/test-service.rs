//! One palisade service as the system tests' child process, so a test can SIGKILL, SIGSTOP
//! and restart it: `test-service <admission|dispatch|ingestion|enrichment|reaper>`, the real
//! service with its settings from the environment and logs on stderr (`RUST_LOG`, default
//! `warn`). Built by cargo with the tests, so `CARGO_BIN_EXE_test-service` is always current.
//!
//! The reaper also prints one line per sweep start and finish on stdout (`sweep started
//! <unix ms>`), so a test can check that only one replica sweeps at a time.

use std::io::Write as _;
use std::sync::Arc;

use anyhow::{Context as _, bail};
use reaper::SweepEvent;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let service = std::env::args().nth(1).unwrap_or_default();
    let _telemetry = tests::init_child_logging(&format!("palisade-{service}"));
    let shutdown = runtime::shutdown_on_signal();
    match service.as_str() {
        "admission" => {
            let settings = admission::Settings::from_env().context("invalid settings")?;
            admission::Service::build(settings)
                .await?
                .run_until_stopped(shutdown)
                .await
        }
        "dispatch" => {
            let settings = dispatch::Settings::from_env().context("invalid settings")?;
            dispatch::Service::build(settings)
                .await?
                .run_until_stopped(shutdown)
                .await
        }
        "ingestion" => {
            let settings = ingestion::Settings::from_env().context("invalid settings")?;
            ingestion::Service::build(settings)
                .await?
                .run_until_stopped(shutdown)
                .await
        }
        "enrichment" => {
            let settings = enrichment::Settings::from_env().context("invalid settings")?;
            enrichment::Service::build(settings)
                .await?
                .run_until_stopped(shutdown)
                .await
        }
        "reaper" => {
            let settings = reaper::Settings::from_env().context("invalid settings")?;
            reaper::Service::build(settings)
                .await?
                .with_sweep_observer(Arc::new(print_sweep))
                .run_until_stopped(shutdown)
                .await
        }
        other => bail!(
            "unknown service {other:?}: use admission, dispatch, ingestion, enrichment or reaper"
        ),
    }
}

fn print_sweep(event: SweepEvent) {
    let millis = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .expect("after 1970")
        .as_millis();
    let word = match event {
        SweepEvent::Started => "started",
        SweepEvent::Finished => "finished",
    };
    let mut stdout = std::io::stdout().lock();
    let _ = writeln!(stdout, "sweep {word} {millis}");
    let _ = stdout.flush();
}
