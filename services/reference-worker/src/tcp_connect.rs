//! `tcp_connect`: which of a target's ports accept a TCP connection. Each open port is a
//! `tcp_service` asset (and an `http_service` one when the target is an http(s) URL, for
//! `http_headers` to check) and an informational `open-port` finding.
//!
//! Its one rule, `open-port`, applies to `tcp_service` resources: each open port reads FAIL
//! (after its finding), each closed one PASS on `host:port` (not an asset, so shown in the
//! scan's coverage without being required).
//!
//! Targets: `http://host:port/...` (that port, or the scheme's), `host:port`, or a bare host
//! (ports 80, 443 and 8080).

use std::net::SocketAddr;
use std::time::Duration;

use futures::future::join_all;
use tokio_util::sync::CancellationToken;
use worker::{BoxFuture, Plugin, PluginError, ResultItem, ResultSink, Rule, TaskInput, v1};

use crate::target::{self, Endpoint};

/// A port that does not answer within this is reported closed.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);
/// Name resolution gives up after this: the target is then unreachable.
pub const RESOLVE_TIMEOUT: Duration = Duration::from_secs(3);
/// Addresses of one host tried per port (a name may resolve to many).
pub const ADDRESSES_MAX: usize = 4;

/// The asset kind of an open port, `host:port`.
pub const SERVICE_KIND: &str = "tcp_service";
/// The rule of an open port's finding.
pub const OPEN_PORT_RULE: &str = "open-port";
/// What it checks: whether each port accepts a connection.
pub const RULES: [Rule; 1] = [Rule {
    id: OPEN_PORT_RULE,
    applies_to: &[SERVICE_KIND],
}];

pub struct TcpConnect;

impl Plugin for TcpConnect {
    fn name(&self) -> &'static str {
        "tcp_connect"
    }

    fn rules(&self) -> &'static [Rule] {
        &RULES
    }

    fn run<'a>(
        &'a self,
        task: TaskInput,
        sink: ResultSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<String, PluginError>> {
        Box::pin(async move {
            let endpoint = target::parse_endpoint(&task.target)?;
            let scan = async {
                let addresses = resolve(&endpoint.host).await?;
                let checks = endpoint.ports.iter().map(|port| is_open(&addresses, *port));
                Ok::<_, PluginError>(join_all(checks).await)
            };
            let open = tokio::select! {
                () = cancel.cancelled() => return Err(PluginError::retryable("cancelled", "cancelled")),
                open = scan => open?,
            };
            let mut open_ports = vec![];
            for (port, open) in endpoint.ports.iter().zip(open) {
                if open.is_some() {
                    open_ports.push(*port);
                }
                for item in results(&endpoint, *port, open) {
                    match item {
                        ResultItem::Asset(asset) => sink.asset(asset).await?,
                        ResultItem::Finding(finding) => sink.finding(finding).await?,
                        ResultItem::Evaluation(evaluation) => sink.evaluation(evaluation).await?,
                    }
                }
            }
            Ok(format!(
                "{} of {} ports open on {}: {:?}",
                open_ports.len(),
                endpoint.ports.len(),
                endpoint.host,
                open_ports
            ))
        })
    }
}

/// What one port yields: open (at `address`), its assets, its finding and a FAIL; closed, a
/// PASS.
fn results(endpoint: &Endpoint, port: u16, open: Option<SocketAddr>) -> Vec<ResultItem> {
    let authority = endpoint.authority(port);
    let Some(address) = open else {
        let evaluation = v1::Evaluation::pass(OPEN_PORT_RULE, &authority).with_evidence(format!(
            "no TCP connection to port {port} within {CONNECT_TIMEOUT:?}"
        ));
        return vec![ResultItem::Evaluation(evaluation)];
    };
    let mut items = vec![ResultItem::Asset(v1::Asset {
        kind: SERVICE_KIND.into(),
        value: authority.clone(),
    })];
    if let Some(scheme @ ("http" | "https")) = endpoint.scheme.as_deref() {
        items.push(ResultItem::Asset(v1::Asset {
            kind: "http_service".into(),
            value: format!("{scheme}://{authority}"),
        }));
    }
    let finding = v1::Finding {
        rule_id: OPEN_PORT_RULE.into(),
        resource: authority.clone(),
        severity: "info".into(),
        title: format!("TCP port {port} is open"),
        description: "The port accepts TCP connections; make sure the service behind it is meant to be reachable.".into(),
        evidence: format!("TCP connection to {address} succeeded"),
        ..Default::default()
    };
    let failed = v1::Evaluation::fail(OPEN_PORT_RULE, &authority, &finding.discriminator);
    items.push(ResultItem::Finding(finding));
    items.push(ResultItem::Evaluation(failed));
    items
}

/// The host's addresses; an unresolvable host is a permanent `target_unreachable`.
async fn resolve(host: &str) -> Result<Vec<SocketAddr>, PluginError> {
    let unreachable = |why: String| {
        PluginError::permanent(
            "target_unreachable",
            format!("cannot resolve {host:?}: {why}"),
        )
    };
    let lookup = tokio::time::timeout(RESOLVE_TIMEOUT, tokio::net::lookup_host((host, 0)))
        .await
        .map_err(|_| unreachable(format!("no answer within {RESOLVE_TIMEOUT:?}")))?
        .map_err(|error| unreachable(error.to_string()))?;
    let addresses: Vec<SocketAddr> = lookup.take(ADDRESSES_MAX).collect();
    if addresses.is_empty() {
        return Err(unreachable("no addresses".into()));
    }
    Ok(addresses)
}

/// The address that accepted a connection on `port`, if any did within the timeout.
/// Refused or silent ports are closed, not errors.
async fn is_open(addresses: &[SocketAddr], port: u16) -> Option<SocketAddr> {
    for address in addresses {
        let address = SocketAddr::new(address.ip(), port);
        let connect = tokio::net::TcpStream::connect(address);
        if let Ok(Ok(_stream)) = tokio::time::timeout(CONNECT_TIMEOUT, connect).await {
            return Some(address);
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use worker::ResultItem;

    use super::*;

    /// Runs the plugin on `target`: its result and everything it sent, checked for coverage
    /// (`open-port` evaluated on each `tcp_service` it reported).
    async fn run(target: &str) -> (Result<String, PluginError>, Vec<ResultItem>) {
        let (sink, mut receiver) = ResultSink::channel(64);
        let task = TaskInput::for_target("tcp_connect", target);
        let result = TcpConnect
            .run(task.clone(), sink, CancellationToken::new())
            .await;
        let mut items = vec![];
        while let Ok(item) = receiver.try_recv() {
            items.push(item);
        }
        crate::coverage::testing::assert_covered(&RULES, &task, &items);
        (result, items)
    }

    /// A port nothing listens on: bound, then released.
    async fn closed_port() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        listener.local_addr().unwrap().port()
    }

    #[tokio::test]
    async fn reports_an_open_port_as_assets_and_a_finding() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (result, items) = run(&format!("http://127.0.0.1:{port}/app")).await;
        assert!(result.unwrap().starts_with("1 of 1 ports open"));
        let authority = format!("127.0.0.1:{port}");
        assert_eq!(
            items[..2],
            [
                ResultItem::Asset(v1::Asset {
                    kind: "tcp_service".into(),
                    value: authority.clone()
                }),
                ResultItem::Asset(v1::Asset {
                    kind: "http_service".into(),
                    value: format!("http://{authority}")
                }),
            ]
        );
        let ResultItem::Finding(finding) = &items[2] else {
            panic!("{items:?}")
        };
        assert_eq!(
            (finding.rule_id.as_str(), finding.resource.as_str()),
            ("open-port", authority.as_str())
        );
        assert_eq!(finding.severity, "info");
        assert_eq!(
            items[3],
            ResultItem::Evaluation(v1::Evaluation::fail("open-port", &authority, ""))
        );
        assert_eq!(items.len(), 4);
    }

    #[tokio::test]
    async fn a_closed_port_is_not_an_error() {
        let port = closed_port().await;
        let (result, items) = run(&format!("127.0.0.1:{port}")).await;
        assert!(result.unwrap().starts_with("0 of 1 ports open"));
        let [ResultItem::Evaluation(evaluation)] = &items[..] else {
            panic!("only an evaluation: {items:?}")
        };
        assert_eq!(
            (
                evaluation.rule_id.as_str(),
                evaluation.resource.as_str(),
                evaluation.status.as_str()
            ),
            ("open-port", format!("127.0.0.1:{port}").as_str(), "pass")
        );
    }

    #[tokio::test]
    async fn plain_host_port_targets_are_not_http_services() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (_, items) = run(&format!("localhost:{port}")).await;
        let kinds: Vec<_> = items
            .iter()
            .filter_map(|item| match item {
                ResultItem::Asset(asset) => Some(asset.kind.as_str()),
                ResultItem::Finding(_) | ResultItem::Evaluation(_) => None,
            })
            .collect();
        assert_eq!(kinds, ["tcp_service"]);
        let statuses = crate::coverage::testing::on(&items, &format!("localhost:{port}"));
        assert_eq!(statuses, [("open-port", "fail")].into());
    }

    #[tokio::test]
    async fn an_invalid_target_is_permanent() {
        let (result, _) = run("not a host").await;
        let error = result.unwrap_err();
        assert_eq!(
            (error.code.as_str(), error.retryable),
            ("invalid_target", false)
        );
    }
}
