//! I3 (commit before acknowledge): a crash between commit and ack converges on redelivery;
//! every message kind delivered twice ends in the same state as once.

use std::sync::atomic::Ordering;

use futures::StreamExt as _;
use messages::WorkerVerb;
use prost::Message as _;
use tests::{Component, TestSystem, findings_payload};

#[tokio::test]
async fn admission_crash_between_commit_and_ack_converges_on_redelivery() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let request = system.request(org, "http://crash.test", &["alpha"]);
    system.admission_crash.store(true, Ordering::SeqCst);
    system
        .publish_request_bytes(org, request.encode_to_vec())
        .await;

    let crashed = system.wait_stopped(Component::Admission).await;
    assert!(crashed.is_err(), "admission crashed by injection");
    assert_eq!(
        system.table_counts().await["scans"],
        1,
        "the transaction committed before the crash"
    );

    system.admission_crash.store(false, Ordering::SeqCst);
    system.start(Component::Admission);
    tests::wait_consumer_idle(
        &system,
        &system.subjects.requests_stream(),
        admission::CONSUMER_NAME,
    )
    .await;
    let counts = system.table_counts().await;
    assert_eq!(counts["scans"], 1, "redelivery converged on the same scan");
    assert_eq!(counts["worker_tasks"], 1);
    system.finish().await;
}

#[tokio::test]
async fn ingestion_crash_between_commit_and_ack_converges_on_redelivery() {
    let system = TestSystem::spawn().await;
    let scan = system.leased_scan(&["alpha"]).await;
    let batch = scan.worker.batch(&scan.lease, 0, &findings_payload(3));
    system.ingestion_crash.store(true, Ordering::SeqCst);
    scan.worker
        .publish_raw(WorkerVerb::Result, batch.encode_to_vec())
        .await;
    assert!(system.wait_stopped(Component::Ingestion).await.is_err());
    let committed = system.table_counts().await;
    assert_eq!(committed["worker_result_batches"], 1);

    // The worker was answered after the commit, before the crash.
    let first = scan.worker.next_ack().await;
    assert!(first.error.is_none() && !first.duplicate, "{first:?}");

    system.ingestion_crash.store(false, Ordering::SeqCst);
    system.start(Component::Ingestion);
    // The redelivered batch is answered as the one accepted before the crash.
    let ack = scan.worker.next_ack().await;
    assert!(ack.error.is_none() && ack.duplicate, "{ack:?}");
    tests::wait_consumer_idle(
        &system,
        &system.subjects.results_stream(),
        ingestion::CONSUMER_NAME,
    )
    .await;
    assert_eq!(system.table_counts().await, committed);
    system.finish().await;
}

#[tokio::test]
async fn every_message_delivered_twice_ends_as_if_delivered_once() {
    let system = TestSystem::spawn().await;
    let org = system.organization().await;
    let worker = system.manual_worker(org, 8).await;

    // hello twice
    assert!(worker.hello(&["alpha", "beta"]).await.error.is_none());
    assert!(worker.hello(&["alpha", "beta"]).await.error.is_none());

    // scan request twice, over both paths
    let request = system.request(org, "http://twice.test", &["alpha", "beta"]);
    system
        .publish_request_bytes(org, request.encode_to_vec())
        .await;
    system
        .publish_request_bytes(org, request.encode_to_vec())
        .await;
    let scan_id = system.submit(&request).await.scan_id;

    // acquire twice with one request id: the same lease
    let request_id = uuid::Uuid::new_v4();
    let first = worker.acquire(request_id, 1, 10_000).await;
    let second = worker.acquire(request_id, 1, 10_000).await;
    assert_eq!(first.leases.len(), 1);
    assert_eq!(
        first.leases[0].lease, second.leases[0].lease,
        "a replayed acquire returns the same lease"
    );
    let lease = first.leases[0].clone();

    // renew twice
    assert!(worker.renew(&lease).await.error.is_none());
    assert!(worker.renew(&lease).await.error.is_none());

    // batch twice, completion twice
    let batch = worker.batch(&lease, 0, &findings_payload(2));
    worker
        .publish_raw(WorkerVerb::Result, batch.encode_to_vec())
        .await;
    worker
        .publish_raw(WorkerVerb::Result, batch.encode_to_vec())
        .await;
    let acks = [worker.next_ack().await, worker.next_ack().await];
    assert!(acks.iter().all(|ack| ack.error.is_none()));
    assert_eq!(acks.iter().filter(|ack| ack.duplicate).count(), 1);
    let completion = worker.completion(&lease, 1).encode_to_vec();
    worker
        .publish_raw(WorkerVerb::Complete, completion.clone())
        .await;
    worker.publish_raw(WorkerVerb::Complete, completion).await;
    let acks = [worker.next_ack().await, worker.next_ack().await];
    assert!(acks.iter().all(|ack| ack.error.is_none()), "{acks:?}");
    assert_eq!(
        acks.iter().filter(|ack| ack.duplicate).count(),
        1,
        "the second completion is answered as a replay: {acks:?}"
    );

    // second plugin: release twice, then fail (non-retryable) twice
    let next = worker.acquire_one().await;
    assert_eq!(next.plugin, "beta");
    assert!(worker.release(&next).await.error.is_none());
    assert!(
        worker.release(&next).await.error.is_none(),
        "a replayed release is answered the same"
    );
    let next = worker.acquire_one().await;
    let failure = worker.failure(&next, "bad_target", false).encode_to_vec();
    worker.publish_raw(WorkerVerb::Fail, failure.clone()).await;
    worker.publish_raw(WorkerVerb::Fail, failure).await;
    let acks = [worker.next_ack().await, worker.next_ack().await];
    assert!(acks.iter().all(|ack| ack.error.is_none()), "{acks:?}");
    assert_eq!(
        acks.iter().filter(|ack| ack.duplicate).count(),
        1,
        "the second failure is answered as a replay: {acks:?}"
    );

    system.wait_scan_state(&scan_id, "failed").await;
    tests::wait_consumer_idle(
        &system,
        &system.subjects.requests_stream(),
        admission::CONSUMER_NAME,
    )
    .await;
    tests::wait_consumer_idle(
        &system,
        &system.subjects.results_stream(),
        ingestion::CONSUMER_NAME,
    )
    .await;
    let counts = system.table_counts().await;
    assert_eq!(counts["scans"], 1);
    assert_eq!(counts["scan_jobs"], 2);
    assert_eq!(counts["worker_tasks"], 2);
    assert_eq!(counts["worker_result_batches"], 1);
    assert_eq!(counts["findings"], 2);
    // attempts: alpha 1, beta released + failed = 3
    assert_eq!(counts["worker_task_attempts"], 3);
    system.wait_outbox_drained().await;
    let events = tests::event_counts(&system).await;
    let count = |name: &str| events.get(name).copied().unwrap_or(0);
    assert_eq!(count("scan.admitted"), 1);
    assert_eq!(count("task.completed"), 1);
    assert_eq!(count("scan.failed"), 1);
    assert_eq!(count("scan.completed"), 0);
    system.finish().await;
}

/// A decision slower than the ack wait is not redelivered: the consumer tells JetStream it is
/// still working on the batch (in-progress acknowledgements every third of the ack wait). The
/// organization's row is held locked for three ack waits, so admission's transaction waits on
/// it; the request is then admitted once and never delivered twice.
#[tokio::test]
async fn a_decision_slower_than_the_ack_wait_is_not_redelivered() {
    const ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
    let system = TestSystem::spawn_with(|settings| {
        settings.admission.consumer.ack_wait = ACK_WAIT;
    })
    .await;
    let org = system.organization().await;
    let mut lock = system.pool.begin().await.expect("transaction");
    sqlx::query("SELECT id FROM organizations WHERE id = $1 FOR UPDATE")
        .bind(org)
        .execute(&mut *lock)
        .await
        .expect("organization locked");
    let request = system.request(org, "http://slow.test", &["alpha"]);
    system
        .publish_request_bytes(org, request.encode_to_vec())
        .await;
    tokio::time::sleep(ACK_WAIT * 3).await;
    lock.commit().await.expect("lock released");

    tests::wait_consumer_idle(
        &system,
        &system.subjects.requests_stream(),
        admission::CONSUMER_NAME,
    )
    .await;
    assert_eq!(system.table_counts().await["scans"], 1);
    let redeliveries = tests::exported("palisade_redeliveries_total{consumer=\"admission\"}")
        .expect("admission's redeliveries are counted");
    assert_eq!(redeliveries, 0.0, "the slow decision was never redelivered");
    system.finish().await;
}

/// Deliveries that lapse without a decision do not end a message: a consumer crashed, frozen
/// or cut off past the ack wait, or a delivery lost with a pull the client dropped, spends one
/// each, and however many lapse the message is delivered again until a decision ends it (with
/// the server counting `max_deliver` it would never be delivered again, and no consumer would
/// see a last delivery to record dead). Here the test takes every delivery from admission's
/// durable consumer while admission is stopped and lets each lapse, one more than
/// `max_deliver`; admission, started again, admits the request once.
#[tokio::test]
async fn a_message_whose_deliveries_all_lapsed_undecided_is_still_decided() {
    const MAX_DELIVER: i64 = 2;
    const ACK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);
    let system = TestSystem::spawn_with(|settings| {
        settings.admission.consumer.max_deliver = MAX_DELIVER;
        settings.admission.consumer.ack_wait = ACK_WAIT;
    })
    .await;
    let org = system.organization().await;
    // Admission creates its consumer as it starts: wait for it before stopping admission (the
    // test reads the consumer itself below).
    tests::wait_consumer_idle(
        &system,
        &system.subjects.requests_stream(),
        admission::CONSUMER_NAME,
    )
    .await;
    system.stop(Component::Admission).await;
    // A pull request the stopped admission left open (for up to half the ack wait) would take
    // the first delivery: publish once none is waiting.
    system
        .wait_for("admission's pull requests to expire", || async {
            let stream = system.subjects.requests_stream();
            let info = tests::consumer_info(&system, &stream, admission::CONSUMER_NAME).await?;
            (info.num_waiting == 0).then_some(())
        })
        .await;
    let request = system.request(org, "http://lapsed.test", &["alpha"]);
    system
        .publish_request_bytes(org, request.encode_to_vec())
        .await;

    let consumer: bus::async_nats::jetstream::consumer::PullConsumer = system
        .bus
        .jetstream()
        .get_stream(system.subjects.requests_stream())
        .await
        .expect("the requests stream")
        .get_consumer(admission::CONSUMER_NAME)
        .await
        .expect("admission's consumer");
    for delivery in 1..=MAX_DELIVER + 1 {
        let mut fetched = consumer
            .fetch()
            .max_messages(1)
            .expires(ACK_WAIT * 3)
            .messages()
            .await
            .expect("a fetch");
        let message = fetched
            .next()
            .await
            .unwrap_or_else(|| panic!("delivery {delivery} never came"))
            .expect("a delivery");
        let info = message.info().expect("a JetStream message");
        assert_eq!(info.delivered, delivery);
        // Never acknowledged: it lapses after the ack wait.
    }

    system.start(Component::Admission);
    system
        .wait_for("the request admitted", || async {
            (system.table_counts().await["scans"] == 1).then_some(())
        })
        .await;
    tests::wait_consumer_idle(
        &system,
        &system.subjects.requests_stream(),
        admission::CONSUMER_NAME,
    )
    .await;
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(&system.pool)
        .await
        .expect("count");
    assert_eq!(dead, 0, "decided, not recorded dead");
    system.finish().await;
}

/// Issue 26, item 3: a message that fails for its own reasons reaches a dead letter. A result
/// batch whose finding the database refuses (here a constraint the test adds, standing in for
/// any row the schema refuses) fails its decision every time; it is redelivered up to
/// `max_deliver`, then recorded in `dead_letters` with its payload and reason and terminated,
/// while a good batch fetched beside it is accepted.
#[tokio::test]
async fn a_message_refused_on_every_delivery_is_recorded_dead_and_not_redelivered() {
    const MAX_DELIVER: i64 = 3;
    let system = TestSystem::spawn_with(|settings| {
        settings.ingestion.consumer.max_deliver = MAX_DELIVER;
    })
    .await;
    sqlx::query(
        "ALTER TABLE findings ADD CONSTRAINT test_refuses_poison CHECK (title <> 'poison')",
    )
    .execute(&system.pool)
    .await
    .expect("constraint added");
    let poisoned = system.leased_scan(&["alpha"]).await;
    let healthy = system.leased_scan(&["alpha"]).await;
    let mut payload = findings_payload(1);
    payload.findings[0].title = "poison".into();
    let poison = poisoned.worker.batch(&poisoned.lease, 0, &payload);
    let bytes = poison.encode_to_vec();
    poisoned
        .worker
        .publish_raw(WorkerVerb::Result, bytes.clone())
        .await;
    let good = healthy
        .worker
        .batch(&healthy.lease, 0, &findings_payload(2));
    let ack = healthy.worker.send_batch(&good).await;
    assert!(ack.error.is_none(), "{ack:?}");

    let (delivered, consumer, reason, stored): (i64, String, String, Vec<u8>) = system
        .wait_for("the dead letter", || async {
            sqlx::query_as("SELECT delivered, consumer, reason, payload FROM dead_letters")
                .fetch_optional(&system.pool)
                .await
                .expect("read")
        })
        .await;
    assert_eq!(delivered, MAX_DELIVER);
    assert_eq!(consumer, ingestion::CONSUMER_NAME);
    assert!(!reason.is_empty());
    assert_eq!(stored, bytes, "the message as it was sent");
    tests::wait_consumer_idle(
        &system,
        &system.subjects.results_stream(),
        ingestion::CONSUMER_NAME,
    )
    .await;
    let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(&system.pool)
        .await
        .expect("count");
    assert_eq!(dead, 1, "terminated: recorded once, not redelivered");
    let batches: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM worker_result_batches WHERE attempt_id = $1::uuid",
    )
    .bind(&poisoned.lease.lease.as_ref().unwrap().attempt_id)
    .fetch_one(&system.pool)
    .await
    .expect("count");
    assert_eq!(batches, 0, "nothing of it was written");
    system.finish().await;
}

/// A message its handler panics on is a message failing for reasons of its own: retried,
/// then recorded dead on its last delivery, while the messages fetched in the same batch are
/// decided and the consumer keeps running. (With no delivery limit on the server, a panic
/// that ended the consumer would crash its service on every delivery for ever.)
#[tokio::test]
async fn a_message_its_handler_panics_on_is_recorded_dead_and_the_rest_decided() {
    use std::sync::{Arc, Mutex};

    use bus::consume::{BatchHandler, ConsumerSpec, Decision, Delivery};

    /// Acknowledges every message but `poison`, on which it panics; remembers both.
    #[derive(Default)]
    struct Panicky {
        decided: Mutex<Vec<String>>,
        dead: Mutex<Vec<(String, i64, String)>>,
    }

    impl BatchHandler for Panicky {
        fn handle(
            &self,
            batch: &[Delivery],
        ) -> impl std::future::Future<Output = Vec<Decision>> + Send {
            let payloads: Vec<String> = batch
                .iter()
                .map(|delivery| String::from_utf8_lossy(delivery.payload()).into_owned())
                .collect();
            async move {
                assert!(
                    !payloads.iter().any(|payload| payload == "poison"),
                    "a handler's bug, on one message"
                );
                let decisions = vec![Decision::Ack; payloads.len()];
                self.decided.lock().unwrap().extend(payloads);
                decisions
            }
        }

        fn dead_letter(
            &self,
            delivery: &Delivery,
            reason: &str,
        ) -> impl std::future::Future<Output = Result<(), String>> + Send {
            self.dead.lock().unwrap().push((
                String::from_utf8_lossy(delivery.payload()).into_owned(),
                delivery.delivered,
                reason.to_owned(),
            ));
            async { Ok(()) }
        }
    }

    const MAX_DELIVER: i64 = 2;
    let server = tests::servers::NatsServer::start().await;
    let subjects = messages::Subjects::new("panicky").expect("valid prefix");
    let bus = tests::servers::operator_bus(&server.url(), subjects).await;
    let jetstream = bus.jetstream();
    jetstream
        .create_stream(bus::async_nats::jetstream::stream::Config {
            name: "PANICKY".into(),
            subjects: vec!["panicky.>".into()],
            ..Default::default()
        })
        .await
        .expect("a stream");
    for payload in ["first", "poison", "last"] {
        jetstream
            .publish("panicky.message", payload.into())
            .await
            .expect("published")
            .await
            .expect("confirmed");
    }

    let mut spec = ConsumerSpec::new("PANICKY".into(), "panicky", "panicky.>".into());
    spec.max_deliver = MAX_DELIVER;
    spec.ack_wait = std::time::Duration::from_secs(1);
    spec.retry_delay_base = std::time::Duration::from_millis(50);
    let handler = Arc::new(Panicky::default());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let consumer = tokio::spawn({
        let (bus, handler, shutdown) = (bus.clone(), handler.clone(), shutdown.clone());
        async move { bus::consume::run(&bus, spec, handler, shutdown).await }
    });

    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(20);
    while handler.dead.lock().unwrap().is_empty() {
        assert!(
            !consumer.is_finished(),
            "the consumer ended: {:?}",
            consumer.await
        );
        assert!(
            tokio::time::Instant::now() < deadline,
            "no dead letter within 20 s"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let dead = handler.dead.lock().unwrap().clone();
    assert_eq!(dead.len(), 1, "{dead:?}");
    let (payload, delivered, reason) = &dead[0];
    assert_eq!(
        (payload.as_str(), *delivered),
        ("poison", MAX_DELIVER),
        "recorded dead on its last delivery"
    );
    assert!(reason.contains("panicked"), "{reason}");
    let mut decided = handler.decided.lock().unwrap().clone();
    decided.sort();
    decided.dedup();
    assert_eq!(decided, ["first", "last"], "the rest of its batch decided");
    assert!(!consumer.is_finished(), "the consumer keeps running");
    shutdown.cancel();
    consumer
        .await
        .expect("no panic escaped")
        .expect("stopped cleanly");
}

/// Acknowledges every message, slowly; keeps which it decided and counts redeliveries.
#[derive(Default)]
struct Slow {
    decided: std::sync::Mutex<std::collections::BTreeSet<Vec<u8>>>,
    again: std::sync::atomic::AtomicUsize,
    /// Deliveries of a message handled before: delivered again although a decision was made
    /// (or was being made) here.
    duplicates: std::sync::atomic::AtomicUsize,
}

impl bus::consume::BatchHandler for Slow {
    fn handle(
        &self,
        batch: &[bus::consume::Delivery],
    ) -> impl std::future::Future<Output = Vec<bus::consume::Decision>> + Send {
        let again = batch
            .iter()
            .filter(|delivery| delivery.is_redelivery())
            .count();
        self.again
            .fetch_add(again, std::sync::atomic::Ordering::SeqCst);
        let mut decided = self.decided.lock().unwrap();
        let duplicates = batch
            .iter()
            .filter(|delivery| !decided.insert(delivery.payload().to_vec()))
            .count();
        drop(decided);
        self.duplicates
            .fetch_add(duplicates, std::sync::atomic::Ordering::SeqCst);
        let decisions = vec![bus::consume::Decision::Ack; batch.len()];
        async move {
            tokio::time::sleep(std::time::Duration::from_millis(200)).await;
            decisions
        }
    }
}

/// Stalled links: a backlog of `BACKLOG` messages consumed in pull requests of
/// `STALL_BATCH`, the link stalled by `stall` while it is consumed and resumed by `resume`
/// after `stalled_for`; every message is decided.
const STALL_BATCH: usize = 20;
const BACKLOG: usize = 1_000;

/// What a stall cost: messages delivered again, those of them handled here before, and
/// whether the client gave up its connection for a new one.
#[derive(Debug)]
struct StallCost {
    again: usize,
    duplicates: usize,
    reconnected: bool,
}

async fn delivered_again_after_a_stall(
    url: &str,
    stall: impl FnOnce(),
    stalled_for: std::time::Duration,
    resume: impl FnOnce(),
) -> StallCost {
    use std::sync::Arc;
    use std::sync::atomic::Ordering;

    let subjects = messages::Subjects::new("stalled").expect("valid prefix");
    let bus = tests::servers::operator_bus(url, subjects).await;
    let jetstream = bus.jetstream();
    jetstream
        .create_stream(bus::async_nats::jetstream::stream::Config {
            name: "STALLED".into(),
            subjects: vec!["stalled.>".into()],
            ..Default::default()
        })
        .await
        .expect("a stream");
    for index in 0..BACKLOG {
        jetstream
            .publish("stalled.message", index.to_string().into())
            .await
            .expect("published")
            .await
            .expect("confirmed");
    }
    let mut spec = bus::consume::ConsumerSpec::new("STALLED".into(), "stalled", "stalled.>".into());
    spec.ack_wait = std::time::Duration::from_secs(2);
    spec.batch_size = STALL_BATCH;
    spec.batches_in_flight = 1;
    let handler = Arc::new(Slow::default());
    let shutdown = tokio_util::sync::CancellationToken::new();
    let consumer = tokio::spawn({
        let (bus, handler, shutdown) = (bus.clone(), handler.clone(), shutdown.clone());
        async move { bus::consume::run(&bus, spec, handler, shutdown).await }
    });
    let decided = || handler.decided.lock().unwrap().len();
    let wait_until = async |what: &str, done: &dyn Fn() -> bool| {
        let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(120);
        while !done() {
            assert!(tokio::time::Instant::now() < deadline, "{what}: timed out");
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    };
    wait_until("a few batches decided", &|| decided() >= 3 * STALL_BATCH).await;
    stall();
    tokio::time::sleep(stalled_for).await;
    resume();
    wait_until("the backlog decided", &|| decided() >= BACKLOG).await;
    // What a stranded pull request took comes back one ack wait later: counted once the
    // server holds nothing undelivered or unacknowledged.
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let info = jetstream
            .get_stream("STALLED")
            .await
            .expect("the stream")
            .consumer_info("stalled")
            .await
            .expect("the consumer");
        if info.num_pending == 0 && info.num_ack_pending == 0 {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "still {} pending, {} unacknowledged",
            info.num_pending,
            info.num_ack_pending
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert_eq!(decided(), BACKLOG, "every message decided");
    shutdown.cancel();
    consumer
        .await
        .expect("no panic escaped")
        .expect("stopped cleanly");
    StallCost {
        again: handler.again.load(Ordering::SeqCst),
        duplicates: handler.duplicates.load(Ordering::SeqCst),
        reconnected: bus.client().statistics().connects.load(Ordering::Relaxed) > 1,
    }
}

/// Issue 48, item 7: a link to NATS that stalls (here the server frozen: its kernel still
/// takes what the consumer writes, and hands it over on resumption) costs no delivery, whether
/// the stall is short enough for the client to keep its connection (5 s) or long enough for it
/// to give the connection up for a new one (15 s, past its three unanswered pings). Before,
/// the consumer gave up its pull requests one after another during the stall, and on
/// resumption JetStream delivered into the one still open when the consumer abandoned the
/// connection: a batch decided one ack wait later, a delivery spent each. Every request given
/// up is counted, so redeliveries that follow can be placed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_link_costs_no_delivery() {
    for (stalled_for, reconnects) in [(5, false), (15, true)] {
        let server = tests::servers::NatsServer::start().await;
        let cost = delivered_again_after_a_stall(
            &server.url(),
            || server.pause(),
            std::time::Duration::from_secs(stalled_for),
            || server.resume(),
        )
        .await;
        eprintln!("server frozen {stalled_for} s: {cost:?}");
        assert_eq!(
            cost.reconnected, reconnects,
            "a {stalled_for} s stall and the client's connection"
        );
        assert_eq!(
            cost.again, 0,
            "{} messages delivered again after a {stalled_for} s stall",
            cost.again
        );
    }
    // Accounted for: the pull requests the consumer gave up are counted, so the redeliveries
    // that follow them can be placed.
    let abandoned = tests::exported("palisade_pull_requests_abandoned_total{consumer=\"stalled\"}")
        .expect("the consumer's abandoned pull requests are counted");
    assert!(abandoned >= 2.0, "{abandoned} pull requests abandoned");
}

/// Issue 48, item 7: a link that stalls in both directions (the server's host isolated 25 s,
/// every connection open and silent, then resumed) delivers nothing again that was decided or
/// being decided here, with the server's default pings (2 minutes: the server keeps the
/// connection, and reads what the client wrote into it once the link resumes), with the
/// recommended ones (5 s, 2: the server closes the silent connection first, and what the
/// client wrote into it is lost, the acknowledgements of the batches decided during the stall
/// included). All it may cost is what the server wrote into the link the instant it stalled,
/// which the client never received and no client can get back: at most one pull request's
/// worth. Before: 20 and 40 delivered again (the stranded pull request, the lost
/// acknowledgements); now 0 in every run so far. (Not covered: a message still undecided when
/// the link resumes, its ack wait lapsed during the stall, is delivered again: the server
/// queued it for redelivery then. See `bus::consume::unconfirmed`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_link_stalled_both_ways_costs_at_most_what_it_swallowed() {
    let counter =
        |name: &str| tests::exported(&format!("{name}{{consumer=\"stalled\"}}")).unwrap_or(0.0);
    for pings in ["", "ping_interval: \"5s\"\nping_max: 2\n"] {
        let mut network = tests::netns::Network::create().expect("network namespaces");
        // An address of this process's on the bridge, to reach the host from.
        let _ = network.server_address();
        let host = network.host("nats");
        let dir = tempfile::tempdir().expect("a directory");
        let config = dir.path().join("nats.conf");
        std::fs::write(
            &config,
            format!(
                "listen: \"{}:4222\"\njetstream {{ store_dir: \"{}\" }}\n{pings}",
                host.address,
                dir.path().join("js").display()
            ),
        )
        .expect("a config");
        let (program, args) = host.wrap(
            &tests::servers::nats_server_binary(),
            &["-c".to_owned(), config.display().to_string()],
        );
        let mut server = tokio::process::Command::new(program)
            .args(args)
            .kill_on_drop(true)
            .spawn()
            .expect("nats-server started");
        let url = format!("nats://{}:4222", host.address);
        for _ in 0..100 {
            if tokio::net::TcpStream::connect((host.address, 4222))
                .await
                .is_ok()
            {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        let resent_before = counter("palisade_acknowledgements_resent_total");
        let cost = delivered_again_after_a_stall(
            &url,
            || network.isolate(&host),
            std::time::Duration::from_secs(25),
            || network.rejoin(&host),
        )
        .await;
        let pings = if pings.is_empty() {
            "default"
        } else {
            "5 s, 2"
        };
        let resent = counter("palisade_acknowledgements_resent_total") - resent_before;
        eprintln!("server pings {pings}: {cost:?}, {resent} acknowledgements sent again");
        assert!(
            cost.reconnected,
            "server pings {pings}: the connection replaced"
        );
        assert!(
            resent > 0.0,
            "server pings {pings}: the acknowledgements written into the stalled link sent again"
        );
        assert_eq!(
            cost.duplicates, 0,
            "server pings {pings}: messages decided or being decided here delivered again"
        );
        assert!(
            cost.again <= STALL_BATCH,
            "server pings {pings}: {} messages delivered again, more than one pull request \
             (of {STALL_BATCH}) the link could have swallowed",
            cost.again
        );
        let _ = server.kill().await;
    }
}
