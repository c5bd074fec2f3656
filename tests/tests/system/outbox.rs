//! How events leave the outbox: published by the service that committed them, right after its
//! commit; published by a relay's poll only when their committer did not (it crashed between
//! commit and publish); removed from the table once published, a row published in part keeping
//! only the rest; rows an older build wrote published too; and the progress events left out
//! when an operator turns them off.

use std::collections::BTreeMap;

use store::ProgressEvents;
use store::admit::{self, AdmitOutcome};
use tests::TestSystem;

use crate::admit::Requests;

/// Events per name on the scan's stream, by the short name (`scan.admitted`).
async fn events_by_name(system: &TestSystem) -> BTreeMap<String, usize> {
    tests::event_counts(system).await
}

/// The rows still in the outbox (not yet published) as (subject suffix, times a poll claimed
/// it).
async fn outbox_rows(system: &TestSystem) -> Vec<(String, i32)> {
    store::testing::unpublished_events(&system.pool)
        .await
        .expect("outbox rows")
        .into_iter()
        .map(|(event, attempts)| {
            let name = event.subject.split_once(".event.").map(|(_, name)| name);
            (name.unwrap_or_default().to_owned(), attempts)
        })
        .collect()
}

#[tokio::test]
async fn committed_events_are_published_by_their_committer_not_by_a_poll() {
    let system = TestSystem::spawn().await;
    let started = std::time::Instant::now();
    let scan = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&scan, 1).await;

    // A poll takes a staged row only once its hand-off lapsed: gone before that, every row
    // was published by its committer, and removed once published.
    system.wait_outbox_drained().await;
    assert!(
        started.elapsed() < store::outbox::HANDOFF,
        "the events waited for a poll: {:?}",
        started.elapsed()
    );
    assert_eq!(outbox_rows(&system).await, [], "published rows are removed");
    let events = events_by_name(&system).await;
    for name in [
        "scan.admitted",
        "task.ready",
        "task.leased",
        "task.completed",
        "scan.completed",
    ] {
        assert_eq!(events.get(name), Some(&1), "{name}: {events:?}");
    }
    system.finish().await;
}

#[tokio::test]
async fn an_event_its_committer_never_published_goes_out_once_its_hand_off_lapses() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let requests = Requests::new(&[system.request(organization_id, "http://a.test", &["alpha"])]);
    let params = requests.params();

    // Commit, then "crash": the staged events are dropped instead of handed off.
    let mut tx = system.pool.begin().await.expect("begin");
    let mut staged = store::Staged::default();
    let outcomes = admit::decide(&mut tx, &mut staged, &system.subjects, &params)
        .await
        .expect("decided");
    tx.commit().await.expect("commit");
    assert!(matches!(outcomes[0], AdmitOutcome::Admitted { .. }));
    assert_eq!(staged.len(), 2, "scan.admitted and task.ready were staged");
    drop(staged);

    // A poll leaves a row alone while its committer may still publish it.
    let poll = outbox::Relay::new(system.pool.clone(), system.bus.clone(), Default::default());
    let outcome = poll.run_once().await.expect("a poll");
    assert_eq!(outcome.published, 0, "{outcome:?}");
    let rows = outbox_rows(&system).await;
    assert_eq!(rows.len(), 2, "both events wait unpublished: {rows:?}");
    assert_eq!(
        store::testing::count_rows(&system.pool, "outbox_batches")
            .await
            .expect("count"),
        1,
        "the decision's events are one row"
    );
    assert!(events_by_name(&system).await.is_empty());

    // Once the hand-off lapses, a poll publishes them, once.
    store::testing::lapse_outbox_hand_offs(&system.pool)
        .await
        .expect("lapse");
    system.wait_outbox_drained().await;
    assert_eq!(outbox_rows(&system).await, [], "published rows are removed");
    let events = events_by_name(&system).await;
    assert_eq!(events.get("scan.admitted"), Some(&1), "{events:?}");
    assert_eq!(events.get("task.ready"), Some(&1), "{events:?}");
    system.finish().await;
}

/// A row whose events were published in part goes back to the poll without the events the
/// stream acknowledged: they are never published again, however long the rest waits (past the
/// stream's duplicate window a second copy would be a second event).
#[tokio::test]
async fn a_row_published_in_part_keeps_only_what_the_stream_did_not_take() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let delivered = store::OutboxEvent::for_tenant(
        &system.subjects,
        &organization_id,
        messages::EventKind::ScanCompleted,
        b"taken".to_vec(),
    );
    // No stream captures this subject: its publish is refused, every time.
    let mut refused = delivered.clone();
    refused.id = uuid::Uuid::now_v7();
    refused.subject = format!("{}.nowhere", system.subjects.prefix());
    let mut conn = system.pool.acquire().await.expect("a connection");
    store::outbox::enqueue(&mut conn, &[delivered.clone(), refused.clone()])
        .await
        .expect("enqueued");
    drop(conn);

    // The services' relays poll it: one event goes out, the other stays, alone in its row.
    system
        .wait_for("the row to keep only the refused event", || async {
            let rows = store::testing::unpublished_events(&system.pool)
                .await
                .expect("outbox rows");
            let ids: Vec<_> = rows.iter().map(|(event, _)| event.id).collect();
            (ids == [refused.id]).then_some(())
        })
        .await;
    let taken_once = || async {
        tests::published_events(&system)
            .await
            .iter()
            .filter(|event| event.id == delivered.id)
            .count()
    };
    assert_eq!(taken_once().await, 1);
    // Polls go on failing the rest; the event taken is not sent again.
    system
        .wait_for("two more polls of the row", || async {
            let rows = store::testing::unpublished_events(&system.pool)
                .await
                .expect("outbox rows");
            (rows.first().is_some_and(|(_, attempts)| *attempts >= 3)).then_some(())
        })
        .await;
    let mut stream = tests::events_stream(&system).await;
    let info = stream.info().await.expect("stream info");
    assert_eq!(
        info.state.messages, 1,
        "the acknowledged event was published once: {info:?}"
    );
    assert_eq!(taken_once().await, 1);
    system.finish().await;
}

/// A row an older build wrote to the one-event-per-row `outbox` table during a rollout is
/// published by this build's relays and removed, like a batch row.
#[tokio::test]
async fn an_event_an_older_build_wrote_is_published_once() {
    let system = TestSystem::spawn().await;
    let organization_id = system.organization().await;
    let event = store::OutboxEvent::for_tenant(
        &system.subjects,
        &organization_id,
        messages::EventKind::ScanCompleted,
        b"written by an older build".to_vec(),
    );
    sqlx::query("INSERT INTO outbox (id, subject, payload) VALUES ($1, $2, $3)")
        .bind(event.id)
        .bind(&event.subject)
        .bind(&event.payload)
        .execute(&system.pool)
        .await
        .expect("a row as an older build writes it");

    system.wait_outbox_drained().await;
    assert_eq!(
        store::testing::count_rows(&system.pool, "outbox")
            .await
            .expect("count"),
        0,
        "the published row is removed"
    );
    let published = tests::published_events(&system).await;
    assert_eq!(
        published
            .iter()
            .filter(|published| published.id == event.id)
            .map(|published| published.payload.as_slice())
            .collect::<Vec<_>>(),
        [event.payload.as_slice()],
        "published once, under its row id"
    );
    system.finish().await;
}

#[tokio::test]
async fn progress_events_can_be_turned_off_and_outcomes_still_go_out() {
    let system = TestSystem::spawn_with(|settings| {
        settings.admission.common.progress_events = ProgressEvents::Off;
        settings.dispatch.common.progress_events = ProgressEvents::Off;
        settings.ingestion.common.progress_events = ProgressEvents::Off;
    })
    .await;
    let scan = system.leased_scan(&["alpha"]).await;
    system.complete_with_findings(&scan, 1).await;

    system.wait_outbox_drained().await;
    let events = events_by_name(&system).await;
    assert_eq!(
        events,
        BTreeMap::from([("scan.completed".into(), 1), ("task.ready".into(), 1)])
    );
    system.finish().await;
}

/// A round of publishes whose PubAcks never come (the server froze) fails after one
/// acknowledgement timeout, not one per message: the outbox's rounds and a stopping service
/// wait seconds, not minutes (a round of 82 lost acknowledgements once held a shutdown for
/// 400 s).
#[tokio::test]
async fn a_round_whose_acknowledgements_are_lost_fails_after_one_timeout() {
    const MESSAGES: usize = 6;
    /// async-nats' JetStream acknowledgement timeout.
    const ACK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);
    let server = tests::servers::NatsServer::start().await;
    let subjects = messages::Subjects::new("frozen").expect("valid prefix");
    let bus = tests::servers::operator_bus(&server.url(), subjects).await;
    bus::async_nats::jetstream::new(bus.client().clone())
        .create_stream(bus::async_nats::jetstream::stream::Config {
            name: "FROZEN".into(),
            subjects: vec!["frozen.>".into()],
            ..Default::default()
        })
        .await
        .expect("a stream");
    let round = || {
        (0..MESSAGES)
            .map(|index| bus::OutgoingMessage {
                subject: format!("frozen.{index}"),
                msg_id: uuid::Uuid::new_v4().to_string(),
                headers: Default::default(),
                payload: "event".into(),
            })
            .collect::<Vec<_>>()
    };
    let acknowledged = bus.publish_durable_all(round()).await;
    assert!(acknowledged.iter().all(Result::is_ok), "{acknowledged:?}");

    server.pause();
    let started = std::time::Instant::now();
    let lost = bus.publish_durable_all(round()).await;
    let took = started.elapsed();
    server.resume();
    assert!(lost.iter().all(Result::is_err), "{lost:?}");
    assert!(
        took < ACK_TIMEOUT * 2,
        "{MESSAGES} lost acknowledgements took {took:?}: one timeout each, awaited in turn"
    );
}
