//! A tenant's events through the `events` verb (issue 23): a client reads its organization's
//! `scan.*` events from a cursor, each once and none skipped, across requests and long-polls
//! (woken by the organization's next event, not by the recheck); never another organization's
//! or the services' `task.*` events; `from_now` starts at the stream's end; a request whose
//! fields disagree with its subject is refused.

use std::time::{Duration, Instant};

use messages::{ClientVerb, ErrorCode, v1};
use prost::Message as _;
use tests::TestSystem;
use uuid::Uuid;

/// One `events` request of the test client, as sent on the wire.
fn request(organization_id: Uuid, after_sequence: u64, max_events: u32) -> v1::EventsRequest {
    v1::EventsRequest {
        schema_version: messages::SCHEMA_VERSION,
        organization_id: organization_id.to_string(),
        client_id: tests::TEST_CLIENT_ID.to_owned(),
        after_sequence,
        from_now: false,
        max_events,
        wait_ms: 0,
    }
}

/// `metric` as this process exports it.
fn exported(metric: &str) -> f64 {
    tests::exported(metric).unwrap_or_else(|| panic!("ingestion exports {metric}"))
}

/// The long-polls ingestion holds waiting for their organization's next event.
fn events_requests_waiting() -> f64 {
    exported("palisade_events_requests_waiting")
}

/// Sends `request` on `subject_organization`'s events subject of the test client.
async fn ask_on(
    system: &TestSystem,
    subject_organization: Uuid,
    request: &v1::EventsRequest,
) -> v1::EventsReply {
    let subject = system
        .subjects
        .client(
            &subject_organization,
            tests::TEST_CLIENT_ID,
            ClientVerb::Events,
        )
        .unwrap();
    let timeout = Duration::from_millis(u64::from(request.wait_ms)) + Duration::from_secs(10);
    let reply = system
        .bus
        .request(subject, request.encode_to_vec().into(), timeout)
        .await
        .expect("ingestion answers");
    v1::EventsReply::decode(reply.payload.as_ref()).expect("an EventsReply")
}

async fn ask(system: &TestSystem, request: &v1::EventsRequest) -> v1::EventsReply {
    let organization_id = request.organization_id.parse().unwrap();
    let reply = ask_on(system, organization_id, request).await;
    assert!(reply.error.is_none(), "{reply:?}");
    assert!(reply.cursor >= request.after_sequence, "{reply:?}");
    reply
}

/// The stream's end for `organization_id`: where a client that starts now begins. Asked
/// until ingestion answers (it subscribes as it starts).
async fn now(system: &TestSystem, organization_id: Uuid) -> u64 {
    let client = system.client();
    let reply = system
        .wait_for("ingestion to answer events requests", || {
            let client = client.clone();
            async move {
                client
                    .events(&organization_id, 0, true, Duration::ZERO)
                    .await
                    .ok()
            }
        })
        .await;
    assert!(
        reply.error.is_none() && reply.events.is_empty(),
        "{reply:?}"
    );
    reply.cursor
}

/// Names and sequences of `events`.
fn names(events: &[v1::TenantEvent]) -> Vec<&str> {
    events.iter().map(|event| event.name.as_str()).collect()
}

#[tokio::test]
async fn a_client_reads_its_events_once_each_in_order_across_requests_and_a_woken_long_poll() {
    let system = TestSystem::spawn().await;
    let organization = system.organization().await;
    let start = now(&system, organization).await;
    let worker = system.manual_worker(organization, 4).await;
    assert!(worker.hello(&["alpha"]).await.error.is_none());
    let first = system
        .submit(&system.request(organization, "http://one.test", &["alpha"]))
        .await;
    let lease = worker.acquire_one().await;
    assert!(worker.complete(&lease, 0).await.error.is_none());
    system.wait_scan_state(&first.scan_id, "completed").await;
    system.wait_outbox_drained().await;

    // One event per request, each from the previous cursor: admitted, completed, then nothing.
    let mut cursor = start;
    let mut read = Vec::new();
    for _ in 0..2 {
        let reply = ask(&system, &request(organization, cursor, 1)).await;
        assert_eq!(reply.events.len(), 1, "{reply:?}");
        assert_eq!(reply.cursor, reply.events[0].sequence);
        cursor = reply.cursor;
        read.extend(reply.events);
    }
    assert_eq!(names(&read), ["scan.admitted", "scan.completed"]);
    assert!(read[0].sequence < read[1].sequence);
    let admitted = v1::ScanAdmitted::decode(read[0].payload.as_slice()).unwrap();
    let completed = v1::ScanCompleted::decode(read[1].payload.as_slice()).unwrap();
    assert_eq!(
        (admitted.scan_id.as_str(), completed.scan_id.as_str()),
        (first.scan_id.as_str(), first.scan_id.as_str())
    );
    // Each as stored: its bytes and its traceparent header.
    let stream = tests::events_stream(&system).await;
    for event in &read {
        let stored = stream.get_raw_message(event.sequence).await.unwrap();
        assert_eq!(stored.payload.as_ref(), event.payload.as_slice());
        let traceparent = stored
            .headers
            .get("traceparent")
            .map(|value| value.as_str());
        assert_eq!(traceparent.unwrap_or_default(), event.trace_parent);
    }
    // The same events in one request, and nothing after them: the cursor moves to where the
    // scan went (task.* events of the services lie beyond), never back.
    let whole = ask(&system, &request(organization, start, 0)).await;
    assert_eq!(whole.events, read);
    let rest = ask(&system, &request(organization, cursor, 0)).await;
    assert!(rest.events.is_empty(), "{rest:?}");
    assert!(rest.cursor >= cursor);
    cursor = rest.cursor;

    // A long-poll with nothing to read answers empty after its wait, with the cursor.
    let waited = Instant::now();
    let quiet = ask(
        &system,
        &v1::EventsRequest {
            wait_ms: 300,
            ..request(organization, cursor, 0)
        },
    )
    .await;
    assert!(quiet.events.is_empty(), "{quiet:?}");
    assert!(waited.elapsed() >= Duration::from_millis(300));
    assert_eq!(quiet.cursor, cursor);

    // A long-poll waiting when the next event is published answers with it once the event
    // woke it, not at a recheck. The event is published only once ingestion holds the request
    // waiting, having read nothing.
    let found_by_recheck = exported("palisade_events_found_by_recheck_total");
    let poll = {
        let (bus, subjects) = (system.bus.clone(), system.subjects.clone());
        let request = v1::EventsRequest {
            wait_ms: 20_000,
            ..request(organization, cursor, 0)
        };
        tokio::spawn(async move {
            let subject = subjects
                .client(&organization, tests::TEST_CLIENT_ID, ClientVerb::Events)
                .unwrap();
            let asked = Instant::now();
            let reply = bus
                .request(
                    subject,
                    request.encode_to_vec().into(),
                    Duration::from_secs(30),
                )
                .await
                .expect("ingestion answers");
            (
                asked.elapsed(),
                v1::EventsReply::decode(reply.payload.as_ref()).unwrap(),
            )
        })
    };
    system
        .wait_for("the long-poll to wait in ingestion", || async {
            (events_requests_waiting() == 1.0).then_some(())
        })
        .await;
    let second = system
        .submit(&system.request(organization, "http://two.test", &["alpha"]))
        .await;
    let (elapsed, woken) = poll.await.unwrap();
    assert!(woken.error.is_none(), "{woken:?}");
    assert_eq!(names(&woken.events), ["scan.admitted"], "{woken:?}");
    let admitted = v1::ScanAdmitted::decode(woken.events[0].payload.as_slice()).unwrap();
    assert_eq!(admitted.scan_id, second.scan_id);
    assert!(woken.events[0].sequence > cursor);
    assert_eq!(
        exported("palisade_events_found_by_recheck_total"),
        found_by_recheck,
        "the long-poll answered after {elapsed:?} by its recheck: not woken by the event"
    );

    // Every event of the organization was read exactly once, in stream order.
    let mut all = read;
    all.extend(woken.events);
    let everything = ask(&system, &request(organization, start, 0)).await;
    assert_eq!(everything.events, all);
    system.finish().await;
}

#[tokio::test]
async fn another_organizations_events_and_task_events_are_never_read_and_a_foreign_subject_is_refused()
 {
    let system = TestSystem::spawn().await;
    // The test's own stream, from its start.
    let start = now(&system, Uuid::now_v7()).await;
    assert_eq!(start, 0);
    // Two organizations' scans, each admitted, leased and completed: task.* events for both.
    let ours = system.leased_scan(&["alpha"]).await;
    let theirs = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&ours, 1).await;
    system.complete_with_findings(&theirs, 1).await;
    let counts = tests::event_counts(&system).await;
    assert!(
        counts.keys().any(|name| name.starts_with("task.")),
        "the stream holds task events: {counts:?}"
    );

    let reply = ask(&system, &request(ours.organization_id, start, 0)).await;
    assert_eq!(names(&reply.events), ["scan.admitted", "scan.completed"]);
    for event in &reply.events {
        let organization_id = match event.name.as_str() {
            "scan.admitted" => {
                v1::ScanAdmitted::decode(event.payload.as_slice())
                    .unwrap()
                    .organization_id
            }
            _ => {
                v1::ScanCompleted::decode(event.payload.as_slice())
                    .unwrap()
                    .organization_id
            }
        };
        assert_eq!(organization_id, ours.organization_id.to_string());
    }
    let theirs_read = ask(&system, &request(theirs.organization_id, start, 0)).await;
    assert_eq!(
        names(&theirs_read.events),
        ["scan.admitted", "scan.completed"]
    );
    assert!(
        theirs_read
            .events
            .iter()
            .all(|event| !reply.events.contains(event))
    );

    // Fields that disagree with the subject, and out-of-bounds reads, are refused.
    let refused = |reply: v1::EventsReply| reply.error.and_then(|error| error.error_code());
    let asks_for_theirs = request(theirs.organization_id, start, 0);
    assert_eq!(
        refused(ask_on(&system, ours.organization_id, &asks_for_theirs).await),
        Some(ErrorCode::InvalidField)
    );
    let as_another_client = v1::EventsRequest {
        client_id: "someone-else".into(),
        ..request(ours.organization_id, start, 0)
    };
    assert_eq!(
        refused(ask_on(&system, ours.organization_id, &as_another_client).await),
        Some(ErrorCode::InvalidField)
    );
    let too_many = request(
        ours.organization_id,
        start,
        messages::limits::EVENTS_PER_REPLY_MAX + 1,
    );
    assert_eq!(
        refused(ask_on(&system, ours.organization_id, &too_many).await),
        Some(ErrorCode::InvalidField)
    );
    let subject = system
        .subjects
        .client(
            &ours.organization_id,
            tests::TEST_CLIENT_ID,
            ClientVerb::Events,
        )
        .unwrap();
    let garbage = system
        .bus
        .request(subject, vec![0xff, 0xff].into(), Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(
        refused(v1::EventsReply::decode(garbage.payload.as_ref()).unwrap()),
        Some(ErrorCode::MalformedMessage)
    );
    system.finish().await;
}

#[tokio::test]
async fn from_now_then_one_event_reads_exactly_that_event() {
    let system = TestSystem::spawn().await;
    let earlier = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&earlier, 0).await;
    let organization = earlier.organization_id;

    let start = now(&system, organization).await;
    assert!(
        start > 0,
        "the organization's earlier events are in the stream"
    );
    let later = system
        .submit(&system.request(organization, "http://later.test", &["alpha"]))
        .await;
    let reply = ask(
        &system,
        &v1::EventsRequest {
            wait_ms: 10_000,
            ..request(organization, start, 0)
        },
    )
    .await;
    assert_eq!(names(&reply.events), ["scan.admitted"], "{reply:?}");
    let admitted = v1::ScanAdmitted::decode(reply.events[0].payload.as_slice()).unwrap();
    assert_eq!(admitted.scan_id, later.scan_id);
    let after = ask(&system, &request(organization, reply.cursor, 0)).await;
    assert!(after.events.is_empty(), "{after:?}");
    system.finish().await;
}

#[tokio::test]
async fn outcomes_follow_the_organization_from_now_through_the_events_verb() {
    use futures::StreamExt as _;
    let system = TestSystem::spawn().await;
    let earlier = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&earlier, 0).await;
    let organization = earlier.organization_id;
    let mut outcomes = Box::pin(system.client().outcomes(&organization).await.unwrap());

    // The earlier scan's completion is before "now"; the next scan's cancellation follows.
    let scan = system
        .submit(&system.request(organization, "http://next.test", &["alpha"]))
        .await;
    system
        .client()
        .cancel_scan(&organization, &scan.scan_id, "enough")
        .await
        .unwrap();
    let outcome = tokio::time::timeout(tests::WAIT_MAX, outcomes.next())
        .await
        .expect("the outcome arrives")
        .expect("a stream");
    assert!(
        matches!(&outcome, client::Outcome::Cancelled(event) if event.scan_id == scan.scan_id),
        "{outcome:?}"
    );
    system.finish().await;
}

/// A page is one request however many events it holds: a batched direct get, where reading
/// message by message took one `MSG.GET` per event, one for the end and one `STREAM.INFO`
/// (32 for the 30 events here). Read with ingestion's own credentials, so its permissions
/// allow it.
#[tokio::test]
async fn a_page_of_events_is_read_in_one_request() {
    const EVENTS: usize = 30;
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let client = system.client();
    for index in 0..EVENTS {
        let scan = system.request(
            organization_id,
            &format!("http://page-{index}.test"),
            &["alpha"],
        );
        client.publish(&scan).await.expect("request confirmed");
    }
    let all = system
        .wait_for("every scan.admitted on the stream", || async {
            let reply = ask(&system, &request(organization_id, 0, 64)).await;
            (reply.events.len() >= EVENTS).then_some(reply)
        })
        .await;

    let ingestion = system
        .nats
        .connect(&messages::Identity::Service(messages::Service::Ingestion))
        .await;
    let sent = || {
        ingestion
            .client()
            .statistics()
            .out_messages
            .load(std::sync::atomic::Ordering::Relaxed)
    };
    let before = sent();
    let page = ingestion
        .tenant_events_page(
            &organization_id,
            0,
            bus::events::PageBounds {
                events_max: 64,
                bytes_max: messages::limits::EVENTS_REPLY_BYTES_MAX,
            },
        )
        .await
        .expect("a page");
    let requests = sent() - before;
    assert_eq!(page.events, all.events);
    assert_eq!(page.cursor, all.cursor);
    assert_eq!(
        requests, 1,
        "{requests} requests for a page of {EVENTS} events"
    );
    system.finish().await;
}

/// Ingestion running with credentials issued before it could publish direct gets (an upgrade
/// that kept them): its first batched read is refused and unanswered, the page is read message
/// by message within the batch's timeout, and the reads that follow do not try again.
#[tokio::test]
async fn credentials_without_direct_gets_read_message_by_message_and_stop_trying() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let client = system.client();
    for index in 0..3 {
        let scan = system.request(
            organization_id,
            &format!("http://old-{index}.test"),
            &["alpha"],
        );
        client.publish(&scan).await.expect("request confirmed");
    }
    let all = system
        .wait_for("every scan.admitted on the stream", || async {
            let reply = ask(&system, &request(organization_id, 0, 64)).await;
            (reply.events.len() >= 3).then_some(reply)
        })
        .await;

    let authority = system.nats.authority.clone().expect("a secured server");
    let identity = messages::Identity::Service(messages::Service::Ingestion);
    let mut permissions = system.subjects.permissions(&identity);
    permissions
        .publish
        .retain(|subject| !subject.contains("DIRECT.GET"));
    let credentials = authority.issue_with("ingestion-before-direct-gets", &permissions);
    let old = bus::Bus::connect(
        system.nats.url(),
        &bus::NatsCredentials::from_creds(credentials.file.as_str()),
        &bus::NatsTls::default(),
        system.subjects.clone(),
        &identity,
    )
    .await
    .expect("ingestion connects with its old credentials");
    let bounds = bus::events::PageBounds {
        events_max: 64,
        bytes_max: messages::limits::EVENTS_REPLY_BYTES_MAX,
    };
    let started = Instant::now();
    let first = old
        .tenant_events_page(&organization_id, 0, bounds)
        .await
        .expect("a page");
    assert_eq!(
        (first.events, first.cursor),
        (all.events.clone(), all.cursor)
    );
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let started = Instant::now();
    let second = old
        .tenant_events_page(&organization_id, 0, bounds)
        .await
        .expect("a page");
    assert_eq!(second.events, all.events);
    assert!(
        started.elapsed() < Duration::from_millis(500),
        "the second read tried the batch again: {:?}",
        started.elapsed()
    );
    system.finish().await;
}
