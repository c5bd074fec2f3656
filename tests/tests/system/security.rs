//! Identity on the bus (SPEC I12, I14): against a NATS server that authenticates every
//! connection and enforces each credential's permissions (every `TestSystem` runs on one).
//! Each test plays an attacker with a real credential of the wrong kind, or none.

use std::time::{Duration, Instant};

use bus::async_nats;
use bus::{Bus, NatsCredentials};
use futures::StreamExt as _;
use messages::{ClientVerb, ErrorCode, EventKind, Identity, Service, WorkerVerb, v1};
use prost::Message as _;
use tests::TestSystem;
use uuid::Uuid;

/// How long a request the server drops for lack of permission is waited for.
const REFUSED_WAIT: Duration = Duration::from_millis(1_500);

/// How soon a revoked user's open connection must be closed after the push returns.
const REVOCATION_BOUND: Duration = Duration::from_secs(2);

/// A request that must not be answered: the server drops what the credential may not send.
async fn unanswered(bus: &Bus, subject: String, payload: Vec<u8>) {
    let answer = tokio::time::timeout(
        REFUSED_WAIT,
        bus.client().request(subject.clone(), payload.into()),
    )
    .await;
    assert!(
        !matches!(answer, Ok(Ok(_))),
        "{subject} was answered for a credential that may not send it"
    );
}

/// Nothing arrives on `subscriber` for a while.
async fn hears_nothing(subscriber: &mut async_nats::Subscriber, what: &str) {
    let heard = tokio::time::timeout(REFUSED_WAIT, subscriber.next()).await;
    assert!(
        !matches!(heard, Ok(Some(_))),
        "{what} was delivered to a credential that may not read it"
    );
}

#[tokio::test]
async fn an_anonymous_connection_is_refused() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let anonymous = Bus::connect(
        &system.settings.common.nats_url,
        &NatsCredentials::none(),
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &Identity::Operator,
    )
    .await;
    assert!(anonymous.is_err(), "an anonymous client connected");
    // A credential signed by another authority is no better.
    let stranger = identity::Authority::generate().issue(&system.subjects, &Identity::Operator);
    let forged = Bus::connect(
        &system.settings.common.nats_url,
        &NatsCredentials::from_creds(stranger.file.as_str()),
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &Identity::Operator,
    )
    .await;
    assert!(forged.is_err(), "a foreign credential connected");
    system.finish().await;
}

#[tokio::test]
async fn worker_b_can_neither_act_as_worker_a_nor_hear_its_replies_and_acks() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let organization = system.organization().await;
    let worker_a = system.manual_worker(organization, 4).await;
    let b_id = system.registered_worker(organization, 4).await;
    let b = system.worker_bus(b_id).await;
    assert!(worker_a.hello(&["alpha"]).await.error.is_none());
    let a = worker_a.id.to_string();

    // B listens where A's replies, acks and PubAcks arrive.
    let mut a_inbox = b
        .client()
        .subscribe(format!(
            "{}.>",
            system.subjects.inbox_prefix(&Identity::Worker {
                worker_id: worker_a.id
            })
        ))
        .await
        .unwrap();
    let mut a_acks = b
        .client()
        .subscribe(system.subjects.worker(&a, WorkerVerb::Ack))
        .await
        .unwrap();
    let mut every_inbox = b.client().subscribe("_INBOX.>").await.unwrap();

    // B asks on A's subjects: the server drops it, dispatch never sees it.
    let acquire = v1::AcquireRequest {
        schema_version: messages::SCHEMA_VERSION,
        request_id: Uuid::new_v4().to_string(),
        worker_id: a.clone(),
        max_tasks: 4,
        wait_ms: 0,
    };
    system
        .submit(&system.request(organization, "http://a.test", &["alpha"]))
        .await;
    unanswered(
        &b,
        system.subjects.worker(&a, WorkerVerb::Acquire),
        acquire.encode_to_vec(),
    )
    .await;
    unanswered(
        &b,
        system.subjects.worker(&a, WorkerVerb::Hello),
        v1::HelloRequest {
            schema_version: messages::SCHEMA_VERSION,
            worker_id: a.clone(),
            ..Default::default()
        }
        .encode_to_vec(),
    )
    .await;
    assert_eq!(
        system.table_counts().await["worker_task_attempts"],
        0,
        "nothing was leased on A's behalf"
    );

    // A works as usual, and nothing of it reaches B.
    let lease = worker_a.acquire_one().await;
    let ack = worker_a
        .send_batch(&worker_a.batch(&lease, 0, &tests::findings_payload(1)))
        .await;
    assert!(ack.error.is_none(), "{ack:?}");
    hears_nothing(&mut a_inbox, "A's replies").await;
    hears_nothing(&mut a_acks, "A's acks").await;
    hears_nothing(&mut every_inbox, "_INBOX.>").await;
    // The server refused each of B's attempts, and said so.
    assert!(
        system.nats.server_log().contains("Violation"),
        "the server logged no violation:\n{}",
        system.nats.server_log()
    );

    // B cannot publish a batch, a completion or a failure for A either: the stream never
    // holds one, so ingestion never decides one.
    let before = tests::stream_subject_counts(
        &system,
        &system.subjects.results_stream(),
        &system.subjects.worker(&a, WorkerVerb::Complete),
    )
    .await;
    let _ = b
        .client()
        .publish(
            system.subjects.worker(&a, WorkerVerb::Complete),
            "forged".into(),
        )
        .await;
    b.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let after = tests::stream_subject_counts(
        &system,
        &system.subjects.results_stream(),
        &system.subjects.worker(&a, WorkerVerb::Complete),
    )
    .await;
    assert_eq!(
        before, after,
        "a forged completion reached the results stream"
    );
    system.finish().await;
}

#[tokio::test]
async fn a_client_of_one_organization_cannot_submit_cancel_or_read_events_for_another() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let x = system.organization().await;
    let y = system.organization().await;
    let _worker = system.manual_worker(y, 4).await;
    let client_identity = Identity::Client {
        client_id: "client-x".into(),
        organizations: vec![x],
    };
    let bus = system.nats.connect(&client_identity).await;
    let client = client::Client::new(bus.clone(), "client-x");

    // Its own organization works.
    let own = client
        .submit(&client.request(&x.to_string(), "http://x.test", &["alpha"], "k1"))
        .await
        .expect("admission answers a client for its own organization");
    assert!(own.error.is_none(), "{own:?}");

    // Another's: the server drops the request; nothing is written.
    let before = system.table_counts().await;
    let theirs = client.request(&y.to_string(), "http://y.test", &["alpha"], "k2");
    unanswered(
        &bus,
        system
            .subjects
            .client(&y, "client-x", ClientVerb::Submit)
            .unwrap(),
        theirs.encode_to_vec(),
    )
    .await;
    let durable = bus
        .publish_durable(
            system
                .subjects
                .client(&y, "client-x", ClientVerb::Request)
                .unwrap(),
            "forged",
            Default::default(),
            theirs.encode_to_vec().into(),
        )
        .await;
    assert!(
        durable.is_err(),
        "the request stream took another organization's request"
    );
    // Nor can it pose as another client of its own organization.
    unanswered(
        &bus,
        system
            .subjects
            .client(&x, "client-other", ClientVerb::Submit)
            .unwrap(),
        client
            .request(&x.to_string(), "http://x2.test", &["alpha"], "k3")
            .encode_to_vec(),
    )
    .await;
    assert_eq!(system.table_counts().await, before);

    // Y's scan cannot be cancelled from X's subject either: it is not found there.
    let y_scan = system
        .submit(&system.request(y, "http://y.test", &["alpha"]))
        .await
        .scan_id;
    let refused = client
        .cancel_scan(&x, &y_scan, "not yours")
        .await
        .expect("dispatch answers");
    assert_eq!(
        refused.error.unwrap().error_code(),
        Some(ErrorCode::NotFound)
    );
    unanswered(
        &bus,
        system
            .subjects
            .client(&y, "client-x", ClientVerb::Cancel)
            .unwrap(),
        v1::CancelRequest {
            schema_version: messages::SCHEMA_VERSION,
            scan_id: y_scan.clone(),
            ..Default::default()
        }
        .encode_to_vec(),
    )
    .await;
    assert_eq!(system.scan_state(&y_scan).await, "pending");

    // Events: its own organization's, yes; Y's, no (neither a consumer nor a subscription).
    let mut own_events = client.outcomes(&x).await.expect("its own events");
    assert!(
        client.outcomes(&y).await.is_err(),
        "a consumer of Y's events was created"
    );
    let mut y_events = bus
        .client()
        .subscribe(system.subjects.tenant_events(&y))
        .await
        .unwrap();
    let cancelled = system
        .client()
        .cancel_scan(&y, &y_scan, "by Y")
        .await
        .unwrap();
    assert!(cancelled.error.is_none());
    hears_nothing(&mut y_events, "Y's events").await;
    let x_scan = client
        .submit(&client.request(&x.to_string(), "http://x3.test", &["alpha"], "k4"))
        .await
        .unwrap()
        .scan_id;
    system
        .client()
        .cancel_scan(&x, &x_scan, "by X")
        .await
        .unwrap();
    let outcome = tokio::time::timeout(tests::WAIT_MAX, own_events.next())
        .await
        .expect("X's outcome arrives")
        .expect("a stream");
    assert!(
        matches!(&outcome, client::Outcome::Cancelled(event) if event.scan_id == x_scan),
        "{outcome:?}"
    );
    system.finish().await;
}

#[tokio::test]
async fn a_wrong_identity_cannot_read_results_or_events_publish_events_or_touch_streams() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let organization = system.organization().await;
    let worker_id = system.registered_worker(organization, 4).await;
    let worker = system.worker_bus(worker_id).await;
    let client = system
        .nats
        .connect(&Identity::Client {
            client_id: "nosy".into(),
            organizations: vec![organization],
        })
        .await;
    for (who, bus) in [("a worker", &worker), ("a client", &client)] {
        let jetstream = bus.jetstream();
        // Results (lease tokens) and every event: no consumer.
        for stream in [
            system.subjects.results_stream(),
            system.subjects.requests_stream(),
        ] {
            let consumer = tokio::time::timeout(
                REFUSED_WAIT,
                jetstream.create_consumer_on_stream(
                    async_nats::jetstream::consumer::pull::Config {
                        name: Some("nosy".into()),
                        ..Default::default()
                    },
                    stream.clone(),
                ),
            )
            .await;
            assert!(
                !matches!(consumer, Ok(Ok(_))),
                "{who} created a consumer on {stream}"
            );
        }
        let all_events = tokio::time::timeout(
            REFUSED_WAIT,
            jetstream.create_consumer_on_stream(
                async_nats::jetstream::consumer::pull::Config {
                    name: Some("nosy".into()),
                    filter_subject: format!("{}.v1.>", system.subjects.prefix()),
                    ..Default::default()
                },
                system.subjects.events_stream(),
            ),
        )
        .await;
        assert!(
            !matches!(all_events, Ok(Ok(_))),
            "{who} created a consumer on every event"
        );
        // Streams: neither deleted nor created.
        let deleted = tokio::time::timeout(
            REFUSED_WAIT,
            jetstream.delete_stream(system.subjects.results_stream()),
        )
        .await;
        assert!(!matches!(deleted, Ok(Ok(_))), "{who} deleted a stream");
        let created = tokio::time::timeout(
            REFUSED_WAIT,
            jetstream.create_stream(async_nats::jetstream::stream::Config {
                name: "NOSY".into(),
                subjects: vec!["nosy.>".into()],
                ..Default::default()
            }),
        )
        .await;
        assert!(!matches!(created, Ok(Ok(_))), "{who} created a stream");
        let consumer_deleted = tokio::time::timeout(
            REFUSED_WAIT,
            jetstream.delete_consumer_from_stream(
                ingestion::CONSUMER_NAME,
                system.subjects.results_stream(),
            ),
        )
        .await;
        assert!(
            !matches!(consumer_deleted, Ok(Ok(_))),
            "{who} deleted ingestion's consumer"
        );
        // A forged scan.completed never reaches the events stream.
        let forged = bus
            .publish_durable(
                system
                    .subjects
                    .tenant_event(&organization, EventKind::ScanCompleted),
                &Uuid::new_v4().to_string(),
                Default::default(),
                "forged".into(),
            )
            .await;
        assert!(forged.is_err(), "{who} published an event");
    }
    assert_eq!(
        tests::event_counts(&system).await.get("scan.completed"),
        None
    );
    system.finish().await;
}

#[tokio::test]
async fn a_revoked_worker_is_disconnected_within_the_bound_and_cannot_come_back() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let organization = system.organization().await;
    let authority = system.nats.authority.clone().expect("secured");
    let worker_id = system.registered_worker(organization, 4).await;
    let identity = Identity::Worker { worker_id };
    let holder = store::bus_identities::Holder::Worker(worker_id);
    // Issued as `palisade worker add` does: its account pushed, the public key recorded, the
    // seed only in the file.
    system.nats.ensure_account(&identity).await;
    let credentials = authority.issue(&system.subjects, &identity);
    store::bus_identities::record_credential(&system.pool, &holder, &credentials.public_key)
        .await
        .expect("credential recorded");
    let creds = NatsCredentials::from_creds(credentials.file.as_str());
    let no_tls = bus::NatsTls::default();
    let connect = || {
        Bus::connect(
            &system.settings.common.nats_url,
            &creds,
            &no_tls,
            system.subjects.clone(),
            &identity,
        )
    };
    let bus = connect().await.expect("the worker connects");
    let worker = tests::ManualWorker::connect(bus.clone(), worker_id).await;
    assert!(worker.hello(&["alpha"]).await.error.is_none());
    system
        .submit(&system.request(organization, "http://revoked.test", &["alpha"]))
        .await;
    let lease = worker.acquire_one().await;

    // Revoked in PostgreSQL (no new lease, writes refused) and on the bus, with the account
    // `palisade worker revoke` pushes: every refused credential of the worker PostgreSQL knows.
    store::revoke::revoke_worker(
        &system.pool,
        &system.subjects,
        worker_id,
        &store::audit::Change::new("test", "stolen credential"),
        store::revoke::ActiveLeases::Cancel,
    )
    .await
    .expect("revoked");
    let recorded = store::bus_identities::bus_accounts(&system.pool, Some(&holder))
        .await
        .expect("its account as recorded");
    assert_eq!(recorded.len(), 1);
    assert_eq!(recorded[0].refused, [credentials.public_key.as_str()]);
    let pushed = Instant::now();
    system.nats.push_recorded(&system.pool, &holder).await;
    let push_took = pushed.elapsed();
    let closed = Instant::now();
    while bus.client().connection_state() == async_nats::connection::State::Connected {
        assert!(
            closed.elapsed() < REVOCATION_BOUND,
            "the revoked worker's connection is still served {REVOCATION_BOUND:?} after the push"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    println!(
        "revocation: push answered in {push_took:?}, connection closed {:?} after",
        closed.elapsed()
    );
    assert!(connect().await.is_err(), "a revoked worker connected again");
    // What it still tries to send lands nowhere.
    let before = system.table_counts().await;
    let _ = bus
        .client()
        .publish(
            system
                .subjects
                .worker(&worker_id.to_string(), WorkerVerb::Complete),
            worker.completion(&lease, 0).encode_to_vec().into(),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(system.table_counts().await, before);
    system.finish().await;
}

#[tokio::test]
async fn a_replaced_credential_is_refused_and_the_new_one_works() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let authority = system.nats.authority.clone().expect("secured");
    let organization = system.organization().await;
    let worker_id = system.registered_worker(organization, 4).await;
    let identity = Identity::Worker { worker_id };
    let holder = store::bus_identities::Holder::Worker(worker_id);
    system.nats.ensure_account(&identity).await;
    let old = authority.issue(&system.subjects, &identity);
    store::bus_identities::record_credential(&system.pool, &holder, &old.public_key)
        .await
        .unwrap();
    let new = authority.issue(&system.subjects, &identity);
    store::bus_identities::record_credential(&system.pool, &holder, &new.public_key)
        .await
        .unwrap();
    system.nats.push_recorded(&system.pool, &holder).await;
    let connect = async |credentials: &identity::Credentials| {
        Bus::connect(
            &system.settings.common.nats_url,
            &NatsCredentials::from_creds(credentials.file.as_str()),
            &bus::NatsTls::default(),
            system.subjects.clone(),
            &identity,
        )
        .await
    };
    assert!(
        connect(&old).await.is_err(),
        "the replaced credential connected"
    );
    assert!(
        connect(&new).await.is_ok(),
        "the new credential was refused"
    );
    // Pushing again lets nothing old back in that PostgreSQL still refuses: the list is
    // rebuilt from PostgreSQL, not edited.
    system.nats.push_recorded(&system.pool, &holder).await;
    assert!(connect(&old).await.is_err());
    system.finish().await;
}

#[tokio::test]
async fn every_service_runs_with_only_its_own_permissions() {
    // The whole path (admission, dispatch, ingestion, reaper, enrichment) on their own
    // credentials: a scan completes, and the server logged no permission violation.
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    system.start(tests::Component::Reaper);
    system.start(tests::Component::Enrichment);
    let organization = system.organization().await;
    let _stats = system.reference_worker(organization, 4).await;
    let reply = system
        .submit(&system.request(organization, "synthetic://ok", &["synthetic"]))
        .await;
    assert!(reply.error.is_none(), "{reply:?}");
    system.wait_scan_state(&reply.scan_id, "completed").await;
    system.wait_outbox_drained().await;
    let log = system.nats.server_log();
    assert!(
        !log.contains("Violation"),
        "a service needed more than its permissions:\n{}",
        log.lines()
            .filter(|line| line.contains("Violation"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let _ = Service::ALL;
    system.finish().await;
}
