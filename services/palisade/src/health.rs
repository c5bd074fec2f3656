//! `palisade health`: asks a service's /readyz once (the container health check), through
//! `probe`.

use crate::probe;

/// Runs `palisade health`: exits 0 when ready, 1 with the failing checks otherwise.
pub async fn run(url: Option<String>) -> anyhow::Result<()> {
    let url = match url {
        Some(url) => url,
        None => match runtime::health::http_addr_from_env()? {
            Some(addr) => probe::readyz_url(addr),
            None => anyhow::bail!(
                "PALISADE_HTTP_ADDR is off, so there is no /readyz to ask: set it, or pass --url"
            ),
        },
    };
    let answer = probe::probe(&url).await?;
    if !answer.is_ready() {
        anyhow::bail!("not ready ({}): {}", answer.status, answer.body);
    }
    println!("{}", answer.body);
    Ok(())
}
