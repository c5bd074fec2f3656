//! TLS to NATS and to PostgreSQL with a certificate authority of the operator's choosing
//! (issue 10, item 2): a process trusts only the configured authority for the server,
//! presents its client certificate to a server that verifies clients, and refuses a server
//! without TLS when TLS is required.

use bus::{Bus, ClientCertificate, NatsCredentials, NatsTls};
use messages::{Identity, Subjects};
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
    assert!(
        connect(&url, &without_certificate).await.is_err(),
        "a server that verifies clients accepted one without a certificate"
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
    assert!(
        connect(&server.url(), &required).await.is_err(),
        "NATS_TLS_REQUIRED connected to a server in clear"
    );
    let tls_url = server.url().replace("nats://", "tls://");
    assert!(
        connect(&tls_url, &NatsTls::default()).await.is_err(),
        "a tls:// URL connected to a server in clear"
    );
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
    assert!(
        store::connect(&settings).await.is_err(),
        "a server signed by another authority is not trusted"
    );
}
