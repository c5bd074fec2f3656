//! Ingestion's request servers, one per subject it answers besides the results stream: a
//! tenant's findings (with coverage), scans and events, and a worker's artifact sessions and
//! upload chunks. Each wires its subject to its module's `reply`.

use std::sync::Arc;

use anyhow::Context as _;
use bus::Bus;
use messages::WorkerVerb;
use prost::Message as _;
use runtime::ArtifactLimits;
use store::PgPool;
use tokio_util::sync::CancellationToken;

use crate::{Settings, artifacts, events, findings, scans, uploads};

/// The findings request server's name in `palisade_requests_total`.
const REQUEST_SERVER: &str = "ingestion.findings";
/// The queue group of ingestion's request servers (findings, events, artifacts, uploads).
const QUEUE_GROUP: &str = "ingestion";

/// Starts every request server: the events subscription and the artifact store are opened
/// before this returns. The future ends when the first server does; the task beside it wakes
/// waiting event reads, for the caller to abort.
pub(crate) async fn start(
    bus: &Bus,
    pool: &PgPool,
    settings: &Settings,
) -> anyhow::Result<(
    impl Future<Output = anyhow::Result<()>> + 'static,
    tokio::task::JoinHandle<()>,
)> {
    let server = findings_server(bus, pool);
    let scans_server = scans_server(bus, pool);
    let (events_server, waker) = events_server(bus).await?;
    let upload_server = upload_server(bus, pool, settings.artifact_limits);
    let artifact_server = artifact_server(bus, pool, settings).await?;
    let servers = async move {
        tokio::select! {
            result = server => result.context("findings request server stopped"),
            result = artifact_server => result.context("artifact request server stopped"),
            result = upload_server => result.context("upload chunk server stopped"),
            result = events_server => result.context("events request server stopped"),
            result = scans_server => result.context("scans request server stopped"),
        }
    };
    Ok((servers, waker))
}

/// Serves `subject` in ingestion's queue group with `handler`. Not stopped by the shutdown:
/// a server ends when the consumer has (the select in `serve_until_stopped` drops it), so a
/// decision in flight at shutdown is finished, not dropped.
fn serve<F, Fut>(
    bus: &Bus,
    server: &'static str,
    subject: String,
    handler: F,
) -> impl Future<Output = Result<(), bus::BusError>> + 'static
where
    F: Fn(bus::async_nats::Message) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Option<bytes::Bytes>> + Send + 'static,
{
    let bus = bus.clone();
    async move {
        bus::serve::serve(
            &bus,
            server,
            subject,
            QUEUE_GROUP,
            handler,
            CancellationToken::new(),
        )
        .await
    }
}

/// A tenant's findings: listed, shown, dispositioned and gated for it.
fn findings_server(
    bus: &Bus,
    pool: &PgPool,
) -> impl Future<Output = Result<(), bus::BusError>> + 'static {
    let (pool, subjects) = (pool.clone(), bus.subjects().clone());
    let subject = subjects.client_wildcard(messages::ClientVerb::Findings);
    serve(bus, REQUEST_SERVER, subject, move |message| {
        let (pool, subjects) = (pool.clone(), subjects.clone());
        async move {
            let reply =
                findings::reply(&pool, &subjects, message.subject.as_str(), &message.payload).await;
            Some(reply.encode_to_vec().into())
        }
    })
}

/// A tenant's scans, listed for it.
fn scans_server(
    bus: &Bus,
    pool: &PgPool,
) -> impl Future<Output = Result<(), bus::BusError>> + 'static {
    let (pool, subjects) = (pool.clone(), bus.subjects().clone());
    let subject = subjects.client_wildcard(messages::ClientVerb::Scans);
    serve(bus, scans::REQUEST_SERVER, subject, move |message| {
        let (pool, subjects) = (pool.clone(), subjects.clone());
        async move {
            let reply =
                scans::reply(&pool, &subjects, message.subject.as_str(), &message.payload).await;
            Some(reply.encode_to_vec().into())
        }
    })
}

/// A tenant's events: read from the events stream after the client's cursor; a waiting
/// read is woken when its organization's next event is published (a hint only, by the
/// waker task returned beside the server, subscribed before this returns).
async fn events_server(
    bus: &Bus,
) -> anyhow::Result<(
    impl Future<Output = Result<(), bus::BusError>> + 'static,
    tokio::task::JoinHandle<()>,
)> {
    let subjects = bus.subjects().clone();
    events::register_metrics();
    let waiters = Arc::new(events::Waiters::default());
    let published = bus
        .client()
        .subscribe(subjects.tenant_events_wildcard())
        .await
        .context("failed to subscribe to the tenant events")?;
    let waker = tokio::spawn(telemetry::cost::inherit(wake_event_readers(
        published,
        subjects.clone(),
        waiters.clone(),
    )));
    let events_bus = bus.clone();
    let subject = subjects.client_wildcard(messages::ClientVerb::Events);
    let server = serve(bus, events::REQUEST_SERVER, subject, move |message| {
        let (bus, waiters) = (events_bus.clone(), waiters.clone());
        async move {
            let reply =
                events::reply(&bus, &waiters, message.subject.as_str(), &message.payload).await;
            Some(reply.encode_to_vec().into())
        }
    });
    Ok((server, waker))
}

/// Every worker's chunks: stored on the uploads stream only for an open session of the
/// worker that sent them, answered in the form of a PubAck.
fn upload_server(
    bus: &Bus,
    pool: &PgPool,
    limits: ArtifactLimits,
) -> impl Future<Output = Result<(), bus::BusError>> + 'static {
    let uploads = Arc::new(uploads::Uploads {
        pool: pool.clone(),
        bus: bus.clone(),
        limits,
    });
    let subject = bus.subjects().upload_wildcard();
    serve(bus, uploads::REQUEST_SERVER, subject, move |message| {
        let uploads = uploads.clone();
        async move { Some(uploads.reply(&message).await) }
    })
}

/// Workers' upload sessions, prepared and committed into the artifact store (opened
/// before this returns).
async fn artifact_server(
    bus: &Bus,
    pool: &PgPool,
    settings: &Settings,
) -> anyhow::Result<impl Future<Output = Result<(), bus::BusError>> + 'static> {
    let artifacts = Arc::new(artifacts::Artifacts {
        pool: pool.clone(),
        bus: bus.clone(),
        store: runtime::artifacts::Artifacts::open(bus, &settings.common.artifact_store)
            .await
            .context("failed to open the artifact store")?,
        limits: settings.artifact_limits,
    });
    let subject = bus.subjects().worker_wildcard(WorkerVerb::Artifact);
    Ok(serve(
        bus,
        artifacts::REQUEST_SERVER,
        subject,
        move |message| {
            let artifacts = artifacts.clone();
            async move {
                let reply = artifacts
                    .reply(message.subject.as_str(), &message.payload)
                    .await;
                Some(reply.encode_to_vec().into())
            }
        },
    ))
}

/// Wakes the `events` reads waiting for an organization whenever one of its events is
/// published, until the subscription ends.
async fn wake_event_readers(
    mut published: bus::async_nats::Subscriber,
    subjects: messages::Subjects,
    waiters: Arc<events::Waiters>,
) {
    use futures::StreamExt as _;
    while let Some(message) = published.next().await {
        telemetry::cost::count_messages(telemetry::cost::Direction::Received, 1);
        waiters.event_published(&subjects, message.subject.as_str());
    }
}
