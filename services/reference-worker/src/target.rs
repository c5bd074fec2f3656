//! What a target string names: for network plugins a URL (`http://host:port/path`),
//! `host:port`, or a bare host, reduced to a host and the ports to look at; for plugins that
//! read this worker's files, `file:///path` or an absolute path.

use std::net::Ipv6Addr;
use std::path::PathBuf;

use reqwest::Url;
use worker::PluginError;

/// Ports checked when a target names a host and no port: the usual web ports.
pub const PORTS_DEFAULT: [u16; 3] = [80, 443, 8080];

/// A host and the ports a plugin should look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    /// The URL scheme, lowercase, when the target was a URL.
    pub scheme: Option<String>,
    /// A DNS name or an IP address, without IPv6 brackets.
    pub host: String,
    pub ports: Vec<u16>,
}

impl Endpoint {
    /// `host:port`, with brackets around an IPv6 address.
    pub fn authority(&self, port: u16) -> String {
        authority(&self.host, port)
    }
}

/// `host:port`, with brackets around an IPv6 address.
pub fn authority(host: &str, port: u16) -> String {
    if host.parse::<Ipv6Addr>().is_ok() {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    }
}

/// Parses a target; anything that names no host is a permanent `invalid_target`.
pub fn parse_endpoint(target: &str) -> Result<Endpoint, PluginError> {
    let target = target.trim();
    let invalid =
        |why: &str| PluginError::permanent("invalid_target", format!("target {target:?} {why}"));
    if target.contains("://") {
        let url = Url::parse(target).map_err(|error| invalid(&format!("is not a URL: {error}")))?;
        let host = match url.host() {
            Some(url::Host::Domain(domain)) => domain.to_owned(),
            Some(url::Host::Ipv4(address)) => address.to_string(),
            Some(url::Host::Ipv6(address)) => address.to_string(),
            None => return Err(invalid("names no host")),
        };
        let ports = match url.port_or_known_default() {
            Some(port) => vec![port],
            None => PORTS_DEFAULT.to_vec(),
        };
        return Ok(Endpoint {
            scheme: Some(url.scheme().to_owned()),
            host,
            ports,
        });
    }
    let (host, port) =
        split_host_port(target).ok_or_else(|| invalid("is not host, host:port or a URL"))?;
    if host.is_empty()
        || host.len() > 253
        || !host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | ':'))
    {
        return Err(invalid("is not a valid host name or address"));
    }
    Ok(Endpoint {
        scheme: None,
        host: host.to_owned(),
        ports: port.map_or_else(|| PORTS_DEFAULT.to_vec(), |port| vec![port]),
    })
}

/// The local file or directory a target names: `file:///path` or an absolute path that exists
/// on this worker. Anything else is a permanent `invalid_target`; a path that does not exist a
/// permanent `target_not_found`.
pub fn local_path(target: &str) -> Result<PathBuf, PluginError> {
    let invalid =
        |why: &str| PluginError::permanent("invalid_target", format!("target {target:?} {why}"));
    let path = if target.starts_with("file://") {
        Url::parse(target)
            .ok()
            .and_then(|url| url.to_file_path().ok())
            .ok_or_else(|| invalid("is not a local file URL"))?
    } else {
        PathBuf::from(target)
    };
    if !path.is_absolute() {
        return Err(invalid("is not file:///path or an absolute path"));
    }
    if !path.exists() {
        return Err(PluginError::permanent(
            "target_not_found",
            format!("{} does not exist on this worker", path.display()),
        ));
    }
    Ok(path)
}

/// `host`, `host:port`, `[v6]`, `[v6]:port` or a bare IPv6 address.
fn split_host_port(target: &str) -> Option<(&str, Option<u16>)> {
    if let Some(rest) = target.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        host.parse::<Ipv6Addr>().ok()?;
        return match after {
            "" => Some((host, None)),
            _ => Some((host, Some(parse_port(after.strip_prefix(':')?)?))),
        };
    }
    if target.parse::<Ipv6Addr>().is_ok() {
        return Some((target, None));
    }
    match target.split_once(':') {
        None => Some((target, None)),
        Some((host, port)) => Some((host, Some(parse_port(port)?))),
    }
}

fn parse_port(text: &str) -> Option<u16> {
    text.parse().ok().filter(|port| *port != 0)
}

/// Runs `work` (a walk of local files) on a blocking thread with a clone of `cancel`, and
/// ends it as a plugin does: a panic of `what` is a retryable `internal` failure, and a
/// cancellation that arrived meanwhile wins over the result.
pub async fn run_blocking<T, F>(
    what: &str,
    cancel: &tokio_util::sync::CancellationToken,
    work: F,
) -> Result<T, PluginError>
where
    T: Send + 'static,
    F: FnOnce(&tokio_util::sync::CancellationToken) -> Result<T, PluginError> + Send + 'static,
{
    let work_cancel = cancel.clone();
    let result = tokio::task::spawn_blocking(move || work(&work_cancel))
        .await
        .map_err(|error| {
            PluginError::retryable("internal", format!("the {what} panicked: {error}"))
        })??;
    if cancel.is_cancelled() {
        return Err(PluginError::retryable("cancelled", "cancelled"));
    }
    Ok(result)
}

/// What checking one service gave: the asset it is (reported first unless the scan already
/// had it, so the scan has the resource its evaluations are on), then its findings, then its
/// evaluations (each FAIL after its finding).
#[derive(Debug, Default)]
pub struct Checked {
    pub asset: Option<worker::v1::Asset>,
    pub findings: Vec<worker::v1::Finding>,
    pub evaluations: Vec<worker::v1::Evaluation>,
    /// The service could not be checked (its evaluations say ERROR): the task fails with this
    /// when no service could be.
    pub error: Option<PluginError>,
}

/// Checks each of `services` in turn with `check`, sending what each gave as it comes, until
/// `cancel` (a `cancelled` error); how many could be checked. A service that could not be
/// checked is reported with ERROR evaluations and the others are still checked; when none
/// could be, the task fails with the last one's error (a retry may reach them). The loop of
/// the plugins that check services one by one (`http_headers`, `tls_certificate`). An asset
/// among `known` (the task's discovered assets) is not reported again.
pub async fn check_each<S, Fut>(
    services: Vec<S>,
    known: &[worker::v1::Asset],
    sink: worker::ResultSink,
    cancel: tokio_util::sync::CancellationToken,
    check: impl Fn(S) -> Fut,
) -> Result<usize, PluginError>
where
    Fut: Future<Output = Checked>,
{
    let mut checked = 0;
    let mut failure = None;
    for service in services {
        let result = tokio::select! {
            () = cancel.cancelled() => return Err(PluginError::retryable("cancelled", "cancelled")),
            result = check(service) => result,
        };
        if let Some(asset) = result.asset.filter(|asset| !known.contains(asset)) {
            sink.asset(asset).await?;
        }
        for finding in result.findings {
            sink.finding(finding).await?;
        }
        for evaluation in result.evaluations {
            sink.evaluation(evaluation).await?;
        }
        match result.error {
            None => checked += 1,
            Some(error) => failure = Some(error),
        }
    }
    match failure {
        Some(error) if checked == 0 => Err(error),
        _ => Ok(checked),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint(target: &str) -> (Option<String>, String, Vec<u16>) {
        let endpoint = parse_endpoint(target).unwrap();
        (endpoint.scheme, endpoint.host, endpoint.ports)
    }

    #[test]
    fn urls_give_their_port_or_the_scheme_default() {
        assert_eq!(
            endpoint("http://127.0.0.1:8081/login"),
            (Some("http".into()), "127.0.0.1".into(), vec![8081])
        );
        assert_eq!(
            endpoint("https://example.test"),
            (Some("https".into()), "example.test".into(), vec![443])
        );
        assert_eq!(endpoint("http://[::1]:9000/").1, "::1");
        assert_eq!(endpoint("svc://host").2, PORTS_DEFAULT.to_vec());
    }

    #[test]
    fn host_port_and_bare_hosts() {
        assert_eq!(
            endpoint("db.internal:5432"),
            (None, "db.internal".into(), vec![5432])
        );
        assert_eq!(endpoint("localhost").2, PORTS_DEFAULT.to_vec());
        assert_eq!(endpoint("[::1]:22"), (None, "::1".into(), vec![22]));
        assert_eq!(endpoint("::1").2, PORTS_DEFAULT.to_vec());
    }

    #[test]
    fn refuses_what_names_no_host() {
        for bad in [
            "",
            "host:0",
            "host:99999",
            "host:port",
            "bad host",
            "a/b",
            "[::1",
            "http://",
        ] {
            let error = parse_endpoint(bad).unwrap_err();
            assert_eq!(error.code, "invalid_target", "{bad:?}");
            assert!(!error.retryable);
        }
    }

    #[test]
    fn local_paths_must_be_absolute_and_exist() {
        assert_eq!(
            local_path("relative/dir").unwrap_err().code,
            "invalid_target"
        );
        assert_eq!(
            local_path("/does/not/exist").unwrap_err().code,
            "target_not_found"
        );
        assert_eq!(local_path("file:///tmp").unwrap(), PathBuf::from("/tmp"));
        assert_eq!(local_path("/tmp").unwrap(), PathBuf::from("/tmp"));
        assert_eq!(
            local_path("http://host/").unwrap_err().code,
            "invalid_target"
        );
    }

    #[test]
    fn authorities_bracket_ipv6() {
        assert_eq!(authority("::1", 80), "[::1]:80");
        assert_eq!(authority("10.0.0.1", 80), "10.0.0.1:80");
        assert_eq!(authority("example.test", 443), "example.test:443");
    }
}
