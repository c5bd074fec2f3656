//! The adversarial suite (issue 23): a hostile worker, a hostile client of another tenant and
//! an anonymous process attack palisade set up as production runs it (operator mode, each
//! identity in its own account with its own credentials), through every door they have: the
//! reply subject of every verb and every JetStream publish, injection into another tenant's
//! subjects, delivery onto another identity's subjects, the JetStream API itself, filling the
//! streams past their quotas, a revoked client's queued request, secret files left readable,
//! and what held before (sniffing, impersonation, forged and replayed credentials, oversize).
//!
//! Each probe asserts what the victim keeps: streams and consumers intact, a confirmed request
//! admitted, no event or ack it did not earn. Run on the minimum supported nats-server and on a
//! current one (`NATS_SERVER_BIN`; `.ci/run` runs this binary on both).

use std::collections::BTreeMap;
use std::time::Duration;

use async_nats::jetstream::stream::DiscardPolicy;
use bus::async_nats;
use bus::{Bus, NatsCredentials};
use futures::StreamExt as _;
use messages::{ClientVerb, ErrorCode, EventKind, Identity, WorkerVerb, v1};
use prost::Message as _;
use tests::{Component, TestSystem};
use uuid::Uuid;

/// How long an attack is given to do its harm before the victim is checked.
const SETTLE: Duration = Duration::from_millis(1_500);

/// palisade's streams, the artifact bucket's included.
fn streams(system: &TestSystem) -> [String; 5] {
    let s = &system.subjects;
    [
        s.requests_stream(),
        s.events_stream(),
        s.results_stream(),
        s.uploads_stream(),
        s.artifacts_stream(),
    ]
}

/// What `stream` is and holds now.
async fn stream_info(system: &TestSystem, stream: &str) -> async_nats::jetstream::stream::Info {
    let mut handle = system
        .bus
        .jetstream()
        .get_stream(stream)
        .await
        .unwrap_or_else(|error| panic!("stream {stream} is gone: {error}"));
    handle.info().await.expect("stream info").clone()
}

/// How many messages `stream` holds (on the requests and results streams: not yet decided).
async fn stream_messages(system: &TestSystem, stream: &str) -> u64 {
    stream_info(system, stream).await.state.messages
}

/// How many messages were ever stored in `stream`: decided ones leave the requests and
/// results streams, a purge keeps the count.
async fn stream_stored(system: &TestSystem, stream: &str) -> u64 {
    stream_info(system, stream).await.state.last_sequence
}

/// Every JetStream API verb that destroys or retargets something of palisade's, as a reply
/// subject an attacker names.
fn destructive_api_subjects(system: &TestSystem) -> Vec<String> {
    let s = &system.subjects;
    let mut subjects = Vec::new();
    for stream in streams(system) {
        subjects.push(format!("$JS.API.STREAM.PURGE.{stream}"));
        subjects.push(format!("$JS.API.STREAM.DELETE.{stream}"));
    }
    subjects.push(format!(
        "$JS.API.CONSUMER.DELETE.{}.admission",
        s.requests_stream()
    ));
    subjects.push(format!(
        "$JS.API.CONSUMER.DELETE.{}.ingestion",
        s.results_stream()
    ));
    subjects
}

/// What the attacks must leave as it was: each stream's message count (never fewer) and the
/// services' durable consumers.
#[derive(Debug, PartialEq, Eq)]
struct Victim {
    messages: BTreeMap<String, u64>,
    consumers: Vec<String>,
}

async fn victim(system: &TestSystem) -> Victim {
    let s = &system.subjects;
    let mut messages = BTreeMap::new();
    for stream in streams(system) {
        let count = stream_messages(system, &stream).await;
        messages.insert(stream, count);
    }
    let mut consumers = Vec::new();
    for (stream, consumer) in [
        (s.requests_stream(), "admission"),
        (s.results_stream(), "ingestion"),
    ] {
        let handle = system
            .bus
            .jetstream()
            .get_stream(&stream)
            .await
            .expect("stream");
        if handle
            .get_consumer::<async_nats::jetstream::consumer::pull::Config>(consumer)
            .await
            .is_ok()
        {
            consumers.push(format!("{stream}/{consumer}"));
        }
    }
    Victim {
        messages,
        consumers,
    }
}

/// Nothing was purged or deleted: every stream holds at least what it held, every consumer
/// is still there.
fn intact(before: &Victim, after: &Victim) {
    assert_eq!(
        before.consumers, after.consumers,
        "a durable consumer was deleted"
    );
    for (stream, count) in &before.messages {
        assert!(
            after.messages[stream] >= *count,
            "{stream} lost messages: {count} before, {} after",
            after.messages[stream]
        );
    }
}

/// A registered client of `organizations`, connected with its own credentials.
async fn client_bus(system: &TestSystem, client_id: &str, organizations: Vec<Uuid>) -> Bus {
    system
        .nats
        .connect(&Identity::Client {
            client_id: client_id.to_owned(),
            organizations,
        })
        .await
}

/// A release the worker already made, encoded: sent again, it is answered with an empty
/// `ReleaseReply`, zero bytes, which the JetStream API takes as a valid purge or delete.
async fn released_again(
    system: &TestSystem,
    organization: Uuid,
    worker: &tests::ManualWorker,
) -> Vec<u8> {
    assert!(worker.hello(&["alpha"]).await.error.is_none());
    system
        .submit(&system.request(organization, "http://released.test", &["alpha"]))
        .await;
    let lease = worker.acquire_one().await;
    assert!(worker.release(&lease).await.error.is_none());
    let again = v1::ReleaseRequest {
        schema_version: messages::SCHEMA_VERSION,
        worker_id: worker.id.to_string(),
        lease: lease.lease.clone(),
        reason: "again".into(),
    };
    let answer = system
        .bus
        .client()
        .request(
            system
                .subjects
                .worker(&worker.id.to_string(), WorkerVerb::Release),
            again.encode_to_vec().into(),
        )
        .await
        .expect("answered");
    assert!(answer.payload.is_empty(), "{:?}", answer.payload);
    again.encode_to_vec()
}

/// Waits until `organization` has one scan: its request was admitted.
async fn wait_admitted(system: &TestSystem, organization: Uuid, what: &str) {
    system
        .wait_for(what, || async {
            let scans: i64 =
                sqlx::query_scalar("SELECT count(*) FROM scans WHERE organization_id = $1")
                    .bind(organization)
                    .fetch_one(&system.pool)
                    .await
                    .unwrap();
            (scans == 1).then_some(())
        })
        .await;
}

/// Sends `payload` on `subject` asking for the answer at `reply`, a subject the sender does
/// not own. Refusals by the server (permissions) are expected and ignored.
async fn aim(bus: &Bus, subject: String, reply: &str, payload: Vec<u8>) {
    let _ = bus
        .client()
        .publish_with_reply(subject, reply.to_owned(), payload.into())
        .await;
}

#[tokio::test]
async fn a_reply_aimed_at_the_jetstream_api_through_any_verb_or_publish_destroys_nothing() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    system.start(Component::Enrichment);
    let a = system.organization().await;
    let b = system.organization().await;
    // B's request, confirmed by its PubAck while admission is down: it must be admitted later.
    system.stop(Component::Admission).await;
    let b_client = client::Client::new(client_bus(&system, "b-client", vec![b]).await, "b-client");
    let b_request = b_client.request(&b.to_string(), "http://b.test", &["alpha"], "b-1");
    b_client
        .publish(&b_request)
        .await
        .expect("B's request is confirmed");

    let manual = system.manual_worker(a, 4).await;
    let worker_id = manual.id;
    let worker = system.worker_bus(worker_id).await;
    let hostile = client_bus(&system, "a-client", vec![a]).await;
    let w = worker_id.to_string();
    system.start(Component::Admission);
    let empty_answer = released_again(&system, a, &manual).await;
    system.stop(Component::Admission).await;
    let before = victim(&system).await;

    for target in destructive_api_subjects(&system) {
        // A request answered with nothing at all.
        aim(
            &worker,
            system.subjects.worker(&w, WorkerVerb::Release),
            &target,
            empty_answer.clone(),
        )
        .await;
        // Every worker verb, requests and JetStream publishes alike.
        for verb in WorkerVerb::SENT {
            aim(
                &worker,
                system.subjects.worker(&w, verb),
                &target,
                b"garbage".to_vec(),
            )
            .await;
        }
        aim(
            &worker,
            system.subjects.upload(&w, &Uuid::new_v4().to_string()),
            &target,
            b"chunk".to_vec(),
        )
        .await;
        // Every client verb.
        for verb in ClientVerb::ALL {
            aim(
                &hostile,
                system.subjects.client(&a, "a-client", verb).unwrap(),
                &target,
                b"garbage".to_vec(),
            )
            .await;
        }
        // A pull request on any consumer (clients and workers hold no JetStream right at all).
        for bus in [&worker, &hostile] {
            aim(
                bus,
                format!(
                    "$JS.API.CONSUMER.MSG.NEXT.{}.admission",
                    system.subjects.requests_stream()
                ),
                &target,
                br#"{"batch":1,"no_wait":true}"#.to_vec(),
            )
            .await;
        }
    }
    let _ = worker.client().flush().await;
    let _ = hostile.client().flush().await;
    tokio::time::sleep(SETTLE).await;
    intact(&before, &victim(&system).await);

    // B's confirmed request is admitted once admission is back.
    system.start(Component::Admission);
    let admitted = system
        .wait_for("B's request admitted", || async {
            let scans: i64 =
                sqlx::query_scalar("SELECT count(*) FROM scans WHERE organization_id = $1")
                    .bind(b)
                    .fetch_one(&system.pool)
                    .await
                    .unwrap();
            (scans == 1).then_some(scans)
        })
        .await;
    assert_eq!(admitted, 1);
    system.finish().await;
}

#[tokio::test]
async fn answers_aimed_at_another_tenant_or_another_worker_reach_nothing() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    system.start(Component::Enrichment);
    let a = system.organization().await;
    let b = system.organization().await;
    let worker_id = system.registered_worker(a, 4).await;
    let worker = system.worker_bus(worker_id).await;
    let victim_id = system.registered_worker(b, 4).await;
    let victim_bus = system.worker_bus(victim_id).await;
    let v = victim_id.to_string();
    let hostile = client_bus(&system, "a-client", vec![a]).await;
    // The victim worker listens where its acks arrive, in its own account.
    let mut victim_acks = victim_bus
        .client()
        .subscribe(system.subjects.worker(&v, WorkerVerb::Ack))
        .await
        .unwrap();
    let before_events = tests::event_counts(&system).await;
    let before_requests = stream_stored(&system, &system.subjects.requests_stream()).await;

    let targets = [
        system.subjects.tenant_event(&b, EventKind::ScanCompleted),
        system.subjects.tenant_event(&b, EventKind::ScanRejected),
        system.subjects.event(EventKind::TaskCompleted),
        system
            .subjects
            .client(&b, "b-client", ClientVerb::Request)
            .unwrap(),
        system.subjects.worker(&v, WorkerVerb::Ack),
        system.subjects.dispatch_ready(),
    ];
    let cancel = v1::CancelRequest {
        schema_version: messages::SCHEMA_VERSION,
        scan_id: Uuid::new_v4().to_string(),
        ..Default::default()
    };
    let hello = v1::HelloRequest {
        schema_version: messages::SCHEMA_VERSION,
        worker_id: worker_id.to_string(),
        capabilities: vec!["alpha".into()],
        ..Default::default()
    };
    for target in &targets {
        // Answered requests (each answer is a real, decodable message), and a PubAck.
        for (verb, payload) in [
            (ClientVerb::Cancel, cancel.encode_to_vec()),
            (ClientVerb::Submit, b"not a request".to_vec()),
            (ClientVerb::Request, b"not a request".to_vec()),
        ] {
            aim(
                &hostile,
                system.subjects.client(&a, "a-client", verb).unwrap(),
                target,
                payload,
            )
            .await;
        }
        aim(
            &worker,
            system
                .subjects
                .worker(&worker_id.to_string(), WorkerVerb::Hello),
            target,
            hello.encode_to_vec(),
        )
        .await;
    }
    let _ = hostile.client().flush().await;
    let _ = worker.client().flush().await;
    tokio::time::sleep(SETTLE).await;

    let after_events = tests::event_counts(&system).await;
    for kind in [
        "scan.completed",
        "scan.cancelled",
        "scan.failed",
        "task.completed",
    ] {
        assert_eq!(
            after_events.get(kind),
            before_events.get(kind),
            "a {kind} event was injected"
        );
    }
    let b_events = tests::stream_subject_counts(
        &system,
        &system.subjects.events_stream(),
        &system.subjects.tenant_events(&b),
    )
    .await;
    assert!(
        b_events.is_empty(),
        "B, which sent nothing, received events: {b_events:?}"
    );
    // Only A's own garbage requests were stored; none on B's subject.
    let b_requests = tests::stream_subject_counts(
        &system,
        &system.subjects.requests_stream(),
        &system.subjects.client_wildcard(ClientVerb::Request),
    )
    .await;
    assert!(
        b_requests
            .keys()
            .all(|subject| !subject.contains(&b.to_string())),
        "something was stored on B's request subject: {b_requests:?}"
    );
    let after_requests = stream_stored(&system, &system.subjects.requests_stream()).await;
    assert_eq!(
        after_requests,
        before_requests + targets.len() as u64,
        "only A's own requests are stored"
    );
    let heard = tokio::time::timeout(SETTLE, victim_acks.next()).await;
    assert!(
        !matches!(heard, Ok(Some(_))),
        "the victim worker heard an ack it did not earn: {heard:?}"
    );
    system.finish().await;
}

#[tokio::test]
async fn no_worker_or_client_holds_any_jetstream_right() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let organization = system.organization().await;
    let worker_id = system.registered_worker(organization, 4).await;
    let worker = system.worker_bus(worker_id).await;
    let client = client_bus(&system, "nosy", vec![organization]).await;
    let events = system.subjects.events_stream();
    let probes = [
        "$JS.API.INFO".to_owned(),
        format!("$JS.API.STREAM.INFO.{events}"),
        "$JS.API.STREAM.NAMES".to_string(),
        format!(
            "$JS.API.CONSUMER.CREATE.{events}.mine.{}",
            system.subjects.tenant_events(&organization)
        ),
        format!("$JS.API.CONSUMER.MSG.NEXT.{events}.mine"),
        format!("$JS.API.DIRECT.GET.{events}"),
        format!("$O.{}.>", system.subjects.artifacts_bucket()),
    ];
    for (who, bus) in [("a worker", &worker), ("a client", &client)] {
        for subject in &probes {
            let answer = tokio::time::timeout(
                SETTLE,
                bus.client()
                    .request(subject.replace(".>", ".x"), "{}".into()),
            )
            .await;
            if let Ok(Ok(answer)) = answer {
                // An account without JetStream may be told so; nothing more.
                let text = String::from_utf8_lossy(&answer.payload);
                assert!(
                    text.contains("error"),
                    "{who} was answered on {subject}: {text}"
                );
            }
        }
    }
    // And the events stream still has no consumer but the services'.
    let mut stream = system.bus.jetstream().get_stream(&events).await.unwrap();
    assert_eq!(stream.info().await.unwrap().state.consumer_count, 0);
    system.finish().await;
}

#[tokio::test]
async fn a_service_never_answers_a_reply_subject_outside_the_requesters_inbox() {
    // Inside palisade's own account (an open server, or anyone there), the services' own check
    // is what stops a request from borrowing their rights.
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let worker = system.manual_worker(organization, 4).await;
    let worker_id = worker.id;
    let release = released_again(&system, organization, &worker).await;
    let before = victim(&system).await;
    for target in destructive_api_subjects(&system) {
        aim(
            &system.bus,
            system
                .subjects
                .worker(&worker_id.to_string(), WorkerVerb::Release),
            &target,
            release.clone(),
        )
        .await;
        aim(
            &system.bus,
            system
                .subjects
                .client(&organization, tests::TEST_CLIENT_ID, ClientVerb::Submit)
                .unwrap(),
            &target,
            b"garbage".to_vec(),
        )
        .await;
        // An upload subject, which ingestion answers (with a refusal here).
        aim(
            &system.bus,
            system
                .subjects
                .upload(&worker_id.to_string(), &Uuid::new_v4().to_string()),
            &target,
            b"chunk".to_vec(),
        )
        .await;
    }
    let _ = system.bus.client().flush().await;
    tokio::time::sleep(SETTLE).await;
    intact(&before, &victim(&system).await);
    system.finish().await;
}

#[tokio::test]
async fn sniffing_impersonation_forged_and_replayed_credentials_fail() {
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let organization = system.organization().await;
    let worker_id = system.registered_worker(organization, 4).await;
    let worker = system.worker_bus(worker_id).await;
    let other = system.manual_worker(organization, 4).await;

    // Sniffing: a subscription to everything, or to another's inbox, hears nothing.
    for subject in [">", "_INBOX.>", "$SYS.>", "$JS.>"] {
        let mut heard = match worker.client().subscribe(subject.to_owned()).await {
            Ok(subscriber) => subscriber,
            Err(_) => continue,
        };
        system
            .submit(&system.request(organization, "http://sniff.test", &["alpha"]))
            .await;
        assert!(other.hello(&["alpha"]).await.error.is_none());
        let got = tokio::time::timeout(SETTLE, heard.next()).await;
        assert!(!matches!(got, Ok(Some(_))), "{subject} heard {got:?}");
    }
    // Impersonation: another worker's hello is not answered.
    let answer = tokio::time::timeout(
        SETTLE,
        worker.client().request(
            system
                .subjects
                .worker(&other.id.to_string(), WorkerVerb::Hello),
            "x".into(),
        ),
    )
    .await;
    assert!(!matches!(answer, Ok(Ok(_))), "impersonation answered");

    // A forged credential: signed by another authority.
    let identity = Identity::Worker { worker_id };
    let stranger = identity::Authority::generate().issue(&system.subjects, &identity);
    let forged = Bus::connect(
        &system.settings.common.nats_url,
        &NatsCredentials::from_creds(stranger.file.as_str()),
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &identity,
    )
    .await;
    assert!(forged.is_err(), "a forged credential connected");
    // A replayed JWT: the worker's JWT with another key's seed.
    let authority = system.nats.authority.clone().expect("secured");
    let genuine = authority.issue(&system.subjects, &identity);
    let thief = authority.issue(&system.subjects, &identity);
    let jwt_of = |file: &str| file.lines().nth(1).unwrap().to_owned();
    let seed_of = |file: &str| {
        file.lines()
            .find(|line| line.starts_with("SU"))
            .unwrap()
            .to_owned()
    };
    let replayed = identity::creds_file(&jwt_of(&genuine.file), &seed_of(&thief.file));
    let replay = Bus::connect(
        &system.settings.common.nats_url,
        &NatsCredentials::from_creds(replayed.as_str()),
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &identity,
    )
    .await;
    assert!(replay.is_err(), "a JWT without its own seed connected");
    // A user JWT signed by the account of another worker is not accepted as this worker.
    // (Each account imports only its own subjects: tested by the reply probes above.)

    // Oversize: a publish past the server's max payload is refused, not stored.
    let huge = vec![0_u8; 2 * 1024 * 1024];
    let refused = worker
        .publish_durable(
            system
                .subjects
                .worker(&worker_id.to_string(), WorkerVerb::Result),
            "huge",
            Default::default(),
            huge.into(),
        )
        .await;
    assert!(refused.is_err(), "an oversize batch was stored");
    system.finish().await;
}

#[tokio::test]
async fn a_credential_signed_in_palisades_account_before_the_accounts_is_refused_after_a_push() {
    // Before each identity had an account of its own, `client add` signed clients in
    // palisade's account (with JetStream consumer rights there). `palisade nats push` refuses
    // every such key; the identity's new credential works.
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let organization = system.organization().await;
    let authority = system.nats.authority.clone().expect("secured");
    let identity = Identity::Client {
        client_id: "old-client".into(),
        organizations: vec![organization],
    };
    store::bus_identities::register_client(
        &system.pool,
        "old-client",
        "old",
        &[organization],
        &store::audit::Change::new("test", ""),
    )
    .await
    .expect("registered");
    let legacy = authority.issue_with(&identity.token(), &system.subjects.permissions(&identity));
    sqlx::query("INSERT INTO nats_users (public_key, client_id) VALUES ($1, $2)")
        .bind(&legacy.public_key)
        .bind("old-client")
        .execute(&system.pool)
        .await
        .expect("recorded as an old build recorded it");
    let connect = async |file: &str| {
        Bus::connect(
            &system.settings.common.nats_url,
            &NatsCredentials::from_creds(file),
            &bus::NatsTls::default(),
            system.subjects.clone(),
            &identity,
        )
        .await
    };
    assert!(
        connect(&legacy.file).await.is_ok(),
        "the legacy credential works until the push"
    );
    let current = authority.issue(&system.subjects, &identity);
    store::bus_identities::record_credential(
        &system.pool,
        &store::bus_identities::Holder::Client("old-client".into()),
        &current.public_key,
    )
    .await
    .expect("recorded");
    palisade::accounts::push(
        &authority,
        &system.subjects,
        &system.settings.common.nats_url,
        &bus::NatsTls::default(),
        &system.pool,
        None,
    )
    .await
    .expect("pushed");
    assert!(
        connect(&legacy.file).await.is_err(),
        "a credential signed in palisade's account connected after the push"
    );
    assert!(
        connect(&current.file).await.is_ok(),
        "the client's own-account credential was refused"
    );
    system.finish().await;
}

/// Filling the streams: every client's waiting requests and every worker's waiting results
/// are bounded by a quota JetStream enforces at publish. The identity over its quota is told
/// so (`BusError::Quota`), nothing stored is dropped, another tenant's confirmed request is
/// admitted, and decided messages leave the stream, so the quota counts only what waits.
#[tokio::test]
async fn filling_the_streams_is_refused_at_each_identitys_quota_and_loses_nothing() {
    const QUOTA: i64 = 3;
    let system = TestSystem::spawn_with(|settings| {
        settings.common.streams.quotas.requests_waiting_per_client = bus::WaitingQuota::Set(QUOTA);
        settings.common.streams.quotas.results_waiting_per_worker = bus::WaitingQuota::Set(QUOTA);
    })
    .await;
    system.nats.assert_secured();
    let (a, b) = (system.organization().await, system.organization().await);
    let s = &system.subjects;
    for (stream, discard) in [
        (s.requests_stream(), DiscardPolicy::New),
        (s.results_stream(), DiscardPolicy::New),
        (s.uploads_stream(), DiscardPolicy::New),
        (s.events_stream(), DiscardPolicy::Old),
    ] {
        let config = stream_info(&system, &stream).await.config;
        assert_eq!(
            config.max_bytes,
            bus::StreamQuotas::STREAM_BYTES_MAX_DEFAULT,
            "{stream} is bounded"
        );
        assert_eq!(config.discard, discard, "{stream}");
    }

    // A hostile client fills its quota while admission is down.
    system.stop(Component::Admission).await;
    let hostile = client_bus(&system, "a-client", vec![a]).await;
    let own = s.client(&a, "a-client", ClientVerb::Request).unwrap();
    let garbage = |n: usize| (format!("fill-{n}"), bytes::Bytes::from_static(b"garbage"));
    for n in 0..QUOTA as usize {
        let (id, payload) = garbage(n);
        hostile
            .publish_durable(own.clone(), &id, Default::default(), payload)
            .await
            .expect("within the quota");
    }
    let (id, payload) = garbage(QUOTA as usize);
    let refused = hostile
        .publish_durable(own.clone(), &id, Default::default(), payload)
        .await;
    assert!(
        matches!(&refused, Err(bus::BusError::Quota { .. })),
        "over the quota: {refused:?}"
    );
    // One request larger than any scan request is refused whole, whatever the quota.
    let big = client_bus(&system, "a-big", vec![a]).await;
    let refused = big
        .publish_durable(
            s.client(&a, "a-big", ClientVerb::Request).unwrap(),
            "big",
            Default::default(),
            vec![0_u8; bus::REQUEST_MESSAGE_BYTES_MAX as usize].into(),
        )
        .await;
    assert!(
        matches!(&refused, Err(bus::BusError::Quota { .. })),
        "an oversize request: {refused:?}"
    );

    // B is not affected: its request is confirmed and admitted.
    let b_client = client::Client::new(client_bus(&system, "b-client", vec![b]).await, "b-client");
    b_client
        .publish(&b_client.request(&b.to_string(), "http://b.test", &["alpha"], "b-1"))
        .await
        .expect("B's request is confirmed beside A's full quota");
    system.start(Component::Admission);
    wait_admitted(&system, b, "B's request admitted").await;
    // Decided requests leave the stream: A's quota is free again.
    system
        .wait_for("the requests stream emptied by admission", || async {
            (stream_messages(&system, &s.requests_stream()).await == 0).then_some(())
        })
        .await;
    let (id, payload) = garbage(QUOTA as usize + 1);
    hostile
        .publish_durable(own, &id, Default::default(), payload)
        .await
        .expect("the quota counts only waiting requests");

    // A hostile worker fills its results quota while ingestion is down; another worker's
    // result is still taken.
    system.stop(Component::Ingestion).await;
    let worker_id = system.registered_worker(a, 4).await;
    let worker = system.worker_bus(worker_id).await;
    let result_subject = s.worker(&worker_id.to_string(), WorkerVerb::Result);
    for n in 0..=QUOTA as usize {
        let (id, payload) = garbage(n);
        let sent = worker
            .publish_durable(result_subject.clone(), &id, Default::default(), payload)
            .await;
        if n < QUOTA as usize {
            sent.expect("within the quota");
        } else {
            assert!(
                matches!(&sent, Err(bus::BusError::Quota { .. })),
                "over the quota: {sent:?}"
            );
        }
    }
    let victim_id = system.registered_worker(b, 4).await;
    let victim = system.worker_bus(victim_id).await;
    victim
        .publish_durable(
            s.worker(&victim_id.to_string(), WorkerVerb::Result),
            "victim",
            Default::default(),
            bytes::Bytes::from_static(b"garbage"),
        )
        .await
        .expect("another worker's result is taken beside a full quota");
    system.start(Component::Ingestion);
    system
        .wait_for("the results stream emptied by ingestion", || async {
            (stream_messages(&system, &s.results_stream()).await == 0).then_some(())
        })
        .await;
    system.finish().await;
}

/// The requests and results streams keep only undecided messages even when a provisioning
/// raced the switch and wrote limits retention back: the consumer switches it again.
#[tokio::test]
async fn a_stream_set_back_to_keeping_decided_messages_is_switched_again() {
    use async_nats::jetstream::stream::RetentionPolicy;
    let system = TestSystem::spawn_with(|settings| {
        settings.admission.consumer.retention_check = Duration::from_millis(200);
        settings.ingestion.consumer.retention_check = Duration::from_millis(200);
    })
    .await;
    let retention = |stream: String| {
        let system = &system;
        async move { stream_info(system, &stream).await.config.retention }
    };
    for stream in [
        system.subjects.requests_stream(),
        system.subjects.results_stream(),
    ] {
        system
            .wait_for("interest retention once the consumer exists", || async {
                (retention(stream.clone()).await == RetentionPolicy::Interest).then_some(())
            })
            .await;
        let mut config = stream_info(&system, &stream).await.config;
        config.retention = RetentionPolicy::Limits;
        system
            .bus
            .jetstream()
            .update_stream(&config)
            .await
            .expect("a provisioning's late update");
        system
            .wait_for("interest retention again", || async {
                (retention(stream.clone()).await == RetentionPolicy::Interest).then_some(())
            })
            .await;
    }
    system.finish().await;
}

/// Every seed and `.creds` file palisade writes is readable by its owner only, also where a
/// readable file was there before.
#[tokio::test]
async fn secrets_written_over_readable_files_are_readable_by_their_owner_only() {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = tempfile::tempdir().unwrap();
    let readable = |path: &std::path::Path| {
        std::fs::write(path, "an older file, readable by everyone").unwrap();
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644)).unwrap();
    };
    let creds = dir.path().join("worker.creds");
    readable(&creds);
    identity::write_secret(&creds, "a secret").unwrap();
    let authority_dir = dir.path().join("authority");
    let authority = identity::Authority::generate();
    authority.write(&authority_dir).unwrap();
    let seeds: Vec<_> = std::fs::read_dir(&authority_dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .collect();
    for seed in &seeds {
        readable(seed);
    }
    authority.write(&authority_dir).unwrap();
    for path in seeds.iter().chain([&creds]) {
        let mode = std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}: mode {mode:o}", path.display());
    }
    assert_eq!(std::fs::read_to_string(&creds).unwrap(), "a secret");
}

/// A request PubAcked before its client was revoked is decided against the registration as it is
/// when admission decides it: refused with `client_revoked` on `scan.rejected`, nothing written;
/// the request/reply path refuses the revoked client too. Enabled again, its requests are
/// admitted on both paths.
#[tokio::test]
async fn a_request_queued_before_its_client_was_revoked_is_rejected_naming_why() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let client_id = "revoked-client";
    store::bus_identities::register_client(
        &system.pool,
        client_id,
        "revoked",
        &[org],
        &store::audit::Change::new("test", ""),
    )
    .await
    .unwrap();
    let bus = system
        .nats
        .connect(&Identity::Client {
            client_id: client_id.into(),
            organizations: vec![org],
        })
        .await;
    let client = client::Client::new(bus, client_id);
    let mut rejections = system
        .bus
        .client()
        .subscribe(system.subjects.tenant_event(&org, EventKind::ScanRejected))
        .await
        .unwrap();
    system.bus.flush().await.unwrap();

    system.stop(Component::Admission).await;
    let queued = client.request(&org.to_string(), "http://queued.test", &["alpha"], "queued");
    client
        .publish(&queued)
        .await
        .expect("the request is PubAcked");
    assert!(
        store::bus_identities::revoke_client(
            &system.pool,
            client_id,
            &store::audit::Change::new("test", "credentials leaked")
        )
        .await
        .unwrap()
    );
    let before = system.table_counts().await;
    system.start(Component::Admission);

    let event = tokio::time::timeout(tests::WAIT_MAX, rejections.next())
        .await
        .expect("the queued request is rejected")
        .expect("a subscription");
    let rejected = v1::ScanRejected::decode(event.payload.as_ref()).unwrap();
    assert_eq!(rejected.client_id, client_id);
    assert_eq!(rejected.idempotency_key, "queued");
    let error = rejected.error.expect("the refusal");
    assert_eq!(
        error.error_code(),
        Some(ErrorCode::ClientRevoked),
        "{error:?}"
    );
    assert!(error.message.contains("revoked"), "{error:?}");
    tests::wait_consumer_idle(
        &system,
        &system.subjects.requests_stream(),
        admission::CONSUMER_NAME,
    )
    .await;
    let reply = client
        .submit(&client.request(&org.to_string(), "http://sync.test", &["alpha"], "sync"))
        .await
        .expect("admission answers");
    assert_eq!(
        reply.error.expect("refused").error_code(),
        Some(ErrorCode::ClientRevoked)
    );
    assert_eq!(system.table_counts().await, before, "nothing admitted");

    // Enabled again: its requests are admitted (a refusal wrote nothing, so a refused key is
    // free; the queued request itself is not re-decided, JetStream drops its exact replay).
    assert!(
        store::bus_identities::enable_client(
            &system.pool,
            client_id,
            &store::audit::Change::new("test", ""),
            // No push follows: its credentials stay as they are.
            chrono::DateTime::UNIX_EPOCH,
        )
        .await
        .unwrap()
    );
    client
        .publish(&client.request(&org.to_string(), "http://queued.test", &["alpha"], "again"))
        .await
        .expect("the request is PubAcked");
    system
        .wait_for(
            "the enabled client's queued request to be admitted",
            || async { (system.table_counts().await["scans"] == 1).then_some(()) },
        )
        .await;
    let reply = client
        .submit(&client.request(&org.to_string(), "http://sync.test", &["alpha"], "sync"))
        .await
        .expect("admission answers");
    assert!(reply.error.is_none(), "{reply:?}");
    assert_eq!(system.table_counts().await["scans"], 2);
    system.finish().await;
}

/// The uploads stream's last sequence and bytes: anything stored moves them.
async fn uploads_state(system: &TestSystem) -> (u64, u64) {
    let mut stream = system
        .bus
        .jetstream()
        .get_stream(system.subjects.uploads_stream())
        .await
        .expect("the uploads stream");
    let info = stream.info().await.expect("stream info");
    (info.state.last_sequence, info.state.bytes)
}

/// Chunk `index` of `upload_id` sent on `subject` as the SDK sends it: a JetStream publish
/// with `Nats-Msg-Id` `<upload_id>:<index>`, its PubAck awaited.
async fn send_chunk(
    bus: &Bus,
    subject: String,
    upload_id: &str,
    index: u32,
    data: Vec<u8>,
) -> Result<async_nats::jetstream::publish::PublishAck, bus::BusError> {
    bus.publish_durable(
        subject,
        &format!("{upload_id}:{index}"),
        Default::default(),
        chunk(upload_id, index, data).into(),
    )
    .await
}

/// An encoded `ArtifactChunk` of `upload_id`.
fn chunk(upload_id: &str, index: u32, data: Vec<u8>) -> Vec<u8> {
    v1::ArtifactChunk {
        upload_id: upload_id.to_owned(),
        index,
        data,
    }
    .encode_to_vec()
}

#[tokio::test]
async fn a_worker_stores_upload_chunks_only_for_an_open_session_of_its_own() {
    // Issue 23, item 3: ingestion, not the stream, receives what a worker publishes on its
    // upload subjects; without an open session of its own, nothing it sends is kept.
    let system = TestSystem::spawn().await;
    system.nats.assert_secured();
    let scan = system.leased_scan(&["alpha"]).await;
    let victim = system.leased_scan(&["alpha"]).await;
    let hostile_id = scan.worker.id;
    let w = hostile_id.to_string();
    let hostile = system.worker_bus(hostile_id).await;
    let lease = scan.lease.lease.clone().expect("lease ref");
    let victim_lease = victim.lease.lease.clone().expect("lease ref");
    // The victim's session, open: its id is what a hostile worker would aim at.
    let victim_upload = Uuid::new_v4();
    let prepared = victim
        .worker
        .prepare_upload(&victim_lease, victim_upload, "victim.json")
        .await;
    assert!(prepared.error.is_none(), "{prepared:?}");
    let before = uploads_state(&system).await;
    let full = vec![0x5a_u8; bus::artifacts::CHUNK_BYTES_MAX as usize];

    // A JetStream publish, PubAck awaited, for an upload id nobody prepared: refused, saying
    // why, and nothing stored.
    let invented = Uuid::new_v4().to_string();
    let refused = send_chunk(
        &hostile,
        system.subjects.upload(&w, &invented),
        &invented,
        0,
        full.clone(),
    )
    .await
    .expect_err("a chunk without a session was acknowledged");
    let why = refused.to_string();
    assert!(
        why.contains(&format!(
            "no open upload session {invented} for this worker"
        )) && why.contains("prepare one first"),
        "{why}"
    );
    // The victim's session id on the hostile worker's own subject: not its session.
    let victim_id = victim_upload.to_string();
    let refused = send_chunk(
        &hostile,
        system.subjects.upload(&w, &victim_id),
        &victim_id,
        0,
        full.clone(),
    )
    .await
    .expect_err("a chunk of another worker's session was acknowledged");
    assert!(
        refused.to_string().contains("no open upload session"),
        "{refused}"
    );
    // Plain publishes, no reply asked for: many, none kept.
    for index in 0..32 {
        let upload = Uuid::new_v4().to_string();
        for subject in [
            system.subjects.upload(&w, &upload),
            system.subjects.upload(&w, &victim_id),
        ] {
            let _ = hostile
                .client()
                .publish(subject, chunk(&upload, index, full.clone()).into())
                .await;
        }
    }
    // The victim's own subject: the hostile worker's account cannot publish there at all, so
    // no PubAck comes, whether the chunk names the victim's session or not.
    let aimed = tokio::time::timeout(
        SETTLE,
        hostile.publish_durable(
            system
                .subjects
                .upload(&victim.worker.id.to_string(), &victim_id),
            &format!("{victim_id}:0"),
            Default::default(),
            chunk(&victim_id, 0, full.clone()).into(),
        ),
    )
    .await;
    assert!(
        !matches!(aimed, Ok(Ok(_))),
        "a PubAck came for another worker's upload subject: {aimed:?}"
    );
    let _ = hostile
        .client()
        .publish(
            system
                .subjects
                .upload(&victim.worker.id.to_string(), &victim_id),
            chunk(&victim_id, 1, full.clone()).into(),
        )
        .await;
    // Nor the stream's own subjects, which only ingestion publishes on.
    let _ = hostile
        .client()
        .publish(
            system.subjects.upload_stored(&w, &invented),
            chunk(&invented, 0, full.clone()).into(),
        )
        .await;
    let _ = hostile.client().flush().await;
    tokio::time::sleep(SETTLE).await;
    assert_eq!(
        uploads_state(&system).await,
        before,
        "the uploads stream stored something without a session"
    );

    // The hostile worker's own open session works as before: acknowledged by the uploads
    // stream, a resend kept once, what is not a chunk of it (past the last index, another
    // upload's id) refused, and the file commits.
    let upload = Uuid::new_v4();
    let id = upload.to_string();
    let prepared = scan
        .worker
        .prepare_upload(&lease, upload, "mine.json")
        .await;
    assert!(prepared.error.is_none(), "{prepared:?}");
    assert_eq!(prepared.chunk_subject, system.subjects.upload(&w, &id));
    let data = b"my own artifact".to_vec();
    let send = async |index: u32, upload_id: &str| {
        send_chunk(
            &hostile,
            prepared.chunk_subject.clone(),
            upload_id,
            index,
            data.clone(),
        )
        .await
    };
    let ack = send(0, &id).await.expect("a chunk of an open session");
    assert_eq!(ack.stream, system.subjects.uploads_stream());
    assert!(!ack.duplicate);
    let again = send(0, &id).await.expect("a resend");
    assert!(again.duplicate, "{again:?}");
    assert_eq!(again.sequence, ack.sequence);
    let past = send(u32::MAX, &id)
        .await
        .expect_err("an index past the last");
    assert!(past.to_string().contains("too_large"), "{past}");
    let other = send(1, &invented)
        .await
        .expect_err("another upload's chunk");
    assert!(other.to_string().contains("invalid_field"), "{other}");
    assert_eq!(uploads_state(&system).await.0, before.0 + 1);
    let committed = scan
        .worker
        .commit_upload(
            &lease,
            upload,
            data.len() as u64,
            &messages::sha256_hex(&data),
            1,
        )
        .await;
    assert!(committed.error.is_none(), "{committed:?}");
    // Committed, the session takes no more chunks.
    let late = send(1, &id).await.expect_err("a chunk after the commit");
    assert!(
        late.to_string().contains("no open upload session"),
        "{late}"
    );
    system.finish().await;
}

/// One upload session's chunks are bounded on the stream too: past the quota (twice a
/// largest file's chunks; 2 here) a chunk is refused `too_large`, whatever its index.
#[tokio::test]
async fn an_upload_session_stores_no_more_chunks_than_its_quota() {
    let system = TestSystem::spawn_with(|settings| {
        settings.common.streams.quotas.chunks_stored_per_upload = 2;
    })
    .await;
    let scan = system.leased_scan(&["alpha"]).await;
    let w = scan.worker.id.to_string();
    let worker = system.worker_bus(scan.worker.id).await;
    let lease = scan.lease.lease.clone().expect("lease ref");
    let upload = Uuid::new_v4();
    let id = upload.to_string();
    let prepared = scan.worker.prepare_upload(&lease, upload, "big.bin").await;
    assert!(prepared.error.is_none(), "{prepared:?}");
    for index in 0..3 {
        let sent = send_chunk(
            &worker,
            system.subjects.upload(&w, &id),
            &id,
            index,
            vec![1_u8; 16],
        )
        .await;
        if index < 2 {
            sent.expect("within the session's quota");
        } else {
            let why = sent
                .expect_err("a chunk past the quota was stored")
                .to_string();
            assert!(
                why.contains("too_large") && why.contains("prepare a new upload"),
                "{why}"
            );
        }
    }
    system.finish().await;
}

// --- Enrollment (issue 44): a worker joins with a one-time token, never the authority ---

/// An operator's one-time token for a new worker of `organizations` allowed `capabilities`,
/// issued as `palisade worker token create` does (its account pushed, its user signed).
async fn enrollment_token(
    system: &TestSystem,
    organizations: &[Uuid],
    capabilities: &[&str],
    expires: Duration,
) -> identity::enrollment::EnrollmentToken {
    let authority = system.nats.authority.clone().expect("secured");
    let request = palisade::worker::TokenRequest {
        orgs: organizations.to_vec(),
        capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
        expires,
        name: None,
        capacity: 4,
    };
    palisade::worker::issue_token(
        &system.settings.common,
        &system.pool,
        &authority,
        &request,
        Uuid::new_v4(),
        &store::audit::Change::new("test-operator", "issue 44"),
    )
    .await
    .expect("token issued")
}

/// Where and how the test system's NATS is reached, for enrolling.
fn address(system: &TestSystem) -> (String, bus::NatsTls) {
    (system.nats.url().to_owned(), bus::NatsTls::default())
}

async fn enroll(
    system: &TestSystem,
    token: &identity::enrollment::EnrollmentToken,
    dir: &std::path::Path,
) -> Result<worker::enrollment::Enrolled, worker::WorkerError> {
    let (url, tls) = address(system);
    let address = worker::enrollment::BusAddress {
        url: &url,
        tls: &tls,
        subjects: &system.subjects,
    };
    worker::enrollment::enroll(&address, token, dir).await
}

/// The token's own NATS user, connected: what a thief of the token holds.
async fn token_bus(
    system: &TestSystem,
    token: &identity::enrollment::EnrollmentToken,
) -> Result<Bus, bus::BusError> {
    Bus::connect(
        system.nats.url(),
        &NatsCredentials::from_creds(token.creds.as_str()),
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &Identity::Worker {
            worker_id: token.worker_id,
        },
    )
    .await
}

/// An enrollment request for `token` with `public_key`, asking for `organizations` and
/// `capabilities` (empty: the token's), sent on `worker_id`'s subject; dispatch's answer.
async fn send_enroll(
    bus: &Bus,
    worker_id: Uuid,
    token: &identity::enrollment::EnrollmentToken,
    public_key: &str,
    organizations: &[Uuid],
    capabilities: &[&str],
) -> Option<v1::EnrollReply> {
    let request = v1::EnrollRequest {
        schema_version: messages::SCHEMA_VERSION,
        worker_id: token.worker_id.to_string(),
        token_id: token.token_id.to_string(),
        secret: token.secret.clone(),
        public_key: public_key.to_owned(),
        organization_ids: organizations.iter().map(Uuid::to_string).collect(),
        capabilities: capabilities.iter().map(|c| (*c).to_owned()).collect(),
    };
    let subject = bus
        .subjects()
        .worker(&worker_id.to_string(), WorkerVerb::Enroll);
    let answer = tokio::time::timeout(
        Duration::from_secs(5),
        bus.client()
            .request(subject, request.encode_to_vec().into()),
    )
    .await
    .ok()?
    .ok()?;
    Some(v1::EnrollReply::decode(answer.payload.as_ref()).expect("an EnrollReply"))
}

fn refusal(reply: &v1::EnrollReply) -> String {
    let error = reply.error.as_ref().expect("refused");
    assert_eq!(
        error.error_code(),
        Some(ErrorCode::EnrollmentRefused),
        "{error:?}"
    );
    error.message.clone()
}

#[tokio::test]
async fn a_worker_joins_with_a_one_time_token_and_every_misuse_of_the_token_fails() {
    let system = TestSystem::spawn().await;
    let authority = system.nats.authority.clone().expect("secured");
    let org = system.organization().await;
    let other_org = system.organization().await;
    let state = tempfile::tempdir().unwrap();

    // The worker enrolls: its own key pair, dispatch's JWT, kept in its state directory.
    let token = enrollment_token(&system, &[org], &["alpha"], Duration::from_secs(3600)).await;
    let enrolled = enroll(&system, &token, state.path())
        .await
        .expect("enrolled");
    assert_eq!(enrolled.state.worker_id, token.worker_id);

    // Its state holds its own seed and nothing of the authority's.
    let seeds_dir = tempfile::tempdir().unwrap();
    authority.write(seeds_dir.path()).unwrap();
    let mut files = Vec::new();
    for entry in std::fs::read_dir(state.path()).unwrap() {
        let path = entry.unwrap().path();
        files.push(path.file_name().unwrap().to_string_lossy().into_owned());
        let text = std::fs::read_to_string(&path).unwrap();
        for seed in std::fs::read_dir(seeds_dir.path()).unwrap() {
            let seed = std::fs::read_to_string(seed.unwrap().path()).unwrap();
            assert!(
                !text.contains(seed.trim()),
                "{path:?} holds an authority seed"
            );
        }
    }
    files.sort();
    assert_eq!(files, ["worker.creds", "worker.json"]);

    // It serves its token's organization with its token's capabilities, and no more.
    let bus = Bus::connect(
        system.nats.url(),
        &enrolled.credentials,
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &Identity::Worker {
            worker_id: token.worker_id,
        },
    )
    .await
    .expect("the enrolled worker connects");
    let worker = tests::ManualWorker::connect(bus, token.worker_id).await;
    let beyond = worker.hello(&["alpha", "beta"]).await;
    assert_eq!(
        beyond.error.expect("refused").error_code(),
        Some(ErrorCode::InvalidField)
    );
    let hello = worker.hello(&["alpha"]).await;
    assert!(hello.error.is_none(), "{hello:?}");
    assert_eq!(hello.organization_ids, [org.to_string()]);
    system
        .submit(&system.request(org, "http://enrolled.test", &["alpha"]))
        .await;
    let lease = worker.acquire_one().await;
    assert!(worker.complete(&lease, 0).await.error.is_none());

    // The enrollment is audited, naming the token and who issued it.
    let changes = store::audit::recent(&system.pool, Some(token.worker_id), None, &[], 20)
        .await
        .unwrap();
    assert!(
        changes.iter().any(|change| change.action == "enroll_worker"
            && change.actor.contains(&token.token_id.to_string())
            && change.actor.contains("test-operator")),
        "{changes:?}"
    );

    // A stolen used token: its user still connects until it expires, but enrolling a new key
    // with it is refused, and so is a replay of the whole request under another key.
    let thief = token_bus(&system, &token)
        .await
        .expect("the token's user connects");
    let thief_key = nkeys::KeyPair::new_user().public_key();
    let reply = send_enroll(&thief, token.worker_id, &token, &thief_key, &[], &[])
        .await
        .expect("answered");
    assert!(refusal(&reply).contains("used already"), "{reply:?}");
    assert!(
        enroll(&system, &token, tempfile::tempdir().unwrap().path())
            .await
            .is_err(),
        "a used token enrolled again"
    );
    // The worker's own enrollment sent again (its answer lost) is answered again, for its key.
    let again = send_enroll(
        &thief,
        token.worker_id,
        &token,
        &enrolled.state.public_key,
        &[],
        &[],
    )
    .await
    .expect("answered");
    assert!(again.error.is_none() && !again.jwt.is_empty(), "{again:?}");

    // The token's user may send `enroll` on its own worker's subject only: another worker's is
    // refused by the server (no answer), another worker id in the body by dispatch.
    let victim = Uuid::new_v4();
    assert!(
        send_enroll(&thief, victim, &token, &thief_key, &[], &[])
            .await
            .is_none(),
        "the token's user reached another worker's enroll subject"
    );
    let fresh = enrollment_token(&system, &[org], &["alpha"], Duration::from_secs(3600)).await;
    let fresh_bus = token_bus(&system, &fresh).await.unwrap();
    let mut other_id = fresh.clone();
    other_id.worker_id = victim;
    let reply = send_enroll(&fresh_bus, fresh.worker_id, &other_id, &thief_key, &[], &[])
        .await
        .expect("answered");
    assert_eq!(
        reply.error.expect("refused").error_code(),
        Some(ErrorCode::InvalidField)
    );
    // Asking for more organizations or capabilities than the token carries is refused, and
    // writes nothing: the token still enrolls afterwards.
    for (organizations, capabilities) in [(vec![other_org], vec![]), (vec![], vec!["beta"])] {
        let reply = send_enroll(
            &fresh_bus,
            fresh.worker_id,
            &fresh,
            &thief_key,
            &organizations,
            &capabilities,
        )
        .await
        .expect("answered");
        assert!(
            refusal(&reply).contains("not among the token's"),
            "{reply:?}"
        );
    }
    // A wrong secret is "no such token", whatever the token's state.
    let mut guessed = fresh.clone();
    guessed.secret = identity::enrollment::EnrollmentToken::new_secret();
    let reply = send_enroll(&fresh_bus, fresh.worker_id, &guessed, &thief_key, &[], &[])
        .await
        .expect("answered");
    assert_eq!(refusal(&reply), "no such token");
    enroll(&system, &fresh, tempfile::tempdir().unwrap().path())
        .await
        .expect("the token refused above still enrolls");

    // A revoked token is refused.
    let revoked = enrollment_token(&system, &[org], &["alpha"], Duration::from_secs(3600)).await;
    assert!(
        store::enrollment::revoke_token(
            &system.pool,
            revoked.token_id,
            &store::audit::Change::new("test-operator", "")
        )
        .await
        .unwrap()
    );
    let error = enroll(&system, &revoked, tempfile::tempdir().unwrap().path())
        .await
        .expect_err("a revoked token enrolled")
        .to_string();
    assert!(error.contains("revoked"), "{error}");

    // An expired token is refused: its user's JWT expired with it, and dispatch would refuse
    // it too.
    let expired = enrollment_token(&system, &[org], &["alpha"], Duration::from_secs(1)).await;
    system
        .wait_for("the token to expire by the database's clock", || async {
            let expired: bool = sqlx::query_scalar(
                "SELECT expires_at <= now() FROM enrollment_tokens WHERE id = $1",
            )
            .bind(expired.token_id)
            .fetch_one(&system.pool)
            .await
            .unwrap();
            expired.then_some(())
        })
        .await;
    assert!(
        enroll(&system, &expired, tempfile::tempdir().unwrap().path())
            .await
            .is_err(),
        "an expired token enrolled"
    );
    let expired_row: bool = store::enrollment::list_tokens(&system.pool, true, 100)
        .await
        .unwrap()
        .iter()
        .any(|listed| listed.id == expired.token_id && listed.used_at.is_none());
    assert!(expired_row, "the expired token was not used");
    system.finish().await;
}

/// `holder`'s account as PostgreSQL records it, pushed as the revocation commands do.
async fn push(system: &TestSystem, holder: store::bus_identities::Holder) {
    palisade::accounts::push(
        system.nats.authority.as_ref().expect("secured"),
        &system.subjects,
        system.nats.url(),
        &bus::NatsTls::default(),
        &system.pool,
        Some(&holder),
    )
    .await
    .expect("pushed");
}

/// Revoking a worker or a client ends its account: a user minted afterwards with the
/// account's key (or the enrollment key) is refused by the server itself. Re-enabling refuses
/// every credential issued before it; fresh ones connect.
#[tokio::test]
async fn a_revoked_account_refuses_even_users_minted_later_with_its_key() {
    let system = TestSystem::spawn().await;
    let authority = system.nats.authority.clone().expect("secured");
    let org = system.organization().await;
    let token = enrollment_token(&system, &[org], &["alpha"], Duration::from_secs(3600)).await;
    let state = tempfile::tempdir().unwrap();
    let enrolled = enroll(&system, &token, state.path())
        .await
        .expect("enrolled");
    let worker_id = token.worker_id;
    let identity = Identity::Worker { worker_id };
    let connect = |credentials: NatsCredentials| {
        let identity = identity.clone();
        let subjects = system.subjects.clone();
        let url = system.nats.url().to_owned();
        async move {
            Bus::connect(
                &url,
                &credentials,
                &bus::NatsTls::default(),
                subjects,
                &identity,
            )
            .await
        }
    };
    let minted_with_account_key = |authority: &identity::Authority| {
        NatsCredentials::from_creds(authority.issue(&system.subjects, &identity).file)
    };
    let minted_with_enrollment_key = || {
        let key = nkeys::KeyPair::new_user();
        let jwt = authority
            .enroller()
            .unwrap()
            .sign_user(
                &authority.account_of(&identity),
                &key.public_key(),
                "minted",
                4_102_444_000,
            )
            .unwrap();
        NatsCredentials::from_creds(identity::creds_file(&jwt, &key.seed().unwrap()))
    };
    assert!(connect(enrolled.credentials.clone()).await.is_ok());
    assert!(
        connect(minted_with_enrollment_key()).await.is_ok(),
        "the enrollment key signs this worker's users"
    );

    store::revoke::revoke_worker(
        &system.pool,
        &system.subjects,
        worker_id,
        &store::audit::Change::new("test", "stolen"),
        store::revoke::ActiveLeases::Cancel,
    )
    .await
    .expect("revoked");
    push(&system, store::bus_identities::Holder::Worker(worker_id)).await;
    assert!(connect(enrolled.credentials.clone()).await.is_err());
    assert!(
        connect(minted_with_account_key(&authority)).await.is_err(),
        "a user minted after the revocation with the worker's account key connected"
    );
    assert!(
        connect(minted_with_enrollment_key()).await.is_err(),
        "a user minted after the revocation with the enrollment key connected"
    );

    // Re-enabled: what was issued before stays refused; fresh credentials connect.
    let cutoff = palisade::nats::credentials_cutoff();
    assert!(
        store::revoke::enable_worker(
            &system.pool,
            worker_id,
            &store::audit::Change::new("test", ""),
            cutoff
        )
        .await
        .unwrap()
    );
    push(&system, store::bus_identities::Holder::Worker(worker_id)).await;
    assert!(connect(enrolled.credentials.clone()).await.is_err());
    palisade::nats::past(cutoff).await;
    assert!(
        connect(minted_with_account_key(&authority)).await.is_ok(),
        "fresh credentials after the re-enable"
    );

    // A client alike.
    let client_id = "revoked-client";
    let client = Identity::Client {
        client_id: client_id.to_owned(),
        organizations: vec![org],
    };
    store::bus_identities::register_client(
        &system.pool,
        client_id,
        "",
        &[org],
        &store::audit::Change::new("test", ""),
    )
    .await
    .unwrap();
    let issued = authority.issue(&system.subjects, &client);
    store::bus_identities::record_credential(
        &system.pool,
        &store::bus_identities::Holder::Client(client_id.to_owned()),
        &issued.public_key,
    )
    .await
    .unwrap();
    store::bus_identities::revoke_client(
        &system.pool,
        client_id,
        &store::audit::Change::new("test", ""),
    )
    .await
    .unwrap();
    push(
        &system,
        store::bus_identities::Holder::Client(client_id.to_owned()),
    )
    .await;
    let minted = authority.issue(&system.subjects, &client);
    let refused = Bus::connect(
        system.nats.url(),
        &NatsCredentials::from_creds(minted.file),
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &client,
    )
    .await;
    assert!(
        refused.is_err(),
        "a client user minted after the revocation connected"
    );
    system.finish().await;
}

/// An enrolled worker renews its credentials before they expire, and keeps working past the
/// first JWT's expiry (credentials of 6 s here; at least ten minutes in production).
#[tokio::test]
async fn an_enrolled_worker_renews_its_credentials_before_they_expire() {
    let system = TestSystem::spawn_with(|settings| {
        settings.dispatch.credentials_ttl = Duration::from_secs(6);
    })
    .await;
    let org = system.organization().await;
    let token = enrollment_token(&system, &[org], &["alpha"], Duration::from_secs(3600)).await;
    let state = tempfile::tempdir().unwrap();
    let enrolled = enroll(&system, &token, state.path())
        .await
        .expect("enrolled");
    let first_expiry = enrolled.state.expires_at_unix_ms;
    let bus = Bus::connect(
        system.nats.url(),
        &enrolled.credentials,
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &Identity::Worker {
            worker_id: token.worker_id,
        },
    )
    .await
    .unwrap_or_else(|error| panic!("connected: {error}\n{}", system.nats.server_log()));
    let stop = tokio_util::sync::CancellationToken::new();
    let renewing = tokio::spawn(worker::enrollment::keep_renewed(
        bus.clone(),
        enrolled,
        stop.clone(),
    ));
    let worker = tests::ManualWorker::connect(bus, token.worker_id).await;
    // Renewed: the state directory holds the new credentials.
    system
        .wait_for("the credentials renewed", || async {
            let kept = worker::enrollment::Enrolled::load(state.path())
                .unwrap()
                .expect("state kept");
            (kept.state.expires_at_unix_ms > first_expiry).then_some(())
        })
        .await;
    // Past the first JWT's expiry (a second more, for the server's whole-second clock).
    system
        .wait_for("the first credentials to have expired", || async {
            let now_ms = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_millis() as i64;
            (now_ms > first_expiry + 1_000).then_some(())
        })
        .await;
    let hello = worker.hello(&["alpha"]).await;
    assert!(hello.error.is_none(), "{hello:?}");
    stop.cancel();
    renewing.await.unwrap();
    system.finish().await;
}

/// `palisade-worker` on a machine outside the cluster joins with one command and the token:
/// no worker id, no `.creds`, no authority; it runs a scan, and restarted it uses what it kept
/// (the token is spent).
#[tokio::test]
async fn the_reference_worker_joins_with_only_a_token_and_keeps_its_identity_across_restarts() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let token =
        enrollment_token(&system, &[org], &["tcp_connect"], Duration::from_secs(3600)).await;
    let state = tempfile::tempdir().unwrap();
    let start = || {
        tokio::process::Command::new(env!("CARGO_BIN_EXE_test-worker"))
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("NATS_URL", system.nats.url())
            .env("PALISADE_SUBJECT_PREFIX", system.subjects.prefix())
            .env("PALISADE_ENROLLMENT_TOKEN", token.encode())
            .env("PALISADE_WORKER_STATE_DIR", state.path())
            .env("RUST_LOG", "warn")
            .kill_on_drop(true)
            .spawn()
            .expect("the worker starts")
    };
    for run in ["enrolled", "restarted"] {
        let mut worker = start();
        let reply = system
            .submit(&system.request(org, "tcp://127.0.0.1:9", &["tcp_connect"]))
            .await;
        assert!(reply.error.is_none(), "{run}: {reply:?}");
        let scan_id = reply.scan_id.clone();
        system
            .wait_for(&format!("a scan run by the {run} worker"), || async {
                let state = system.scan_state(&scan_id).await;
                (state == "completed" || state == "failed").then_some(())
            })
            .await;
        let leased_by: Vec<Uuid> = sqlx::query_scalar(
            "SELECT DISTINCT a.worker_id FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id WHERE t.scan_id = $1",
        )
        .bind(Uuid::parse_str(&scan_id).unwrap())
        .fetch_all(&system.pool)
        .await
        .unwrap();
        assert_eq!(leased_by, [token.worker_id], "{run}");
        // Stopped as an orchestrator stops it: its waiting acquire is given up, so the next
        // scan is not leased to a process that is gone.
        let pid = worker.id().expect("running").to_string();
        assert!(
            std::process::Command::new("kill")
                .args(["-TERM", &pid])
                .status()
                .unwrap()
                .success()
        );
        // It answers SIGTERM once its acquire long-poll returns (10 s, again after a resend).
        tokio::time::timeout(Duration::from_secs(90), worker.wait())
            .await
            .expect("the worker stops on SIGTERM")
            .unwrap();
    }
    let tokens = store::enrollment::list_tokens(&system.pool, true, 10)
        .await
        .unwrap();
    assert!(
        tokens
            .iter()
            .any(|listed| listed.id == token.token_id && listed.used_at.is_some())
    );
    system.finish().await;
}

/// Publishes `message_bytes`-byte messages (less room for the message id and trace headers)
/// on `subject` until one is refused for its quota; how many were stored.
async fn flood(bus: &Bus, subject: &str, message_bytes: i32) -> i64 {
    let payload = bytes::Bytes::from(vec![7_u8; message_bytes as usize - 1_024]);
    let mut stored = 0_i64;
    for round in 0.. {
        let messages: Vec<_> = (0..100)
            .map(|n| bus::OutgoingMessage {
                subject: subject.to_owned(),
                msg_id: format!("flood-{subject}-{round}-{n}"),
                headers: Default::default(),
                payload: payload.clone(),
            })
            .collect();
        let mut refused = false;
        for sent in bus.publish_durable_all(messages).await {
            match sent {
                Ok(_) => stored += 1,
                Err(bus::BusError::Quota { .. }) => refused = true,
                Err(error) => panic!("{error}"),
            }
        }
        if refused {
            break;
        }
    }
    stored
}

/// How many identities `stream` counts at their quota (`palisade_stream_identities_at_quota`).
async fn identities_at_quota(system: &TestSystem, stream: String) -> i64 {
    system
        .bus
        .record_stream_usage()
        .await
        .expect("the streams' usage read");
    bus::metrics::bus_metrics()
        .stream_identities_at_quota
        .get_or_create(&bus::metrics::StreamLabels { stream })
        .get()
}

/// One client flooding the requests stream with the largest messages it may send, while
/// admission is down, is stopped at its own bound, an eighth of the stream's bytes; another
/// tenant's requests are still taken (issue 44, item 3, for the requests stream; the defaults).
#[tokio::test]
async fn a_client_flooding_the_requests_stream_is_stopped_far_below_its_bytes_and_another_tenant_submits()
 {
    let system = TestSystem::spawn().await;
    let (a, b) = (system.organization().await, system.organization().await);
    let s = &system.subjects;
    let config = stream_info(&system, &s.requests_stream()).await.config;
    let bound = config.max_messages_per_subject * i64::from(bus::REQUEST_MESSAGE_BYTES_MAX);
    assert!(
        bound * bus::WaitingQuota::IDENTITY_SHARE <= config.max_bytes,
        "one client's waiting requests of one organization may hold {bound} bytes, over an eighth of the stream's {}",
        config.max_bytes
    );
    system.stop(Component::Admission).await;
    let hostile = client_bus(&system, "flooder", vec![a]).await;
    let subject = s.client(&a, "flooder", ClientVerb::Request).unwrap();
    let stored = flood(&hostile, &subject, bus::REQUEST_MESSAGE_BYTES_MAX).await;
    assert_eq!(
        stored, config.max_messages_per_subject,
        "stopped at its count"
    );
    let held = stream_info(&system, &s.requests_stream()).await.state.bytes;
    assert!(
        held as i64 <= bound,
        "{held} bytes held, over the bound {bound}"
    );
    // The operator sees who is at the bound: the gauge, and the subject in the log.
    assert_eq!(
        identities_at_quota(&system, s.requests_stream()).await,
        1,
        "one identity at its quota"
    );

    // Another tenant is not crowded out.
    let other = client::Client::new(client_bus(&system, "other", vec![b]).await, "other");
    other
        .publish(&other.request(&b.to_string(), "http://other.test", &["alpha"], "b-1"))
        .await
        .expect("another tenant's request is confirmed beside the flood");
    system.start(Component::Admission);
    wait_admitted(&system, b, "the other tenant's request admitted").await;
    system.finish().await;
}

/// One worker flooding the results stream on each of its durable verbs with the largest
/// messages the stream takes, while ingestion is down, is stopped at its own bound, a
/// eighth of the stream's bytes; another worker's results are still taken and decided
/// once ingestion is back (issue 44, item 3, for the results stream; the defaults).
#[tokio::test]
async fn a_worker_flooding_the_results_stream_is_stopped_far_below_its_bytes_and_another_worker_publishes()
 {
    let system = TestSystem::spawn().await;
    let (a, b) = (system.organization().await, system.organization().await);
    let s = &system.subjects;
    let config = stream_info(&system, &s.results_stream()).await.config;
    assert_eq!(config.max_message_size, bus::RESULT_MESSAGE_BYTES_MAX);
    // The largest message a worker can send: the stream's, or the server's max_payload (1 MiB
    // by default) when smaller.
    let largest = bus::RESULT_MESSAGE_BYTES_MAX
        .min(i32::try_from(system.bus.client().server_info().max_payload).unwrap_or(i32::MAX));
    let verbs = WorkerVerb::DURABLE.len() as i64;
    let bound = verbs * config.max_messages_per_subject * i64::from(bus::RESULT_MESSAGE_BYTES_MAX);
    assert!(
        bound * bus::WaitingQuota::IDENTITY_SHARE <= config.max_bytes,
        "one worker's waiting results may hold {bound} bytes, over an eighth of the stream's {}",
        config.max_bytes
    );
    system.stop(Component::Ingestion).await;
    let hostile_id = system.registered_worker(a, 4).await;
    let hostile = system.worker_bus(hostile_id).await;
    for verb in WorkerVerb::DURABLE {
        let subject = s.worker(&hostile_id.to_string(), verb);
        let stored = flood(&hostile, &subject, largest).await;
        assert_eq!(
            stored, config.max_messages_per_subject,
            "{verb:?} stopped at its count"
        );
    }
    let held = stream_info(&system, &s.results_stream()).await.state.bytes;
    assert!(
        held as i64 <= bound,
        "{held} bytes held, over the bound {bound}"
    );
    assert_eq!(
        identities_at_quota(&system, s.results_stream()).await,
        verbs,
        "each of the worker's verbs at its quota"
    );
    // Another worker is not crowded out: its largest messages are confirmed.
    let other_id = system.registered_worker(b, 4).await;
    let other = system.worker_bus(other_id).await;
    for verb in WorkerVerb::DURABLE {
        other
            .publish_durable(
                s.worker(&other_id.to_string(), verb),
                &format!("other-{verb:?}"),
                Default::default(),
                vec![7_u8; largest as usize - 1_024].into(),
            )
            .await
            .expect("another worker's message is confirmed beside the flood");
    }
    system.start(Component::Ingestion);
    system
        .wait_for("the results stream emptied by ingestion", || async {
            (stream_messages(&system, &s.results_stream()).await == 0).then_some(())
        })
        .await;
    system.finish().await;
}
