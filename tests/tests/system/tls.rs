//! TLS to NATS and to PostgreSQL with a certificate authority of the operator's choosing
//! (issue 10, item 2): a process trusts only the configured authority for the server,
//! presents its client certificate to a server that verifies clients, and refuses a server
//! without TLS when TLS is required.

use bus::{Bus, ClientCertificate, NatsCredentials, NatsTls};
use messages::{Identity, Subjects};
use rustls::{AlertDescription, CertificateError, InvalidMessage};
use tests::servers::{NatsServer, PostgresServer};
use tests::tls::TestCertificates;

fn subjects() -> Subjects {
    Subjects::new(&format!(
        "tls{}",
        &uuid::Uuid::new_v4().simple().to_string()[..12]
    ))
    .expect("a prefix")
}

async fn connect(url: &str, tls: &NatsTls) -> Result<Bus, bus::BusError> {
    Bus::connect(
        url,
        &NatsCredentials::none(),
        tls,
        subjects(),
        &Identity::Operator,
    )
    .await
}

/// How the server's certificate is refused when it was signed by another test authority: every
/// test authority has the same name, so the verifier takes the configured one for the issuer
/// and its signature does not match.
const SIGNED_BY_ANOTHER_AUTHORITY: rustls::Error =
    rustls::Error::InvalidCertificate(CertificateError::BadSignature);

/// The TLS failure under a connection error, however the client wrapped it (an `io::Error`
/// does not name the error it holds as its `source`); `None` for a failure of anything else,
/// such as a server that does not run.
fn tls_failure<'e>(error: &'e (dyn std::error::Error + 'static)) -> Option<&'e rustls::Error> {
    /// Causes followed at most (a source cycle would loop forever).
    const CAUSES_MAX: usize = 16;
    let mut causes = std::iter::successors(Some(error), |error| error.source()).take(CAUSES_MAX);
    causes.find_map(|error| {
        error.downcast_ref::<rustls::Error>().or_else(|| {
            error
                .downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        })
    })
}

/// Asserts that the TLS failure under `error` is `expected`, naming the whole error when not.
fn assert_tls_refusal(error: &(dyn std::error::Error + 'static), expected: &rustls::Error) {
    assert_eq!(
        tls_failure(error),
        Some(expected),
        "not the refusal expected: {}",
        telemetry::chain(error)
    );
}

#[tokio::test]
async fn nats_over_tls_trusts_only_its_authority_and_presents_the_client_certificate() {
    let dir = tempfile::tempdir().expect("a directory");
    let certs = TestCertificates::generate(dir.path());
    let server = NatsServer::start_with_config(&format!(
        "tls {{\n  cert_file: {:?}\n  key_file: {:?}\n  ca_file: {:?}\n  verify: true\n}}\n",
        certs.server_cert, certs.server_key, certs.ca
    ))
    .await;
    let url = server.url();
    let client = Some(ClientCertificate {
        cert: certs.client_cert.clone(),
        key: certs.client_key.clone(),
    });

    let trusted = NatsTls {
        ca: Some(certs.ca.clone()),
        client: client.clone(),
        required: true,
    };
    let bus = connect(&url, &trusted)
        .await
        .expect("the authority's server, with the client certificate");
    bus.provision(&Default::default())
        .await
        .expect("JetStream over TLS");
    let subject = bus.subjects().dispatch_ready();
    let mut heard = bus
        .client()
        .subscribe(subject.clone())
        .await
        .expect("a subscription");
    bus.publish_core(subject, "over tls".into())
        .await
        .expect("published");
    let message = tokio::time::timeout(std::time::Duration::from_secs(5), async {
        use futures::StreamExt as _;
        heard.next().await
    })
    .await
    .expect("heard in time")
    .expect("a message");
    assert_eq!(&message.payload[..], b"over tls");

    let without_certificate = NatsTls {
        client: None,
        ..trusted.clone()
    };
    let error = connect(&url, &without_certificate)
        .await
        .expect_err("a server that verifies clients accepted one without a certificate");
    // The server's alert: it requires a certificate.
    assert_tls_refusal(
        &error,
        &rustls::Error::AlertReceived(AlertDescription::CertificateRequired),
    );

    let other_dir = tempfile::tempdir().expect("a directory");
    let other = TestCertificates::generate(other_dir.path());
    let foreign_authority = NatsTls {
        ca: Some(other.ca.clone()),
        ..trusted.clone()
    };
    let error = connect(&url, &foreign_authority)
        .await
        .expect_err("a server signed by another authority is not trusted");
    assert_tls_refusal(&error, &SIGNED_BY_ANOTHER_AUTHORITY);
    assert!(
        error.to_string().contains("NATS_TLS"),
        "the refusal says what to check: {error}"
    );
}

#[tokio::test]
async fn nats_tls_required_refuses_a_server_without_tls() {
    let server = NatsServer::start().await;
    let required = NatsTls {
        required: true,
        ..Default::default()
    };
    // The client starts a handshake the server does not speak: what comes back is no TLS.
    let in_clear = rustls::Error::InvalidMessage(InvalidMessage::InvalidContentType);
    let error = connect(&server.url(), &required)
        .await
        .expect_err("NATS_TLS_REQUIRED connected to a server in clear");
    assert_tls_refusal(&error, &in_clear);
    let tls_url = server.url().replace("nats://", "tls://");
    let error = connect(&tls_url, &NatsTls::default())
        .await
        .expect_err("a tls:// URL connected to a server in clear");
    assert_tls_refusal(&error, &in_clear);
    connect(&server.url(), &NatsTls::default())
        .await
        .expect("without TLS asked for, a server in clear is accepted");
}

#[tokio::test]
async fn postgres_over_tls_verifies_the_server_against_the_configured_authority() {
    let dir = tempfile::tempdir().expect("a directory");
    let certs = TestCertificates::generate(dir.path());
    let server = PostgresServer::start_tls(&certs).await;
    let url = |ca: &std::path::Path| {
        format!(
            "{}?sslmode=verify-full&sslrootcert={}",
            server.url("postgres"),
            ca.display()
        )
    };

    let pool = store::connect(&store::DatabaseSettings::new(url(&certs.ca)))
        .await
        .expect("the authority's server");
    let encrypted: bool =
        sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
            .fetch_one(&pool)
            .await
            .expect("the connection's TLS state");
    assert!(encrypted, "the connection is encrypted");
    pool.close().await;

    let other_dir = tempfile::tempdir().expect("a directory");
    let other = TestCertificates::generate(other_dir.path());
    let mut settings = store::DatabaseSettings::new(url(&other.ca));
    settings.acquire_timeout = std::time::Duration::from_secs(3);
    let error = store::connect(&settings)
        .await
        .expect_err("a server signed by another authority is not trusted");
    assert_tls_refusal(&error, &SIGNED_BY_ANOTHER_AUTHORITY);
}
