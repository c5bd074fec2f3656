//! `palisade health`: asks a service's /readyz once (the container health check), or until it
//! is ready within `--wait` (the chart's `helm test` hook: a loaded server may answer a check
//! late for a moment), through `probe`.

use crate::probe;

/// How often `--wait` asks again.
const ASK_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// Runs `palisade health`: exits 0 when ready, 1 with the failing checks otherwise (the last
/// answer's, once `wait` has passed).
pub async fn run(url: Option<String>, wait: std::time::Duration) -> anyhow::Result<()> {
    let url = match url {
        Some(url) => url,
        None => match runtime::health::http_addr_from_env()? {
            Some(addr) => probe::readyz_url(addr),
            None => anyhow::bail!(
                "PALISADE_HTTP_ADDR is off, so there is no /readyz to ask: set it, or pass --url"
            ),
        },
    };
    let until = tokio::time::Instant::now() + wait;
    loop {
        let asked = probe::probe(&url).await;
        match asked {
            Ok(answer) if answer.is_ready() => {
                println!("{}", answer.body);
                return Ok(());
            }
            _ if tokio::time::Instant::now() + ASK_EVERY <= until => {
                tokio::time::sleep(ASK_EVERY).await;
            }
            Ok(answer) => anyhow::bail!("not ready ({}): {}", answer.status, answer.body),
            Err(error) => return Err(error),
        }
    }
}
