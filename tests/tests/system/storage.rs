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
    // The quotas of waiting messages follow the shares: one identity holds at most an eighth
    // of its stream (and at least the fitted minimum).
    let quota = |stream: String| {
        let bus = fitted.clone();
        async move {
            let mut handle = bus.jetstream().get_stream(&stream).await.unwrap();
            handle.info().await.unwrap().config.max_messages_per_subject
        }
    };
    let s = fitted.subjects();
    assert_eq!(
        quota(s.requests_stream()).await,
        204 * MIB / 8 / i64::from(bus::REQUEST_MESSAGE_BYTES_MAX)
    );
    assert_eq!(
        quota(s.results_stream()).await,
        8,
        "204 MiB / 8 holds 8 of each of a worker's 3 verbs' largest messages"
    );

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

/// Lowering a quota of waiting messages on a stream where a subject holds more would make
/// JetStream drop that subject's oldest messages (confirmed ones): provisioning keeps the old
/// quota until nothing waits over the new one, and lowers it at a later start.
#[tokio::test]
async fn a_lowered_quota_waits_until_no_identity_holds_more_and_nothing_is_dropped() {
    use bus::WaitingQuota;
    let server = NatsServer::start().await;
    let bus = operator(&server, "lower").await;
    let with_quota = |quota| {
        let mut settings = StreamSettings::default();
        settings.quotas.requests_waiting_per_client = WaitingQuota::Set(quota);
        settings
    };
    let s = bus.subjects().clone();
    let client = Identity::Client {
        client_id: "waiting".into(),
        organizations: vec![uuid::Uuid::now_v7()],
    };
    let Identity::Client { organizations, .. } = &client else {
        unreachable!()
    };
    let subject = s
        .client(&organizations[0], "waiting", messages::ClientVerb::Request)
        .unwrap();
    let requests = || async {
        let mut handle = bus
            .jetstream()
            .get_stream(s.requests_stream())
            .await
            .unwrap();
        let info = handle.info().await.unwrap().clone();
        (info.state.messages, info.config.max_messages_per_subject)
    };

    bus.provision(&with_quota(10)).await.expect("provisioned");
    for n in 0..6 {
        bus.publish_durable(
            subject.clone(),
            &format!("w-{n}"),
            Default::default(),
            "r".into(),
        )
        .await
        .expect("within the quota");
    }
    bus.provision(&with_quota(3))
        .await
        .expect("provisioned again");
    assert_eq!(requests().await, (6, 10), "nothing dropped, the quota kept");

    // Once what waits is decided (here: purged), the next start lowers it.
    bus.jetstream()
        .get_stream(s.requests_stream())
        .await
        .unwrap()
        .purge()
        .await
        .unwrap();
    bus.provision(&with_quota(3))
        .await
        .expect("provisioned again");
    assert_eq!(
        requests().await,
        (0, 3),
        "lowered once nothing waits over it"
    );

    // What the keeping prevents: JetStream itself drops the oldest when the limit is lowered
    // under them.
    for n in 0..3 {
        bus.publish_durable(
            subject.clone(),
            &format!("x-{n}"),
            Default::default(),
            "r".into(),
        )
        .await
        .expect("within the quota");
    }
    let mut handle = bus
        .jetstream()
        .get_stream(s.requests_stream())
        .await
        .unwrap();
    let mut config = handle.info().await.unwrap().config.clone();
    config.max_messages_per_subject = 1;
    bus.jetstream().update_stream(&config).await.unwrap();
    assert_eq!(requests().await.0, 1, "the server dropped two");
}
