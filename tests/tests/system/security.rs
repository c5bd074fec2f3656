//! Identity on the bus (SPEC I12, I14): against a NATS server that authenticates every
//! connection and enforces each credential's permissions.

use bus::{Bus, NatsCredentials};
use messages::{Identity, Service, Subjects};
use tests::servers::NatsServer;

#[tokio::test]
async fn a_service_connects_with_its_credentials_and_an_anonymous_client_is_refused() {
    let authority = identity::Authority::generate();
    let server = NatsServer::start_secured(&authority).await;
    let subjects = Subjects::new("sec").unwrap();
    let credentials = authority.issue(&subjects, &Identity::Service(Service::Admission));
    let bus = Bus::connect(
        &server.url(),
        &NatsCredentials::from_creds(credentials.file.as_str()),
        subjects.clone(),
        &Identity::Service(Service::Admission),
    )
    .await
    .unwrap_or_else(|error| panic!("{error}\n{}", server.log()));
    bus.provision(&Default::default())
        .await
        .unwrap_or_else(|error| panic!("{error}\n{}", server.log()));
    let anonymous = Bus::connect(
        &server.url(),
        &NatsCredentials::none(),
        subjects,
        &Identity::Operator,
    )
    .await;
    assert!(anonymous.is_err());
}
