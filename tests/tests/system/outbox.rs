//! How events leave the outbox: published by the service that committed them, right after its
//! commit; published by a relay's poll only when their committer did not (it crashed between
//! commit and publish); removed from the table once published; and the progress events left
//! out when an operator turns them off.

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
    sqlx::query_as(
        "SELECT split_part(subject, '.event.', 2), publish_attempts FROM outbox ORDER BY id",
    )
    .fetch_all(&system.pool)
    .await
    .expect("outbox rows")
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
    assert_eq!(rows.len(), 2, "both rows wait unpublished: {rows:?}");
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
    let bus = bus::Bus::connect(
        &server.url(),
        &bus::NatsCredentials::default(),
        &bus::NatsTls::default(),
        subjects,
        &messages::Identity::Operator,
    )
    .await
    .expect("connected");
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
