//! A reaper replica as the system tests' child process: the real `reaper::Service` (settings
//! from the environment), printing one line per sweep start and finish on stdout so a test
//! can check that only one replica sweeps at a time, and killing it hard.

use std::io::Write as _;
use std::sync::Arc;

use anyhow::Context as _;
use reaper::SweepEvent;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let settings = reaper::Settings::from_env().context("invalid reaper settings")?;
    let service = reaper::Service::build(settings)
        .await?
        .with_sweep_observer(Arc::new(|event| {
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
        }));
    service
        .run_until_stopped(runtime::shutdown_on_signal())
        .await
}
