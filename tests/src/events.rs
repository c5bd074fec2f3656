//! Reading what palisade published: the events stream, the outbox, consumers' progress.

use super::*;

/// Waits until a durable consumer has nothing pending and nothing unacknowledged: every
/// message was acknowledged or terminated (none is left to be redelivered).
pub async fn wait_consumer_idle(system: &TestSystem, stream: &str, consumer: &str) {
    system
        .wait_for(&format!("consumer {consumer} to drain"), || async {
            let info = consumer_info(system, stream, consumer).await?;
            (info.num_pending == 0 && info.num_ack_pending == 0).then_some(())
        })
        .await;
}

/// A durable consumer's state on the server; `None` while it (or its stream) does not answer.
pub async fn consumer_info(
    system: &TestSystem,
    stream: &str,
    consumer: &str,
) -> Option<async_nats::jetstream::consumer::Info> {
    let stream = system.bus.jetstream().get_stream(stream).await.ok()?;
    let mut consumer: async_nats::jetstream::consumer::PullConsumer =
        stream.get_consumer(consumer).await.ok()?;
    consumer.info().await.ok().cloned()
}

/// Messages stored per subject in `stream`, for subjects matching `filter`.
pub async fn stream_subject_counts(
    system: &TestSystem,
    stream: &str,
    filter: &str,
) -> HashMap<String, usize> {
    use futures::TryStreamExt as _;
    let stream = system
        .bus
        .jetstream()
        .get_stream(stream)
        .await
        .expect("stream exists");
    stream
        .info_with_subjects(filter)
        .await
        .expect("stream info")
        .try_collect()
        .await
        .expect("subject counts")
}

/// The test system's events stream, to read what was published on it.
pub async fn events_stream(system: &TestSystem) -> bus::async_nats::jetstream::stream::Stream {
    system
        .bus
        .jetstream()
        .get_stream(system.subjects.events_stream())
        .await
        .expect("events stream exists")
}

/// Every event on the events stream that came from the outbox, in order (its id is the
/// message's `Nats-Msg-Id`; published rows are no longer in the table). `scan.rejected`, which
/// admission publishes directly under a `scan-rejected:<sequence>` id, is left out.
pub async fn published_events(system: &TestSystem) -> Vec<store::OutboxEvent> {
    let mut stream = events_stream(system).await;
    let last = stream
        .info()
        .await
        .expect("stream info")
        .state
        .last_sequence;
    let mut events = Vec::new();
    for sequence in 1..=last {
        let message = stream
            .get_raw_message(sequence)
            .await
            .expect("an event on the stream");
        let kind = system.subjects.event_kind_of(&message.subject);
        let Some(id) = message
            .headers
            .get(messages::HEADER_MSG_ID)
            .and_then(|id| Uuid::parse_str(id.as_str()).ok())
        else {
            assert_eq!(
                kind,
                Some(messages::EventKind::ScanRejected),
                "every event but scan.rejected carries its outbox id as Nats-Msg-Id"
            );
            continue;
        };
        events.push(store::OutboxEvent {
            id,
            kind,
            subject: message.subject.to_string(),
            payload: message.payload.to_vec(),
            headers: Default::default(),
            trace_scan_id: None,
        });
    }
    events
}

/// Every event written, published or not: those on the events stream, then the outbox rows
/// not among them. Exact whenever it is read: the rows are read first, and a row removed
/// since was published before it was removed, so it is on the stream when that is read.
pub async fn written_events(system: &TestSystem) -> Vec<store::OutboxEvent> {
    let unpublished = store::testing::unpublished_events(&system.pool)
        .await
        .expect("outbox rows");
    let mut events = published_events(system).await;
    let published: HashSet<Uuid> = events.iter().map(|event| event.id).collect();
    for (mut event, _) in unpublished {
        if !published.contains(&event.id) {
            event.kind = system.subjects.event_kind_of(&event.subject);
            events.push(event);
        }
    }
    events
}

/// The payloads of every event of `kind` written ([`written_events`]).
pub async fn written_payloads(system: &TestSystem, kind: messages::EventKind) -> Vec<Vec<u8>> {
    written_events(system)
        .await
        .into_iter()
        .filter(|event| event.kind == Some(kind))
        .map(|event| event.payload)
        .collect()
}

/// Puts every event on the events stream back in the outbox, unpublished, under its own id:
/// what a relay finds after publishing rows whose PubAcks it never saw. Returns how many.
pub async fn put_published_events_back(system: &TestSystem) -> usize {
    let events = published_events(system).await;
    let mut conn = system.pool.acquire().await.expect("a connection");
    store::outbox::enqueue(&mut conn, &events)
        .await
        .expect("events back in the outbox");
    events.len()
}

/// Messages on the events stream by event name (`scan.completed`), tenant and services'
/// events alike.
pub async fn event_counts(system: &TestSystem) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (subject, count) in
        stream_subject_counts(system, &system.subjects.events_stream(), ">").await
    {
        let kind = system
            .subjects
            .event_kind_of(&subject)
            .unwrap_or_else(|| panic!("{subject} on the events stream names no event"));
        *counts.entry(kind.name().to_owned()).or_default() += count;
    }
    counts
}
