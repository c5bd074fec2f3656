//! `palisade health`: the container health check, so the runtime image needs no curl. It asks
//! a process's own `/readyz` (by default at `PALISADE_HTTP_ADDR`, the address the service in
//! the same container binds) and reports whether it is ready, with the answer's body, which
//! names each failing check.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use anyhow::Context as _;

/// One probe waits this long for the answer: above `/readyz`'s own bound (each check at most
/// 1 s, run at once) and below a usual health-check timeout (compose.yaml gives 5 s).
pub const PROBE_TIME_MAX: Duration = Duration::from_secs(3);

/// What `/readyz` answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeAnswer {
    pub status: u16,
    /// The JSON report (`status`, `checks`, `message` when not ready).
    pub body: String,
}

impl ProbeAnswer {
    pub fn is_ready(&self) -> bool {
        self.status == 200
    }
}

/// The `/readyz` URL of a server bound to `addr`, reached from the same host: an unspecified
/// address (`0.0.0.0`, `::`) is reached over loopback.
pub fn readyz_url(addr: SocketAddr) -> String {
    let ip = match addr.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(ip) if ip.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    };
    format!("http://{}/readyz", SocketAddr::new(ip, addr.port()))
}

/// GETs `url` once, within [`PROBE_TIME_MAX`]. An answer of any status is `Ok`; no answer is
/// an error.
pub async fn probe(url: &str) -> anyhow::Result<ProbeAnswer> {
    let client = reqwest::Client::builder()
        .timeout(PROBE_TIME_MAX)
        .build()
        .context("failed to build the HTTP client")?;
    let response = client.get(url).send().await.with_context(|| {
        format!(
            "no answer from {url} within {} ms: is the service running, and is PALISADE_HTTP_ADDR the same for it and for this probe?",
            PROBE_TIME_MAX.as_millis()
        )
    })?;
    let status = response.status().as_u16();
    let body = response
        .text()
        .await
        .with_context(|| format!("failed to read the answer from {url}"))?;
    Ok(ProbeAnswer { status, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unspecified_bind_address_is_probed_over_loopback() {
        assert_eq!(
            readyz_url("0.0.0.0:9090".parse().unwrap()),
            "http://127.0.0.1:9090/readyz"
        );
        assert_eq!(
            readyz_url("[::]:9191".parse().unwrap()),
            "http://[::1]:9191/readyz"
        );
        assert_eq!(
            readyz_url("10.1.2.3:9090".parse().unwrap()),
            "http://10.1.2.3:9090/readyz"
        );
    }
}
