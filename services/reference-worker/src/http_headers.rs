//! `http_headers`: the security headers of each HTTP service a scan found. It checks every
//! `http_service` asset an earlier plugin discovered (or the target itself when it is an
//! http(s) URL and nothing was discovered), with one `GET /` each.
//!
//! Each service checked is an `http_service` asset (its resource, as findings name it),
//! reported unless it was discovered so, and each rule of [`RULES`] is evaluated on it: FAIL after the finding, PASS when
//! the header is there (or no banner is), NOT_APPLICABLE (`not_https`) for HSTS over plain
//! HTTP, ERROR (`connection_refused`, `timeout`, `http_error`) when the service did not
//! answer; the other services are still checked, and the task fails (retryable) only when
//! none answered. Without any http service every rule is NOT_APPLICABLE (`no_http_service`)
//! on the target.
//!
//! Over https the certificate is not verified: a service with a self-signed or expired
//! certificate still has its headers checked (judging the certificate is the
//! `tls_certificate` plugin's work), and HSTS is expected there.

use std::time::Duration;

use reqwest::Url;
use reqwest::header::{HeaderMap, HeaderName};
use tokio_util::sync::CancellationToken;
use worker::{BoxFuture, Plugin, PluginError, ResultSink, Rule, TaskInput, v1};

use crate::coverage;
use crate::target::{self, Checked};

/// One service's whole request, connect to last header.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// Services checked per task: a scan of one target does not find more than a handful.
pub const SERVICES_MAX: usize = 64;
/// The longest banner kept as evidence.
const BANNER_BYTES_MAX: usize = 256;

/// The asset kind of the services checked, and of the resources the rules apply to.
pub const SERVICE_KIND: &str = "http_service";

/// What it checks on each service: one rule per header of [`EXPECTED`], then the banner.
pub const RULES: [Rule; 6] = [
    Rule {
        id: "missing-strict-transport-security",
        applies_to: &[SERVICE_KIND],
    },
    Rule {
        id: "missing-content-security-policy",
        applies_to: &[SERVICE_KIND],
    },
    Rule {
        id: "missing-x-content-type-options",
        applies_to: &[SERVICE_KIND],
    },
    Rule {
        id: "missing-x-frame-options",
        applies_to: &[SERVICE_KIND],
    },
    Rule {
        id: "missing-referrer-policy",
        applies_to: &[SERVICE_KIND],
    },
    Rule {
        id: "server-banner",
        applies_to: &[SERVICE_KIND],
    },
];

pub struct HttpHeaders;

impl Plugin for HttpHeaders {
    fn name(&self) -> &'static str {
        "http_headers"
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
            let services = services(&task);
            if services.is_empty() {
                for evaluation in coverage::not_applicable(&RULES, &task.target, "no_http_service")
                {
                    sink.evaluation(evaluation).await?;
                }
                return Ok("no http services to check".into());
            }
            let client = reqwest::Client::builder()
                .timeout(REQUEST_TIMEOUT)
                // The first response's headers are what a browser sees first; a scanner
                // talks to the target directly, never through the environment's proxy.
                .redirect(reqwest::redirect::Policy::none())
                .no_proxy()
                // Headers, not certificates, are checked here (module documentation).
                .danger_accept_invalid_certs(true)
                .build()
                .map_err(|error| PluginError::retryable("internal", error.to_string()))?;
            let client = &client;
            let checked = target::check_each(
                services,
                &task.discovered_assets,
                sink,
                cancel,
                |service| async move { check(client, &service).await },
            )
            .await?;
            Ok(format!("checked the headers of {checked} http services"))
        })
    }
}

/// One HTTP service to check.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Service {
    /// `scheme://host:port`, the port always spelled out (as `tcp_connect` names services),
    /// so findings keep one resource however the service was written.
    resource: String,
    /// `scheme://host:port/`, what is fetched.
    url: Url,
}

/// The services to check, deduplicated, at most [`SERVICES_MAX`].
fn services(task: &TaskInput) -> Vec<Service> {
    let mut services: Vec<Service> = task
        .discovered_assets
        .iter()
        .filter(|asset| asset.kind == SERVICE_KIND)
        .filter_map(|asset| service(&asset.value))
        .collect();
    if services.is_empty()
        && let Some(target) = service(&task.target)
    {
        services.push(target);
    }
    services.sort();
    services.dedup();
    services.truncate(SERVICES_MAX);
    services
}

/// The service an http(s) URL points at; `None` for anything else.
fn service(text: &str) -> Option<Service> {
    let url = Url::parse(text.trim()).ok()?;
    if !matches!(url.scheme(), "http" | "https") {
        return None;
    }
    let host = match url.host()? {
        url::Host::Domain(domain) => domain.to_owned(),
        url::Host::Ipv4(address) => address.to_string(),
        url::Host::Ipv6(address) => address.to_string(),
    };
    let port = url.port_or_known_default()?;
    let resource = format!("{}://{}", url.scheme(), target::authority(&host, port));
    let url = Url::parse(&format!("{resource}/")).ok()?;
    Some(Service { resource, url })
}

/// One `GET /` of `service`: its asset, findings and evaluations, or ERROR evaluations when it
/// did not answer.
async fn check(client: &reqwest::Client, service: &Service) -> Checked {
    let resource = &service.resource;
    let url = &service.url;
    let asset = Some(v1::Asset {
        kind: SERVICE_KIND.into(),
        value: resource.clone(),
    });
    match client.get(url.clone()).send().await {
        Ok(response) => {
            let https = url.scheme() == "https";
            let findings = header_findings(resource, https, response.headers());
            let evaluations = header_evaluations(resource, https, &findings);
            Checked {
                asset,
                findings,
                evaluations,
                error: None,
            }
        }
        Err(error) => {
            let code = if error.is_connect() {
                "connection_refused"
            } else if error.is_timeout() {
                "timeout"
            } else {
                "http_error"
            };
            let message = format!("GET {url} failed: {error}");
            Checked {
                asset,
                findings: vec![],
                evaluations: coverage::errors(&RULES, resource, code, &message),
                error: Some(PluginError::retryable(code, message)),
            }
        }
    }
}

/// The evaluation of each rule on `resource` whose response gave `findings`: HSTS is not
/// applicable over plain HTTP.
pub fn header_evaluations(
    resource: &str,
    https: bool,
    findings: &[v1::Finding],
) -> Vec<v1::Evaluation> {
    coverage::concluded(&RULES, resource, findings, |rule| {
        (rule == RULES[0].id && !https)
            .then(|| v1::Evaluation::not_applicable(rule, resource, "not_https"))
    })
}

/// A security header a response should carry, and what its absence costs.
struct Expected {
    /// One of [`RULES`].
    rule_id: &'static str,
    header: &'static str,
    severity: &'static str,
    why: &'static str,
    /// Only over HTTPS (HSTS is ignored on plain HTTP).
    https_only: bool,
}

const EXPECTED: [Expected; 5] = [
    Expected {
        rule_id: "missing-strict-transport-security",
        header: "strict-transport-security",
        severity: "medium",
        why: "Without HSTS a browser may be downgraded to plain HTTP.",
        https_only: true,
    },
    Expected {
        rule_id: "missing-content-security-policy",
        header: "content-security-policy",
        severity: "medium",
        why: "Without a content security policy injected scripts run unrestricted.",
        https_only: false,
    },
    Expected {
        rule_id: "missing-x-content-type-options",
        header: "x-content-type-options",
        severity: "low",
        why: "Without `nosniff` browsers may guess content types and run uploads as scripts.",
        https_only: false,
    },
    Expected {
        rule_id: "missing-x-frame-options",
        header: "x-frame-options",
        severity: "medium",
        why: "Without X-Frame-Options or CSP frame-ancestors the page can be framed for clickjacking.",
        https_only: false,
    },
    Expected {
        rule_id: "missing-referrer-policy",
        header: "referrer-policy",
        severity: "low",
        why: "Without a referrer policy full URLs may leak to other sites.",
        https_only: false,
    },
];

/// The findings for one response's headers: each missing security header, and the server
/// banner when there is one.
pub fn header_findings(resource: &str, https: bool, headers: &HeaderMap) -> Vec<v1::Finding> {
    let frame_ancestors = headers
        .get_all("content-security-policy")
        .iter()
        .filter_map(|value| value.to_str().ok())
        .any(|policy| policy.to_ascii_lowercase().contains("frame-ancestors"));
    let mut findings = vec![];
    for expected in &EXPECTED {
        if expected.https_only && !https {
            continue;
        }
        let present = headers.contains_key(HeaderName::from_static(expected.header))
            || (expected.header == "x-frame-options" && frame_ancestors);
        if !present {
            findings.push(v1::Finding {
                rule_id: expected.rule_id.into(),
                resource: resource.to_owned(),
                severity: expected.severity.into(),
                title: format!("Missing {} header", expected.header),
                description: expected.why.into(),
                evidence: format!("GET / answered without {}", expected.header),
                ..Default::default()
            });
        }
    }
    if let Some(server) = headers.get("server").and_then(|value| value.to_str().ok()) {
        let banner: String = server.chars().take(BANNER_BYTES_MAX).collect();
        findings.push(v1::Finding {
            rule_id: "server-banner".into(),
            resource: resource.to_owned(),
            severity: "info".into(),
            title: "Server banner disclosed".into(),
            description:
                "The Server header names the software, which helps an attacker pick exploits."
                    .into(),
            evidence: format!("server: {banner}"),
            ..Default::default()
        });
    }
    findings
}

#[cfg(test)]
mod tests {
    use reqwest::header::HeaderValue;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    use worker::ResultItem;

    use super::*;

    fn rules(findings: &[v1::Finding]) -> Vec<&str> {
        findings
            .iter()
            .map(|finding| finding.rule_id.as_str())
            .collect()
    }

    #[test]
    fn every_missing_header_is_a_finding() {
        let findings = header_findings("http://h:80", false, &HeaderMap::new());
        assert_eq!(
            rules(&findings),
            [
                "missing-content-security-policy",
                "missing-x-content-type-options",
                "missing-x-frame-options",
                "missing-referrer-policy"
            ]
        );
        let statuses: Vec<_> = header_evaluations("http://h:80", false, &findings)
            .into_iter()
            .map(|evaluation| {
                (
                    evaluation.rule_id,
                    evaluation.status,
                    evaluation.reason_code,
                )
            })
            .collect();
        let status = |rule: &str, status: &str, reason: &str| {
            (rule.to_owned(), status.to_owned(), reason.to_owned())
        };
        assert_eq!(
            statuses,
            [
                status(
                    "missing-strict-transport-security",
                    "not_applicable",
                    "not_https"
                ),
                status("missing-content-security-policy", "fail", ""),
                status("missing-x-content-type-options", "fail", ""),
                status("missing-x-frame-options", "fail", ""),
                status("missing-referrer-policy", "fail", ""),
                status("server-banner", "pass", ""),
            ]
        );
        let https = header_findings("https://h:443", true, &HeaderMap::new());
        assert_eq!(https[0].rule_id, "missing-strict-transport-security");
        assert!(
            https
                .iter()
                .all(|finding| finding.resource == "https://h:443")
        );
        let evaluations = header_evaluations("https://h:443", true, &https);
        assert_eq!(evaluations[0].status, "fail", "HSTS is expected over https");
    }

    #[test]
    fn every_rule_is_one_the_findings_use() {
        let mut headers = HeaderMap::new();
        headers.insert("server", HeaderValue::from_static("x"));
        let findings = header_findings("https://h:443", true, &headers);
        let ids: Vec<&str> = RULES.iter().map(|rule| rule.id).collect();
        assert_eq!(rules(&findings), ids);
        assert!(
            header_evaluations("https://h:443", true, &findings)
                .iter()
                .all(|evaluation| evaluation.status == "fail")
        );
    }

    #[test]
    fn frame_ancestors_stands_in_for_x_frame_options_and_banners_are_reported() {
        let mut headers = HeaderMap::new();
        headers.insert(
            "content-security-policy",
            HeaderValue::from_static("frame-ancestors 'none'"),
        );
        headers.insert(
            "x-content-type-options",
            HeaderValue::from_static("nosniff"),
        );
        headers.insert("referrer-policy", HeaderValue::from_static("no-referrer"));
        headers.insert("server", HeaderValue::from_static("nginx/1.25.3"));
        let findings = header_findings("http://h:80", false, &headers);
        assert_eq!(rules(&findings), ["server-banner"]);
        assert_eq!(findings[0].evidence, "server: nginx/1.25.3");
        let evaluations = header_evaluations("http://h:80", false, &findings);
        let banner = evaluations.last().unwrap();
        assert_eq!(
            (banner.rule_id.as_str(), banner.status.as_str()),
            ("server-banner", "fail")
        );
        assert_eq!(banner.finding_discriminator, findings[0].discriminator);
        assert_eq!(
            evaluations[1..5]
                .iter()
                .map(|evaluation| evaluation.status.as_str())
                .collect::<Vec<_>>(),
            ["pass"; 4],
            "frame-ancestors stands in for X-Frame-Options"
        );
    }

    #[test]
    fn services_come_from_discovered_assets_or_the_target() {
        let mut task = TaskInput::for_target("http_headers", "http://127.0.0.1:8080/login");
        let only_target: Vec<_> = services(&task)
            .into_iter()
            .map(|service| service.resource)
            .collect();
        assert_eq!(only_target, ["http://127.0.0.1:8080"]);
        task.discovered_assets = vec![
            v1::Asset {
                kind: "http_service".into(),
                value: "http://127.0.0.1:9000".into(),
            },
            v1::Asset {
                kind: "http_service".into(),
                value: "http://127.0.0.1:9000/".into(),
            },
            v1::Asset {
                kind: "tcp_service".into(),
                value: "127.0.0.1:22".into(),
            },
            v1::Asset {
                kind: "http_service".into(),
                value: "https://[::1]".into(),
            },
        ];
        let discovered: Vec<_> = services(&task)
            .into_iter()
            .map(|service| service.resource)
            .collect();
        assert_eq!(discovered, ["http://127.0.0.1:9000", "https://[::1]:443"]);
        let nothing = TaskInput::for_target("http_headers", "10.0.0.1:22");
        assert!(services(&nothing).is_empty());
    }

    /// Serves one canned response per connection on 127.0.0.1, for `connections` connections.
    async fn serve(response: &'static str, connections: usize) -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            for _ in 0..connections {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut request = vec![0; 4096];
                let _ = stream.read(&mut request).await.unwrap();
                stream.write_all(response.as_bytes()).await.unwrap();
                stream.shutdown().await.unwrap();
            }
        });
        port
    }

    /// Runs the plugin on `task`: its result, its findings and everything it sent (checked
    /// for coverage: every rule evaluated on each service it reported).
    async fn run(
        task: TaskInput,
    ) -> (
        Result<String, PluginError>,
        Vec<v1::Finding>,
        Vec<ResultItem>,
    ) {
        let (sink, mut receiver) = ResultSink::channel(256);
        let result = HttpHeaders
            .run(task.clone(), sink, CancellationToken::new())
            .await;
        let mut items = vec![];
        while let Ok(item) = receiver.try_recv() {
            items.push(item);
        }
        let findings = items
            .iter()
            .filter_map(|item| match item {
                ResultItem::Finding(finding) => Some(finding.clone()),
                ResultItem::Asset(_) | ResultItem::Evaluation(_) => None,
            })
            .collect();
        coverage::testing::assert_covered(HttpHeaders.rules(), &task, &items);
        (result, findings, items)
    }

    #[tokio::test]
    async fn checks_a_discovered_service_over_http() {
        let port = serve(
            "HTTP/1.1 200 OK\r\nServer: test/1.0\r\nX-Frame-Options: DENY\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            1,
        )
        .await;
        let mut task = TaskInput::for_target("http_headers", "127.0.0.1");
        task.discovered_assets = vec![v1::Asset {
            kind: "http_service".into(),
            value: format!("http://127.0.0.1:{port}"),
        }];
        let (result, findings, items) = run(task).await;
        assert_eq!(result.unwrap(), "checked the headers of 1 http services");
        assert_eq!(
            rules(&findings),
            [
                "missing-content-security-policy",
                "missing-x-content-type-options",
                "missing-referrer-policy",
                "server-banner"
            ]
        );
        let resource = format!("http://127.0.0.1:{port}");
        assert!(findings.iter().all(|finding| finding.resource == resource));
        assert!(
            !items
                .iter()
                .any(|item| matches!(item, ResultItem::Asset(_))),
            "a discovered service is not reported again"
        );
        assert_eq!(
            coverage::testing::on(&items, &resource),
            [
                ("missing-content-security-policy", "fail"),
                ("missing-referrer-policy", "fail"),
                ("missing-strict-transport-security", "not_applicable"),
                ("missing-x-content-type-options", "fail"),
                ("missing-x-frame-options", "pass"),
                ("server-banner", "fail"),
            ]
            .into()
        );
    }

    #[tokio::test]
    async fn a_refused_connection_is_retryable() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let (result, _, items) = run(TaskInput::for_target(
            "http_headers",
            &format!("http://127.0.0.1:{port}/"),
        ))
        .await;
        let error = result.unwrap_err();
        assert_eq!(
            (error.code.as_str(), error.retryable),
            ("connection_refused", true)
        );
        let statuses = coverage::testing::statuses(&items);
        assert_eq!(statuses.len(), RULES.len());
        assert!(
            statuses
                .values()
                .all(|status| *status == ("error".into(), "connection_refused".into())),
            "{statuses:?}"
        );
    }

    #[tokio::test]
    async fn an_unreachable_service_is_an_error_beside_the_services_checked() {
        let port = serve(
            "HTTP/1.1 200 OK\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
            1,
        )
        .await;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let closed = listener.local_addr().unwrap().port();
        drop(listener);
        let mut task = TaskInput::for_target("http_headers", "127.0.0.1");
        task.discovered_assets = [port, closed]
            .map(|port| v1::Asset {
                kind: "http_service".into(),
                value: format!("http://127.0.0.1:{port}"),
            })
            .into();
        let (result, _, items) = run(task).await;
        assert_eq!(result.unwrap(), "checked the headers of 1 http services");
        let down = coverage::testing::on(&items, &format!("http://127.0.0.1:{closed}"));
        assert_eq!(down.len(), RULES.len());
        assert!(down.values().all(|status| *status == "error"), "{down:?}");
        let up = coverage::testing::on(&items, &format!("http://127.0.0.1:{port}"));
        assert_eq!(up["missing-referrer-policy"], "fail");
    }

    #[tokio::test]
    async fn without_an_http_service_no_rule_applies_to_the_target() {
        let task = TaskInput::for_target("http_headers", "10.0.0.1:22");
        let (result, findings, items) = run(task).await;
        assert_eq!(result.unwrap(), "no http services to check");
        assert!(findings.is_empty());
        let statuses = coverage::testing::statuses(&items);
        assert_eq!(statuses.len(), RULES.len());
        for ((_, resource), status) in statuses {
            assert_eq!(resource, "10.0.0.1:22");
            assert_eq!(status, ("not_applicable".into(), "no_http_service".into()));
        }
    }

    /// Serves one canned response over TLS, with a fresh self-signed certificate (which a
    /// header check does not judge).
    async fn serve_tls(response: &'static str) -> u16 {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = rcgen::CertificateParams::new(vec!["localhost".to_owned()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let config = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![certificate.der().clone()],
                rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
            )
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut stream = acceptor.accept(stream).await.unwrap();
            let mut request = vec![0; 4096];
            let _ = stream.read(&mut request).await.unwrap();
            stream.write_all(response.as_bytes()).await.unwrap();
            stream.shutdown().await.unwrap();
        });
        port
    }

    #[tokio::test]
    async fn checks_a_service_over_https_expecting_hsts_whatever_its_certificate() {
        let port = serve_tls(
            "HTTP/1.1 200 OK\r\nContent-Security-Policy: default-src 'self'; frame-ancestors 'none'\r\nX-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
        )
        .await;
        let target = format!("https://127.0.0.1:{port}/");
        let (result, findings, items) = run(TaskInput::for_target("http_headers", &target)).await;
        assert_eq!(result.unwrap(), "checked the headers of 1 http services");
        assert_eq!(rules(&findings), ["missing-strict-transport-security"]);
        let resource = format!("https://127.0.0.1:{port}");
        assert_eq!(findings[0].resource, resource);
        assert!(
            items.contains(&ResultItem::Asset(v1::Asset {
                kind: "http_service".into(),
                value: resource.clone(),
            })),
            "the service checked is an asset, so its rules are required on it"
        );
        let statuses = coverage::testing::on(&items, &resource);
        assert_eq!(statuses["missing-strict-transport-security"], "fail");
        assert_eq!(
            statuses
                .values()
                .filter(|status| **status == "pass")
                .count(),
            5
        );
    }
}
