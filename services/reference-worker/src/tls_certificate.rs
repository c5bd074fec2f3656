//! `tls_certificate`: the certificate and protocol versions of each TLS service of a scan: the
//! `https` services an earlier plugin discovered, or the target itself (`https://host:port`,
//! or `host:port`, 443 by default). One handshake reads the chain the server presents; the
//! leaf is then judged on its own, so each condition is reported whatever the others:
//!
//! | rule | severity | when |
//! |---|---|---|
//! | `certificate-expired` | high | the leaf's `notAfter` has passed |
//! | `certificate-not-yet-valid` | high | its `notBefore` is still to come |
//! | `certificate-expires-soon` | medium | it expires within [`EXPIRY_WARNING_DAYS`] days |
//! | `certificate-hostname-mismatch` | high | it is not valid for the host asked for |
//! | `certificate-self-signed` | high | it is its own issuer |
//! | `certificate-untrusted` | high | its chain leads to no trusted authority (the web's roots, and `PALISADE_TLS_TRUST`'s) |
//! | `certificate-weak-key` | high | an RSA key under 2048 bits, or an EC key under 256 |
//! | `certificate-weak-signature` | medium | signed with MD5 or SHA-1 |
//! | `legacy-protocol-tls1.0`, `legacy-protocol-tls1.1` | medium | the server accepts a TLS 1.0 or 1.1 handshake |
//!
//! Also `certificate-unreadable` (high: the leaf is no X.509 certificate) and
//! `tls-handshake-failed` (medium: no TLS 1.2 or 1.3 handshake).
//!
//! Each service checked is a `tls_service` asset (`tls://host:port`, the resource its
//! findings name), reported unless it was discovered so, and every rule of [`RULES`] is evaluated on it: FAIL after its finding,
//! else PASS, except NOT_APPLICABLE for `certificate-untrusted` on a self-signed certificate
//! (`self_signed`) and `certificate-expires-soon` on an expired one (`certificate_expired`),
//! and ERROR for the certificate rules when there was no certificate to judge
//! (`tls_handshake_failed`, `certificate_unreadable`). A service that cannot be reached has
//! every rule in ERROR (`connection_refused`, `timeout`) and the others are still checked; the
//! task fails (retryable) only when none could be. A scan without a TLS service (an `http://`
//! target, a URL of another scheme, with no https service discovered) has every rule
//! NOT_APPLICABLE on its target (`no_tls_service`).
//!
//! The legacy probes send a TLS 1.0 or 1.1 ClientHello and read the server's first record: a
//! ServerHello of that version means the server would talk it.

use std::sync::Arc;
use std::time::Duration;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio_util::sync::CancellationToken;
use worker::{BoxFuture, Plugin, PluginError, ResultSink, Rule, TaskInput, v1};

use crate::coverage;
use crate::target::Checked;

/// A certificate expiring within this many days is reported.
pub const EXPIRY_WARNING_DAYS: i64 = 30;
/// One connection's budget, connect to last byte read.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Services checked per task.
pub const SERVICES_MAX: usize = 64;

/// The asset kind of the services checked, and of the resources the rules apply to.
pub const SERVICE_KIND: &str = "tls_service";
const KINDS: &[&str] = &[SERVICE_KIND];

/// What it checks on each TLS service (the module's table).
pub const RULES: [Rule; 12] = [
    Rule {
        id: "tls-handshake-failed",
        applies_to: KINDS,
    },
    Rule {
        id: "certificate-unreadable",
        applies_to: KINDS,
    },
    Rule {
        id: "certificate-expired",
        applies_to: KINDS,
    },
    Rule {
        id: "certificate-not-yet-valid",
        applies_to: KINDS,
    },
    Rule {
        id: "certificate-expires-soon",
        applies_to: KINDS,
    },
    Rule {
        id: "certificate-hostname-mismatch",
        applies_to: KINDS,
    },
    Rule {
        id: "certificate-self-signed",
        applies_to: KINDS,
    },
    Rule {
        id: "certificate-untrusted",
        applies_to: KINDS,
    },
    Rule {
        id: "certificate-weak-key",
        applies_to: KINDS,
    },
    Rule {
        id: "certificate-weak-signature",
        applies_to: KINDS,
    },
    Rule {
        id: "legacy-protocol-tls1.0",
        applies_to: KINDS,
    },
    Rule {
        id: "legacy-protocol-tls1.1",
        applies_to: KINDS,
    },
];

pub struct TlsCertificate {
    /// The web's roots and the extra authorities configured.
    roots: Arc<rustls::RootCertStore>,
}

impl TlsCertificate {
    /// Trusting the web's roots (webpki-roots) and `extra` authorities.
    pub fn new(extra: Vec<CertificateDer<'static>>) -> Self {
        let mut roots = rustls::RootCertStore::empty();
        roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
        let (_added, _ignored) = roots.add_parsable_certificates(extra);
        Self {
            roots: Arc::new(roots),
        }
    }
}

impl Plugin for TlsCertificate {
    fn name(&self) -> &'static str {
        "tls_certificate"
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
                for evaluation in coverage::not_applicable(&RULES, &task.target, "no_tls_service") {
                    sink.evaluation(evaluation).await?;
                }
                return Ok("no TLS services to check".into());
            }
            let checked = crate::target::check_each(
                services,
                &task.discovered_assets,
                sink,
                cancel,
                |(host, port)| async move { self.check(&host, port).await },
            )
            .await?;
            Ok(format!("checked {checked} TLS services"))
        })
    }
}

/// The services to check: discovered `https` services, else the target.
fn services(task: &TaskInput) -> Vec<(String, u16)> {
    let mut services: Vec<(String, u16)> = task
        .discovered_assets
        .iter()
        .filter(|asset| asset.kind == "http_service")
        .filter_map(|asset| reqwest::Url::parse(&asset.value).ok())
        .filter(|url| url.scheme() == "https")
        .filter_map(|url| Some((url.host_str()?.to_owned(), url.port_or_known_default()?)))
        .collect();
    if services.is_empty()
        && let Some(service) = target_service(task.target.trim())
    {
        services.push(service);
    }
    for (host, _) in &mut services {
        // `[::1]` as a URL host is `::1` to connect to and to name.
        *host = host
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
    }
    services.sort();
    services.dedup();
    services.truncate(SERVICES_MAX);
    services
}

/// The TLS service a target names: an `https` URL's host and port, or `host[:port]` (443 by
/// default). A URL of any other scheme (`http://`) names none.
fn target_service(target: &str) -> Option<(String, u16)> {
    let url = if target.contains("://") {
        reqwest::Url::parse(target)
            .ok()
            .filter(|url| url.scheme() == "https")?
    } else {
        reqwest::Url::parse(&format!("https://{target}")).ok()?
    };
    Some((url.host_str()?.to_owned(), url.port_or_known_default()?))
}

/// A service that could not be checked: every rule in ERROR, and the error that fails the
/// task when no service could be checked.
fn unchecked(asset: Option<v1::Asset>, resource: &str, error: PluginError) -> Checked {
    Checked {
        asset,
        findings: vec![],
        evaluations: coverage::errors(&RULES, resource, &error.code, &error.message),
        error: Some(error),
    }
}

/// The evaluation of each rule on `resource` whose check gave `findings`, `handshake_failed`
/// when no TLS 1.2/1.3 handshake gave a certificate to judge.
pub fn evaluations(
    resource: &str,
    findings: &[v1::Finding],
    handshake_failed: bool,
) -> Vec<v1::Evaluation> {
    let found = |rule: &str| findings.iter().any(|finding| finding.rule_id == rule);
    coverage::concluded(&RULES, resource, findings, |rule| {
        let certificate = rule.starts_with("certificate-");
        if certificate && handshake_failed {
            Some(v1::Evaluation::error(
                rule,
                resource,
                "tls_handshake_failed",
            ))
        } else if certificate && found("certificate-unreadable") {
            Some(v1::Evaluation::error(
                rule,
                resource,
                "certificate_unreadable",
            ))
        } else if rule == "certificate-untrusted" && found("certificate-self-signed") {
            Some(v1::Evaluation::not_applicable(
                rule,
                resource,
                "self_signed",
            ))
        } else if rule == "certificate-expires-soon" && found("certificate-expired") {
            Some(v1::Evaluation::not_applicable(
                rule,
                resource,
                "certificate_expired",
            ))
        } else {
            None
        }
    })
}

impl TlsCertificate {
    async fn check(&self, host: &str, port: u16) -> Checked {
        let resource = format!("tls://{}", crate::target::authority(host, port));
        let asset = Some(v1::Asset {
            kind: SERVICE_KIND.into(),
            value: resource.clone(),
        });
        let mut findings = Vec::new();
        let Ok(server_name) = ServerName::try_from(host.to_owned()) else {
            let error =
                PluginError::permanent("invalid_target", format!("{host:?} is not a host name"));
            return unchecked(asset, &resource, error);
        };
        let handshake_failed = match self.presented_chain(host, port, server_name.clone()).await {
            Ok(chain) => {
                findings.extend(self.judge(&resource, &server_name, &chain, now()));
                false
            }
            Err(HandshakeFailure::Connect { code, error }) => {
                let message = format!("cannot connect to {host}:{port}: {error}");
                return unchecked(asset, &resource, PluginError::retryable(code, message));
            }
            // A server that speaks no TLS 1.2 or 1.3 may still speak a legacy version.
            Err(HandshakeFailure::Tls(error)) => {
                findings.push(finding(
                    &resource,
                    "tls-handshake-failed",
                    "medium",
                    "No TLS 1.2 or 1.3 handshake",
                    &format!("A TLS 1.2/1.3 handshake failed: {error}"),
                ));
                true
            }
        };
        for (version, rule) in [
            (0x0301_u16, "legacy-protocol-tls1.0"),
            (0x0302, "legacy-protocol-tls1.1"),
        ] {
            if accepts_legacy_version(host, port, version).await {
                findings.push(finding(
                    &resource,
                    rule,
                    "medium",
                    &format!("TLS {}.{} accepted", (version >> 8) - 2, (version & 0xff) - 1),
                    "The server accepts a deprecated TLS version (RFC 8996): disable TLS 1.0 and 1.1.",
                ));
            }
        }
        let evaluations = evaluations(&resource, &findings, handshake_failed);
        Checked {
            asset,
            findings,
            evaluations,
            error: None,
        }
    }

    /// The chain the server presents, leaf first.
    async fn presented_chain(
        &self,
        host: &str,
        port: u16,
        server_name: ServerName<'static>,
    ) -> Result<Vec<CertificateDer<'static>>, HandshakeFailure> {
        let recorder = Arc::new(Recorder::default());
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .map_err(|error| HandshakeFailure::Tls(error.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(recorder.clone())
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let stream = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((host, port)),
        )
        .await
        .map_err(|_| HandshakeFailure::Connect {
            code: "timeout",
            error: "timed out".into(),
        })?
        .map_err(|error| HandshakeFailure::Connect {
            code: "connection_refused",
            error: error.to_string(),
        })?;
        tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(server_name, stream))
            .await
            .map_err(|_| HandshakeFailure::Tls("timed out".into()))?
            .map_err(|error| HandshakeFailure::Tls(error.to_string()))?;
        let chain = recorder.chain.lock().expect("not poisoned").clone();
        if chain.is_empty() {
            return Err(HandshakeFailure::Tls(
                "the server presented no certificate".into(),
            ));
        }
        Ok(chain)
    }

    /// Every condition of the module's table that `chain` (leaf first) meets for `server_name`
    /// at `now`.
    pub fn judge(
        &self,
        resource: &str,
        server_name: &ServerName<'_>,
        chain: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Vec<v1::Finding> {
        let mut findings = Vec::new();
        let Some(leaf_der) = chain.first() else {
            return findings;
        };
        let Ok((_, leaf)) = x509_parser::parse_x509_certificate(leaf_der.as_ref()) else {
            findings.push(finding(
                resource,
                "certificate-unreadable",
                "high",
                "Unreadable certificate",
                "The server's certificate is not a valid X.509 certificate.",
            ));
            return findings;
        };
        let subject = leaf.subject().to_string();
        let evidence = |text: String| format!("{text} (subject: {subject})");
        findings.extend(validity_findings(resource, &leaf, now, &evidence));
        let for_name = webpki::EndEntityCert::try_from(leaf_der)
            .map(|cert| cert.verify_is_valid_for_subject_name(server_name).is_ok())
            .unwrap_or(false);
        if !for_name {
            findings.push(with_evidence(
                finding(resource, "certificate-hostname-mismatch", "high", "Certificate not valid for the host", "The certificate names other hosts than the one connected to: clients refuse it."),
                evidence(format!("asked for {}", server_name.to_str())),
            ));
        }
        let self_signed = leaf.subject() == leaf.issuer() && leaf.verify_signature(None).is_ok();
        let not_before = leaf.validity().not_before.timestamp();
        if self_signed {
            findings.push(with_evidence(
                finding(
                    resource,
                    "certificate-self-signed",
                    "high",
                    "Self-signed certificate",
                    "The certificate is its own issuer: no client can tell it from an attacker's.",
                ),
                evidence("issuer is the subject".into()),
            ));
        } else if !self.trusted(leaf_der, &chain[1..], server_name, not_before) {
            findings.push(with_evidence(
                finding(
                    resource,
                    "certificate-untrusted",
                    "high",
                    "Untrusted certificate chain",
                    "The chain leads to no trusted authority: clients refuse it.",
                ),
                evidence(format!("issuer: {}", leaf.issuer())),
            ));
        }
        findings.extend(strength_findings(resource, &leaf, &evidence));
        findings
    }

    /// Whether the chain leads to a trusted authority, judged at a moment inside the leaf's
    /// validity (so an expired certificate is judged on its chain alone).
    fn trusted(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        not_before: i64,
    ) -> bool {
        let Ok(verifier) = rustls::client::WebPkiServerVerifier::builder_with_provider(
            self.roots.clone(),
            Arc::new(rustls::crypto::ring::default_provider()),
        )
        .build() else {
            return false;
        };
        let at = UnixTime::since_unix_epoch(Duration::from_secs(not_before.max(0) as u64 + 1));
        match verifier.verify_server_cert(leaf, intermediates, server_name, &[], at) {
            Ok(_) => true,
            // Trusted, for another name: the hostname finding says so.
            Err(rustls::Error::InvalidCertificate(rustls::CertificateError::NotValidForName))
            | Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForNameContext { .. },
            )) => true,
            Err(_) => false,
        }
    }
}

/// The leaf's validity period at `now`: expired, expiring within [`EXPIRY_WARNING_DAYS`], or
/// not yet valid.
fn validity_findings(
    resource: &str,
    leaf: &x509_parser::certificate::X509Certificate<'_>,
    now: UnixTime,
    evidence: &dyn Fn(String) -> String,
) -> Vec<v1::Finding> {
    let mut findings = Vec::new();
    let now_seconds = now.as_secs() as i64;
    let (not_before, not_after) = (
        leaf.validity().not_before.timestamp(),
        leaf.validity().not_after.timestamp(),
    );
    if now_seconds > not_after {
        findings.push(with_evidence(
            finding(
                resource,
                "certificate-expired",
                "high",
                "Certificate expired",
                "The certificate's validity has ended: clients refuse it.",
            ),
            evidence(format!("notAfter {}", leaf.validity().not_after)),
        ));
    } else if not_after - now_seconds < EXPIRY_WARNING_DAYS * 86_400 {
        findings.push(with_evidence(
            finding(
                resource,
                "certificate-expires-soon",
                "medium",
                "Certificate expires soon",
                &format!("The certificate expires within {EXPIRY_WARNING_DAYS} days: renew it."),
            ),
            evidence(format!("notAfter {}", leaf.validity().not_after)),
        ));
    }
    if now_seconds < not_before {
        findings.push(with_evidence(
            finding(resource, "certificate-not-yet-valid", "high", "Certificate not yet valid", "The certificate's validity has not begun: clients refuse it (or the server's clock is wrong)."),
            evidence(format!("notBefore {}", leaf.validity().not_before)),
        ));
    }
    findings
}

/// The leaf's key and signature: too short a key, or a signature collisions break.
fn strength_findings(
    resource: &str,
    leaf: &x509_parser::certificate::X509Certificate<'_>,
    evidence: &dyn Fn(String) -> String,
) -> Vec<v1::Finding> {
    let mut findings = Vec::new();
    if let Some(weakness) = weak_key(leaf) {
        findings.push(with_evidence(
            finding(resource, "certificate-weak-key", "high", "Weak certificate key", "The certificate's key is too short to resist factoring or discrete-log attacks: issue one with RSA 2048+ or ECDSA P-256+."),
            evidence(weakness),
        ));
    }
    let algorithm = leaf.signature_algorithm.algorithm.to_id_string();
    if WEAK_SIGNATURES.contains(&algorithm.as_str()) {
        findings.push(with_evidence(
            finding(
                resource,
                "certificate-weak-signature",
                "medium",
                "Weak certificate signature",
                "The certificate is signed with MD5 or SHA-1, which collisions break.",
            ),
            evidence(format!("signature algorithm {algorithm}")),
        ));
    }
    findings
}

/// md5WithRSAEncryption, sha1WithRSAEncryption, ecdsa-with-SHA1, dsa-with-sha1.
const WEAK_SIGNATURES: [&str; 4] = [
    "1.2.840.113549.1.1.4",
    "1.2.840.113549.1.1.5",
    "1.2.840.10045.4.1",
    "1.2.840.10040.4.3",
];

/// What is weak about the leaf's key, if anything.
fn weak_key(leaf: &x509_parser::certificate::X509Certificate<'_>) -> Option<String> {
    use x509_parser::public_key::PublicKey;
    match leaf.public_key().parsed().ok()? {
        PublicKey::RSA(rsa) if rsa.key_size() < 2048 => {
            Some(format!("RSA key of {} bits", rsa.key_size()))
        }
        PublicKey::EC(point) if point.key_size() < 256 => {
            Some(format!("EC key of {} bits", point.key_size()))
        }
        PublicKey::DSA(_) => Some("DSA key".into()),
        _ => None,
    }
}

fn now() -> UnixTime {
    UnixTime::now()
}

fn finding(
    resource: &str,
    rule: &str,
    severity: &str,
    title: &str,
    description: &str,
) -> v1::Finding {
    v1::Finding {
        rule_id: rule.into(),
        resource: resource.into(),
        severity: severity.into(),
        title: title.into(),
        description: description.into(),
        ..Default::default()
    }
}

fn with_evidence(mut finding: v1::Finding, evidence: String) -> v1::Finding {
    finding.evidence = evidence.chars().take(512).collect();
    finding
}

#[derive(Debug)]
enum HandshakeFailure {
    /// No TCP connection: `connection_refused` or `timeout`.
    Connect {
        code: &'static str,
        error: String,
    },
    Tls(String),
}

/// Accepts any chain and keeps it, so the handshake completes and the chain can be judged.
#[derive(Debug, Default)]
struct Recorder {
    chain: std::sync::Mutex<Vec<CertificateDer<'static>>>,
}

impl ServerCertVerifier for Recorder {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let mut chain = vec![end_entity.clone().into_owned()];
        chain.extend(intermediates.iter().map(|cert| cert.clone().into_owned()));
        *self.chain.lock().expect("not poisoned") = chain;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn verify_tls13_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        Ok(HandshakeSignatureValid::assertion())
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        rustls::crypto::ring::default_provider()
            .signature_verification_algorithms
            .supported_schemes()
    }
}

/// A ClientHello record offering only `version` (0x0301 for TLS 1.0, 0x0302 for 1.1) and the
/// cipher suites those versions have.
pub fn legacy_client_hello(version: u16) -> Vec<u8> {
    let suites: [u16; 6] = [0xc013, 0xc014, 0x002f, 0x0035, 0x000a, 0xc009];
    let mut body = Vec::new();
    body.extend_from_slice(&version.to_be_bytes());
    body.extend_from_slice(&[0x42; 32]); // random
    body.push(0); // no session id
    body.extend_from_slice(&((suites.len() * 2) as u16).to_be_bytes());
    for suite in suites {
        body.extend_from_slice(&suite.to_be_bytes());
    }
    body.extend_from_slice(&[1, 0]); // compression: null
    // Extensions: supported groups and EC point formats, which ECDHE suites need.
    let extensions: [u8; 14] = [
        0x00, 0x0a, 0x00, 0x06, 0x00, 0x04, 0x00, 0x17, 0x00, 0x18, // secp256r1, secp384r1
        0x00, 0x0b, 0x00, 0x02,
    ];
    let formats: [u8; 2] = [0x01, 0x00];
    body.extend_from_slice(&((extensions.len() + formats.len()) as u16).to_be_bytes());
    body.extend_from_slice(&extensions);
    body.extend_from_slice(&formats);
    let mut handshake = vec![0x01];
    handshake.extend_from_slice(&(body.len() as u32).to_be_bytes()[1..]);
    handshake.extend_from_slice(&body);
    let mut record = vec![0x16];
    record.extend_from_slice(&0x0301_u16.to_be_bytes());
    record.extend_from_slice(&(handshake.len() as u16).to_be_bytes());
    record.extend_from_slice(&handshake);
    record
}

/// Whether the server answers a `version` ClientHello with a ServerHello of that version.
async fn accepts_legacy_version(host: &str, port: u16, version: u16) -> bool {
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(&legacy_client_hello(version)).await.ok()?;
        // Record header (5) + handshake type (1) + length (3) + server_version (2).
        let mut head = [0_u8; 11];
        stream.read_exact(&mut head).await.ok()?;
        Some(
            head[0] == 0x16
                && head[5] == 0x02
                && u16::from_be_bytes([head[9], head[10]]) == version,
        )
    };
    tokio::time::timeout(CONNECT_TIMEOUT, probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};
    use rustls::pki_types::PrivateKeyDer;
    use worker::ResultItem;

    use super::*;

    struct Authority {
        der: CertificateDer<'static>,
        issuer: Issuer<'static, KeyPair>,
    }

    fn authority(name: &str) -> Authority {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, name);
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Authority {
            der: cert.der().clone(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A leaf for `names`, valid from `from` to `until` days from today, signed by `by` (self-
    /// signed when `None`): its chain (leaf first) and key.
    fn leaf(
        names: &[&str],
        from: i64,
        until: i64,
        by: Option<&Authority>,
    ) -> (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>) {
        let mut params = CertificateParams::new(
            names
                .iter()
                .map(|name| (*name).to_owned())
                .collect::<Vec<_>>(),
        )
        .unwrap();
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, names[0]);
        // A date `days` from today, as rcgen takes it.
        let day = |days: i64| {
            use chrono::Datelike as _;
            let date = chrono::Utc::now().date_naive() + chrono::TimeDelta::days(days);
            rcgen::date_time_ymd(date.year(), date.month() as u8, date.day() as u8)
        };
        params.not_before = day(from);
        params.not_after = day(until);
        let key = KeyPair::generate().unwrap();
        let chain = match by {
            Some(authority) => vec![
                params
                    .signed_by(&key, &authority.issuer)
                    .unwrap()
                    .der()
                    .clone(),
                authority.der.clone(),
            ],
            None => vec![params.self_signed(&key).unwrap().der().clone()],
        };
        (chain, PrivateKeyDer::Pkcs8(key.serialize_der().into()))
    }

    /// Serves TLS 1.2/1.3 with `chain` on 127.0.0.1 for as many connections as come.
    async fn serve(chain: Vec<CertificateDer<'static>>, key: PrivateKeyDer<'static>) -> u16 {
        let config = rustls::ServerConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    if let Ok(mut stream) = acceptor.accept(stream).await {
                        let _ = stream.shutdown().await;
                    }
                });
            }
        });
        port
    }

    /// Runs `plugin` on `target`: its result and everything it sent, checked for coverage
    /// (every rule evaluated on each service it reported).
    async fn run(
        plugin: &TlsCertificate,
        target: &str,
    ) -> (Result<String, PluginError>, Vec<ResultItem>) {
        let (sink, mut receiver) = ResultSink::channel(256);
        let task = TaskInput::for_target("tls_certificate", target);
        let result = plugin
            .run(task.clone(), sink, CancellationToken::new())
            .await;
        let mut items = Vec::new();
        while let Ok(item) = receiver.try_recv() {
            items.push(item);
        }
        coverage::testing::assert_covered(&RULES, &task, &items);
        (result, items)
    }

    /// The rules of the findings of a run on `target`, sorted, and its evaluations' statuses
    /// by rule.
    async fn rules(
        plugin: &TlsCertificate,
        target: &str,
    ) -> (Vec<String>, BTreeMap<String, (String, String)>) {
        let (result, items) = run(plugin, target).await;
        result.expect("checked");
        let mut rules: Vec<String> = items
            .iter()
            .filter_map(|item| match item {
                ResultItem::Finding(finding) => Some(finding.rule_id.clone()),
                ResultItem::Asset(_) | ResultItem::Evaluation(_) => None,
            })
            .collect();
        rules.sort();
        let statuses = coverage::testing::statuses(&items)
            .into_iter()
            .map(|((rule, resource), status)| {
                assert!(resource.starts_with("tls://"), "{resource}");
                (rule, status)
            })
            .collect();
        (rules, statuses)
    }

    /// The status each rule has when `failed` fail and `exceptions` say otherwise: PASS for
    /// the rest.
    fn expected_statuses(
        failed: &[&str],
        exceptions: &[Exception<'_>],
    ) -> BTreeMap<String, (String, String)> {
        RULES
            .iter()
            .map(|rule| {
                let status = match exceptions.iter().find(|(id, _, _)| *id == rule.id) {
                    Some((_, status, reason)) => ((*status).to_owned(), (*reason).to_owned()),
                    None if failed.contains(&rule.id) => ("fail".into(), String::new()),
                    None => ("pass".into(), String::new()),
                };
                (rule.id.to_owned(), status)
            })
            .collect()
    }

    /// A certificate chain and its leaf's key, as a test server presents them.
    type Chain = (Vec<CertificateDer<'static>>, PrivateKeyDer<'static>);

    /// A rule whose status is not PASS or FAIL: (rule, status, reason).
    type Exception<'a> = (&'a str, &'a str, &'a str);

    /// A certificate served: what it is, its chain, the rules it fails, the exceptions.
    type Case<'a> = (&'a str, Chain, &'a [&'a str], &'a [Exception<'a>]);

    #[tokio::test]
    async fn a_good_certificate_gives_nothing_and_each_condition_its_finding() {
        let trusted = authority("palisade test authority");
        let stranger = authority("someone else's authority");
        let plugin = TlsCertificate::new(vec![trusted.der.clone()]);
        let expired_exception = [(
            "certificate-expires-soon",
            "not_applicable",
            "certificate_expired",
        )];
        let self_signed_exception = [("certificate-untrusted", "not_applicable", "self_signed")];
        let cases: [Case<'_>; 7] = [
            (
                "good",
                leaf(&["localhost"], -1, 365, Some(&trusted)),
                &[],
                &[],
            ),
            (
                "expired",
                leaf(&["localhost"], -30, -1, Some(&trusted)),
                &["certificate-expired"],
                &expired_exception,
            ),
            (
                "expiring",
                leaf(&["localhost"], -1, 10, Some(&trusted)),
                &["certificate-expires-soon"],
                &[],
            ),
            (
                "not yet valid",
                leaf(&["localhost"], 10, 400, Some(&trusted)),
                &["certificate-not-yet-valid"],
                &[],
            ),
            (
                "another host",
                leaf(&["other.example"], -1, 365, Some(&trusted)),
                &["certificate-hostname-mismatch"],
                &[],
            ),
            (
                "self-signed",
                leaf(&["localhost"], -1, 365, None),
                &["certificate-self-signed"],
                &self_signed_exception,
            ),
            (
                "untrusted",
                leaf(&["localhost"], -1, 365, Some(&stranger)),
                &["certificate-untrusted"],
                &[],
            ),
        ];
        for (case, (chain, key), expected, exceptions) in cases {
            let port = serve(chain, key).await;
            let (found, statuses) = rules(&plugin, &format!("https://localhost:{port}/")).await;
            assert_eq!(found, expected, "{case}");
            assert_eq!(statuses, expected_statuses(expected, exceptions), "{case}");
        }
    }

    fn weak_der() -> CertificateDer<'static> {
        use rustls::pki_types::pem::PemObject as _;
        CertificateDer::from_pem_slice(include_bytes!("../testdata/tls/weak-rsa1024-sha1.pem"))
            .unwrap()
    }

    #[test]
    fn a_short_rsa_key_and_a_sha1_signature_are_weak() {
        let weak = weak_der();
        let plugin = TlsCertificate::new(vec![]);
        let name = ServerName::try_from("localhost").unwrap();
        let mut rules: Vec<String> = plugin
            .judge("tls://localhost:443", &name, &[weak], UnixTime::now())
            .into_iter()
            .map(|finding| finding.rule_id)
            .collect();
        rules.sort();
        assert_eq!(
            rules,
            [
                "certificate-self-signed",
                "certificate-weak-key",
                "certificate-weak-signature"
            ]
        );
        let findings = plugin.judge("tls://localhost:443", &name, &[weak_der()], UnixTime::now());
        let statuses: BTreeMap<String, (String, String)> =
            evaluations("tls://localhost:443", &findings, false)
                .into_iter()
                .map(|evaluation| {
                    (
                        evaluation.rule_id,
                        (evaluation.status, evaluation.reason_code),
                    )
                })
                .collect();
        assert_eq!(
            statuses,
            expected_statuses(
                &rules.iter().map(String::as_str).collect::<Vec<_>>(),
                &[("certificate-untrusted", "not_applicable", "self_signed")]
            )
        );
    }

    /// Answers every ClientHello of TLS 1.0 with a ServerHello of TLS 1.0 (and nothing else),
    /// as a server still speaking it would; anything else is refused with an alert.
    async fn serve_tls10_only() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut hello = [0_u8; 11];
                    if stream.read_exact(&mut hello).await.is_err() {
                        return;
                    }
                    let answer: &[u8] = if hello[9..11] == [0x03, 0x01] {
                        &[
                            0x16, 0x03, 0x01, 0x00, 0x2a, 0x02, 0x00, 0x00, 0x26, 0x03, 0x01,
                        ]
                    } else {
                        // alert: fatal, protocol_version
                        &[0x15, 0x03, 0x01, 0x00, 0x02, 0x02, 0x46]
                    };
                    let _ = stream.write_all(answer).await;
                    let _ = stream.shutdown().await;
                });
            }
        });
        port
    }

    #[tokio::test]
    async fn a_server_accepting_tls_1_0_is_reported_and_a_modern_one_is_not() {
        let legacy = serve_tls10_only().await;
        let plugin = TlsCertificate::new(vec![]);
        let (found, statuses) = rules(&plugin, &format!("127.0.0.1:{legacy}")).await;
        assert_eq!(found, ["legacy-protocol-tls1.0", "tls-handshake-failed"]);
        let no_certificate: Vec<Exception<'_>> = RULES
            .iter()
            .filter(|rule| rule.id.starts_with("certificate-"))
            .map(|rule| (rule.id, "error", "tls_handshake_failed"))
            .collect();
        assert_eq!(
            statuses,
            expected_statuses(
                &["legacy-protocol-tls1.0", "tls-handshake-failed"],
                &no_certificate
            )
        );
        let trusted = authority("palisade test authority");
        let (chain, key) = leaf(&["localhost"], -1, 365, Some(&trusted));
        let modern = serve(chain, key).await;
        let plugin = TlsCertificate::new(vec![trusted.der.clone()]);
        let (found, statuses) = rules(&plugin, &format!("localhost:{modern}")).await;
        assert!(found.is_empty());
        assert_eq!(statuses, expected_statuses(&[], &[]));
    }

    #[test]
    fn only_https_urls_and_host_ports_name_a_tls_service() {
        let target = |target: &str| services(&TaskInput::for_target("tls_certificate", target));
        assert_eq!(
            target("https://example.test/a"),
            [("example.test".into(), 443)]
        );
        assert_eq!(target("localhost:8443"), [("localhost".into(), 8443)]);
        assert_eq!(target("[::1]:8443"), [("::1".into(), 8443)]);
        for none in [
            "http://127.0.0.1:8080/",
            "http://example.test",
            "synthetic://x",
        ] {
            assert!(target(none).is_empty(), "{none}");
        }
        let mut task = TaskInput::for_target("tls_certificate", "http://example.test");
        task.discovered_assets = vec![
            v1::Asset {
                kind: "http_service".into(),
                value: "https://example.test:8443".into(),
            },
            v1::Asset {
                kind: "http_service".into(),
                value: "http://example.test:80".into(),
            },
        ];
        assert_eq!(services(&task), [("example.test".into(), 8443)]);
    }

    #[tokio::test]
    async fn a_target_without_tls_has_no_rule_that_applies() {
        let plugin = TlsCertificate::new(vec![]);
        let target = "http://127.0.0.1:1/";
        let (result, items) = run(&plugin, target).await;
        assert_eq!(result.unwrap(), "no TLS services to check");
        let statuses = coverage::testing::statuses(&items);
        assert_eq!(statuses.len(), RULES.len());
        for ((_, resource), status) in statuses {
            assert_eq!(resource, target);
            assert_eq!(status, ("not_applicable".into(), "no_tls_service".into()));
        }
    }

    #[tokio::test]
    async fn an_unreachable_service_is_an_error_and_fails_the_task() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        drop(listener);
        let plugin = TlsCertificate::new(vec![]);
        let (result, items) = run(&plugin, &format!("127.0.0.1:{port}")).await;
        let error = result.unwrap_err();
        assert_eq!(
            (error.code.as_str(), error.retryable),
            ("connection_refused", true)
        );
        let on_service = coverage::testing::on(&items, &format!("tls://127.0.0.1:{port}"));
        assert_eq!(on_service.len(), RULES.len());
        assert!(on_service.values().all(|status| *status == "error"));
    }

    #[test]
    fn a_legacy_client_hello_offers_only_its_version() {
        let hello = legacy_client_hello(0x0302);
        assert_eq!(&hello[..3], &[0x16, 0x03, 0x01]);
        assert_eq!(
            usize::from(u16::from_be_bytes([hello[3], hello[4]])),
            hello.len() - 5
        );
        assert_eq!(hello[5], 0x01, "a ClientHello");
        assert_eq!(&hello[9..11], &[0x03, 0x02]);
    }
}
