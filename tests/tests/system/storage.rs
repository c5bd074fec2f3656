//! Streams that fit the server (issue 44, item 4): every stream reserves its bytes when it is
//! created, so a server with a modest JetStream store refused palisade's four default streams
//! (4 × 1 GiB) and the services did not start. Left to its default, the setting is fitted: the
//! streams share what the server can reserve. Set explicitly, it is refused with the numbers and
//! the setting to change.

use bus::{Bus, NatsCredentials, NatsTls, StreamSettings};
use messages::{Identity, Subjects};
use tests::servers::NatsServer;

const MIB: i64 = 1024 * 1024;

async fn operator(server: &NatsServer, prefix: &str) -> Bus {
    Bus::connect(
        &server.url(),
        &NatsCredentials::none(),
        &NatsTls::default(),
        Subjects::new(prefix).unwrap(),
        &Identity::Operator,
    )
    .await
    .expect("connected")
}

async fn max_bytes(bus: &Bus) -> Vec<i64> {
    let s = bus.subjects();
    let mut sizes = Vec::new();
    for stream in [
        s.requests_stream(),
        s.events_stream(),
        s.results_stream(),
        s.uploads_stream(),
    ] {
        let mut handle = bus.jetstream().get_stream(&stream).await.expect("created");
        sizes.push(handle.info().await.unwrap().config.max_bytes);
    }
    sizes
}

#[tokio::test]
async fn streams_share_what_a_small_server_can_reserve_and_a_set_size_names_the_shortfall() {
    // A server whose JetStream may store 1 GiB in all, a quarter of the default reservations.
    let server =
        NatsServer::start_with_config("jetstream {\n  max_file_store: 1073741824\n}\n").await;

    let fitted = operator(&server, "fit").await;
    fitted
        .provision(&StreamSettings::default())
        .await
        .expect("the default fits the server");
    // Five shares of 1 GiB, to the MiB: one for each stream, one left for the artifact bucket.
    assert_eq!(
        max_bytes(&fitted).await,
        [204 * MIB; 4],
        "four equal shares"
    );
    // Every service provisions: doing it again changes nothing.
    fitted
        .provision(&StreamSettings::default())
        .await
        .expect("provisioned again");
    assert_eq!(max_bytes(&fitted).await, [204 * MIB; 4]);

    // A size set explicitly is that or a refusal naming it and the numbers.
    let explicit = operator(&server, "set").await;
    let mut settings = StreamSettings::default();
    settings.quotas.fit_stream_bytes = false;
    let refusal = explicit
        .provision(&settings)
        .await
        .expect_err("no room for 1 GiB")
        .to_string();
    for named in [
        "PALISADE_STREAM_BYTES_MAX",
        "1024 MiB",
        "4096 MiB",
        "max_file_store",
    ] {
        assert!(refusal.contains(named), "{named} is not named: {refusal}");
    }
}
