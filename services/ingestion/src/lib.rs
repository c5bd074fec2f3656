//! Ingestion (SPEC §4.3): consumes result batches, completions and failures from the results
//! stream, decides each under the fence in one transaction per fetched batch (a savepoint per
//! message), and only after the commit answers the worker and acknowledges JetStream. It also
//! answers a tenant's reads: its findings (`findings`) and its events (`events`), and a
//! worker's artifact uploads: sessions (`artifact`) and their chunks (`upload`).

pub mod artifacts;
pub mod coverage;
pub mod events;
pub mod findings;
pub mod parse;
pub mod scans;
pub mod uploads;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bus::{BatchHandler, Bus, ConsumerSpec, Decision, Delivery};
use messages::{ErrorCode, WorkerVerb, v1};
use outbox::Relay;
use prost::Message as _;
use runtime::env::{ConsumerTuning, ConsumerVars};
use runtime::{ArtifactLimits, BatchLimits, CommonSettings, Connections, Plumbing, SettingsError};
use store::ingest::IngestOutcome;
use store::{PgPool, RetryPolicy, StoreError};
use telemetry::cost::{in_lane, lanes};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::parse::{AckAddress, WorkerMessage};

/// The durable consumer's name on the results stream.
pub const CONSUMER_NAME: &str = "ingestion";

/// Ingestion's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    pub batch_limits: BatchLimits,
    /// Artifact size and upload session lifetime (`PALISADE_ARTIFACT_BYTES_MAX` 64 MiB,
    /// `PALISADE_UPLOAD_TTL_MS` 900000).
    pub artifact_limits: ArtifactLimits,
    /// Backoff between attempts of a failed task (`PALISADE_RETRY_BASE_MS` 5000,
    /// `PALISADE_RETRY_CAP_MS` 300000).
    pub retry: RetryPolicy,
    /// How long a lease handed with a completion lasts (`PALISADE_LEASE_TTL_MS` 30000, as
    /// dispatch's leases).
    pub lease_ttl: Duration,
    /// The durable consumer (`PALISADE_INGESTION_BATCH_SIZE` 128, `PALISADE_INGESTION_ACK_WAIT_MS`
    /// 5000, `PALISADE_INGESTION_MAX_DELIVER` 10, `PALISADE_INGESTION_BATCHES_IN_FLIGHT` 4).
    pub consumer: ConsumerTuning,
    /// Where `/healthz` and `/readyz` listen (`PALISADE_HTTP_ADDR`, default `0.0.0.0:9090`,
    /// `off` for none); `None` where one process runs many services and serves them once.
    pub http_addr: Option<std::net::SocketAddr>,
}

impl Settings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_common(CommonSettings::from_env()?)
    }

    pub fn from_common(common: CommonSettings) -> Result<Self, SettingsError> {
        let retry = runtime::retry_policy_from_env()?;
        let consumer = ConsumerTuning::from_env(ConsumerVars {
            batch_size: "PALISADE_INGESTION_BATCH_SIZE",
            ack_wait_ms: "PALISADE_INGESTION_ACK_WAIT_MS",
            max_deliver: "PALISADE_INGESTION_MAX_DELIVER",
            batches_in_flight: "PALISADE_INGESTION_BATCHES_IN_FLIGHT",
        })?;
        Ok(Self {
            common,
            batch_limits: BatchLimits::from_env()?,
            artifact_limits: ArtifactLimits::from_env()?,
            retry,
            lease_ttl: runtime::LeaseSettings::ttl_from_env()?,
            consumer,
            http_addr: runtime::health::http_addr_from_env()?,
        })
    }
}

/// The findings request server's name in `palisade_requests_total`.
const REQUEST_SERVER: &str = "ingestion.findings";
/// The queue group of ingestion's request servers (findings, events, artifacts, uploads).
const QUEUE_GROUP: &str = "ingestion";

/// A built ingestion service.
pub struct Service {
    settings: Settings,
    bus: Bus,
    ingestion: Arc<Ingestion>,
    /// The health server and the outbox relay, started by `run_until_stopped`.
    plumbing: Plumbing,
    /// [`Service::crash_after_commit`].
    #[cfg(feature = "testing")]
    crash_after_commit: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Service {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let connections = Connections::open(
            &settings.common,
            &messages::Identity::Service(messages::Service::Ingestion),
        )
        .await
        .context("failed to connect")?;
        Ok(Self::from_connections(settings, connections))
    }

    pub fn from_connections(settings: Settings, connections: Connections) -> Self {
        let mut plumbing = Plumbing::new(&settings.common, settings.http_addr, &connections);
        let ingestion = Arc::new(Ingestion {
            relay: plumbing.relay_outbox(&connections),
            pool: connections.pool,
            bus: connections.bus.clone(),
            limits: settings.batch_limits,
            retry: settings.retry,
            lease_ttl: settings.lease_ttl,
            progress_events: settings.common.progress_events,
        });
        Self {
            settings,
            bus: connections.bus,
            ingestion,
            plumbing,
            #[cfg(feature = "testing")]
            crash_after_commit: None,
        }
    }

    /// The consumer's test fault injection ([`bus::consume::ConsumerSpec::crash_after_commit`]),
    /// given to the built service, never among the [`Settings`] an operator sets.
    #[cfg(feature = "testing")]
    pub fn crash_after_commit(mut self, crash: Arc<std::sync::atomic::AtomicBool>) -> Self {
        self.crash_after_commit = Some(crash);
        self
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        in_lane(lanes::INGESTION, self.serve_until_stopped(shutdown)).await
    }

    async fn serve_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let spec = self.consumer_spec();
        let stop = shutdown.child_token();
        let plumbing = self
            .plumbing
            .start(&stop)
            .await
            .context("failed to serve the health endpoints")?;
        let server = self.findings_server();
        let scans_server = self.scans_server();
        let (events_server, waker) = self.events_server().await?;
        let upload_server = self.upload_server();
        let artifact_server = self.artifact_server().await?;
        let consumer = bus::consume::run(&self.bus, spec, self.ingestion.clone(), stop.clone());
        let result = tokio::select! {
            result = consumer => result.context("ingestion consumer stopped"),
            result = server => result.context("findings request server stopped"),
            result = artifact_server => result.context("artifact request server stopped"),
            result = upload_server => result.context("upload chunk server stopped"),
            result = events_server => result.context("events request server stopped"),
            result = scans_server => result.context("scans request server stopped"),
        };
        waker.abort();
        plumbing.stop().await;
        result
    }

    /// The durable consumer of the results stream, tuned by the settings.
    fn consumer_spec(&self) -> ConsumerSpec {
        let subjects = self.bus.subjects();
        let mut spec = ConsumerSpec::new(
            subjects.results_stream(),
            CONSUMER_NAME,
            subjects.results_wildcard(),
        );
        self.settings.consumer.apply(&mut spec);
        #[cfg(feature = "testing")]
        {
            spec.crash_after_commit = self.crash_after_commit.clone();
        }
        spec.removes_decided = true;
        spec
    }

    /// A tenant's findings: listed, shown, dispositioned and gated for it.
    fn findings_server(&self) -> impl Future<Output = Result<(), bus::BusError>> + 'static {
        let (bus, pool) = (self.bus.clone(), self.ingestion.pool.clone());
        let subjects = bus.subjects().clone();
        async move {
            bus::serve::serve(
                &bus,
                REQUEST_SERVER,
                subjects.client_wildcard(messages::ClientVerb::Findings),
                QUEUE_GROUP,
                move |message| {
                    let (pool, subjects) = (pool.clone(), subjects.clone());
                    async move {
                        let reply = findings::reply(
                            &pool,
                            &subjects,
                            message.subject.as_str(),
                            &message.payload,
                        )
                        .await;
                        Some(reply.encode_to_vec().into())
                    }
                },
                // Not stopped by the shutdown: the server ends when the consumer has (the
                // select in `serve_until_stopped` drops it), so a decision in flight at
                // shutdown is finished, not dropped.
                CancellationToken::new(),
            )
            .await
        }
    }

    /// A tenant's scans, listed for it.
    fn scans_server(&self) -> impl Future<Output = Result<(), bus::BusError>> + 'static {
        let (bus, pool) = (self.bus.clone(), self.ingestion.pool.clone());
        let subjects = bus.subjects().clone();
        async move {
            bus::serve::serve(
                &bus,
                scans::REQUEST_SERVER,
                subjects.client_wildcard(messages::ClientVerb::Scans),
                QUEUE_GROUP,
                move |message| {
                    let (pool, subjects) = (pool.clone(), subjects.clone());
                    async move {
                        let reply = scans::reply(
                            &pool,
                            &subjects,
                            message.subject.as_str(),
                            &message.payload,
                        )
                        .await;
                        Some(reply.encode_to_vec().into())
                    }
                },
                // As the findings server: ends when the consumer has.
                CancellationToken::new(),
            )
            .await
        }
    }

    /// A tenant's events: read from the events stream after the client's cursor; a waiting
    /// read is woken when its organization's next event is published (a hint only, by the
    /// waker task returned beside the server, subscribed before this returns).
    async fn events_server(
        &self,
    ) -> anyhow::Result<(
        impl Future<Output = Result<(), bus::BusError>> + 'static,
        tokio::task::JoinHandle<()>,
    )> {
        let subjects = self.bus.subjects().clone();
        events::register_metrics();
        let waiters = Arc::new(events::Waiters::default());
        let published = self
            .bus
            .client()
            .subscribe(subjects.tenant_events_wildcard())
            .await
            .context("failed to subscribe to the tenant events")?;
        let waker = tokio::spawn(telemetry::cost::inherit(wake_event_readers(
            published,
            subjects.clone(),
            waiters.clone(),
        )));
        let (bus, events_bus) = (self.bus.clone(), self.bus.clone());
        let server = async move {
            bus::serve::serve(
                &bus,
                events::REQUEST_SERVER,
                subjects.client_wildcard(messages::ClientVerb::Events),
                QUEUE_GROUP,
                move |message| {
                    let (bus, waiters) = (events_bus.clone(), waiters.clone());
                    async move {
                        let reply = events::reply(
                            &bus,
                            &waiters,
                            message.subject.as_str(),
                            &message.payload,
                        )
                        .await;
                        Some(reply.encode_to_vec().into())
                    }
                },
                // As the findings server: ends when the consumer has.
                CancellationToken::new(),
            )
            .await
        };
        Ok((server, waker))
    }

    /// Every worker's chunks: stored on the uploads stream only for an open session of the
    /// worker that sent them, answered in the form of a PubAck.
    fn upload_server(&self) -> impl Future<Output = Result<(), bus::BusError>> + 'static {
        let bus = self.bus.clone();
        let uploads = Arc::new(uploads::Uploads {
            pool: self.ingestion.pool.clone(),
            bus: self.bus.clone(),
            limits: self.settings.artifact_limits,
        });
        async move {
            bus::serve::serve(
                &bus,
                uploads::REQUEST_SERVER,
                bus.subjects().upload_wildcard(),
                QUEUE_GROUP,
                move |message| {
                    let uploads = uploads.clone();
                    async move { Some(uploads.reply(&message).await) }
                },
                // As the findings server: ends when the consumer has.
                CancellationToken::new(),
            )
            .await
        }
    }

    /// Workers' upload sessions, prepared and committed into the artifact store (opened
    /// before this returns).
    async fn artifact_server(
        &self,
    ) -> anyhow::Result<impl Future<Output = Result<(), bus::BusError>> + 'static> {
        let bus = self.bus.clone();
        let artifacts = Arc::new(artifacts::Artifacts {
            pool: self.ingestion.pool.clone(),
            bus: self.bus.clone(),
            store: runtime::artifacts::Artifacts::open(
                &self.bus,
                &self.settings.common.artifact_store,
            )
            .await
            .context("failed to open the artifact store")?,
            limits: self.settings.artifact_limits,
        });
        Ok(async move {
            bus::serve::serve(
                &bus,
                artifacts::REQUEST_SERVER,
                bus.subjects().worker_wildcard(WorkerVerb::Artifact),
                QUEUE_GROUP,
                move |message| {
                    let artifacts = artifacts.clone();
                    async move {
                        let reply = artifacts
                            .reply(message.subject.as_str(), &message.payload)
                            .await;
                        Some(reply.encode_to_vec().into())
                    }
                },
                // As the findings server: ends when the consumer has.
                CancellationToken::new(),
            )
            .await
        })
    }
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

/// What ingestion decided about one message.
#[derive(Debug)]
enum Verdict {
    Accepted,
    Duplicate,
    Refused(v1::Error),
    /// Something failed that retrying may fix, the error with its causes; `unavailable` when
    /// nothing is wrong with the message (`StoreError::is_unavailable`), so the bus holds it
    /// rather than spend its deliveries.
    Failed {
        reason: String,
        unavailable: bool,
    },
}

/// A fetched batch parsed: every message's ack address, the verdicts of the messages refused
/// already, and the valid messages with their index in the batch.
struct ParsedBatch {
    addresses: Vec<AckAddress>,
    /// `None` for a valid message, until it is decided.
    verdicts: Vec<Option<Verdict>>,
    valid: Vec<(usize, WorkerMessage)>,
}

struct Ingestion {
    pool: PgPool,
    bus: Bus,
    relay: Relay,
    limits: BatchLimits,
    retry: RetryPolicy,
    lease_ttl: Duration,
    progress_events: store::ProgressEvents,
}

fn verb_of(subject: &str) -> Option<WorkerVerb> {
    match subject.rsplit('.').next()? {
        "result" => Some(WorkerVerb::Result),
        "complete" => Some(WorkerVerb::Complete),
        "fail" => Some(WorkerVerb::Fail),
        _ => None,
    }
}

impl Ingestion {
    /// Parses every message of the batch, refusing what is malformed without SQL.
    fn parse_batch(&self, batch: &[Delivery]) -> ParsedBatch {
        let subjects = self.bus.subjects();
        let mut parsed_batch = ParsedBatch {
            addresses: Vec::with_capacity(batch.len()),
            verdicts: Vec::with_capacity(batch.len()),
            valid: Vec::new(),
        };
        for (index, delivery) in batch.iter().enumerate() {
            let (address, parsed) = parse::parse(
                verb_of(delivery.subject()),
                subjects.worker_id_of(delivery.subject()),
                delivery.payload(),
                &self.limits,
            );
            parsed_batch.addresses.push(address);
            match parsed {
                Ok(message) => {
                    parsed_batch.verdicts.push(None);
                    parsed_batch.valid.push((index, message));
                }
                Err(error) => parsed_batch.verdicts.push(Some(Verdict::Refused(error))),
            }
        }
        parsed_batch
    }

    /// Decides the valid messages and writes their verdicts; a transaction that failed is
    /// every valid message's verdict. Returns the committed decision's events, to hand off,
    /// and the leases handed on with completions, by message index.
    async fn decide_into(
        &self,
        valid: &[(usize, WorkerMessage)],
        spans: &[&tracing::Span],
        verdicts: &mut [Option<Verdict>],
    ) -> Option<(store::Staged, HashMap<usize, Vec<v1::Lease>>)> {
        match self.decide(valid, spans).await {
            Ok((decided, leases, staged)) => {
                for ((index, _), verdict) in valid.iter().zip(decided) {
                    verdicts[*index] = Some(verdict);
                }
                Some((staged, leases))
            }
            Err(error) => {
                // Logged once per message, by the bus, with the redelivery it causes.
                let reason = format!("ingestion transaction failed: {}", telemetry::chain(&error));
                for (index, _) in valid {
                    verdicts[*index] = Some(Verdict::Failed {
                        reason: reason.clone(),
                        unavailable: error.is_unavailable(),
                    });
                }
                None
            }
        }
    }

    /// Decides the valid messages in one transaction (`store::ingest`: set-wise, with a fixed
    /// number of statements), which also leases their scans' next plugins to the completions
    /// that asked (`lease_next`). When a set-wise statement fails for a reason retrying cannot
    /// fix, the batch is decided again one message per savepoint, so the message at fault is
    /// refused alone and its neighbours go through.
    async fn decide(
        &self,
        messages: &[(usize, WorkerMessage)],
        spans: &[&tracing::Span],
    ) -> Result<(Vec<Verdict>, HashMap<usize, Vec<v1::Lease>>, store::Staged), StoreError> {
        // One transaction decides messages of many tasks and scans: its span is a root of
        // its own, linked to every message's `process` span (parenting would lie).
        let transaction_span = tracing::info_span!(
            parent: None,
            "ingest",
            otel.name = "ingestion transaction",
            otel.kind = "internal",
            palisade.service = "ingestion",
            messaging.batch.message_count = messages.len(),
        );
        for (index, message) in messages {
            bus::trace::link_to(&transaction_span, spans[*index]);
            spans[*index].record(
                "palisade.task_id",
                tracing::field::display(message.claim().task_id),
            );
        }
        // A completion carrying its last batch is two decisions: the batch, then itself.
        let parts: Vec<Vec<store::ingest::Message<'_>>> = messages
            .iter()
            .map(|(_, message)| message.to_store(self.retry))
            .collect();
        let decisions: Vec<store::ingest::Message<'_>> = parts.iter().flatten().cloned().collect();
        let subjects = self.bus.subjects();
        let script = store::ingest::Ingest {
            subjects,
            messages: &decisions,
            lease_ttl: self.lease_ttl,
        };
        let (decisions, staged) = store::decide_batch(&self.pool, self.progress_events, &script)
            .instrument(transaction_span)
            .await?;
        for (index, message) in messages {
            if let Some(scan_id) = decisions.scans.get(&message.claim().task_id) {
                spans[*index].record("palisade.scan_id", tracing::field::display(scan_id));
            }
        }
        let leases = handed_on(messages, spans, &decisions.leases);
        let mut outcomes = decisions.outcomes.into_iter();
        let verdicts = parts
            .iter()
            .map(|part| {
                let mut verdicts: Vec<Verdict> = outcomes
                    .by_ref()
                    .take(part.len())
                    .map(|outcome| match outcome {
                        Ok(IngestOutcome::Accepted) => Verdict::Accepted,
                        Ok(IngestOutcome::Duplicate) => Verdict::Duplicate,
                        Ok(IngestOutcome::Refused(error)) => Verdict::Refused(error),
                        // Logged once, by the bus, with the redelivery it causes.
                        Err(error) => Verdict::Failed {
                            reason: telemetry::chain(&error).to_string(),
                            unavailable: error.is_unavailable(),
                        },
                    })
                    .collect();
                // The completion answers for its batch, unless deciding the batch failed: then
                // the whole message is decided again.
                let own = verdicts.pop().expect("every message has its own decision");
                match verdicts.pop() {
                    Some(failed @ Verdict::Failed { .. }) => failed,
                    _ => own,
                }
            })
            .collect();
        Ok((verdicts, leases, staged))
    }

    async fn answer(&self, address: &AckAddress, verdict: &Verdict, leases: Vec<v1::Lease>) {
        let Some(worker_id) = &address.worker_id else {
            return;
        };
        let error = match verdict {
            Verdict::Refused(error) => Some(error.clone()),
            Verdict::Accepted | Verdict::Duplicate => None,
            Verdict::Failed { .. } => return,
        };
        let ack = v1::IngestAck {
            kind: address.kind.to_owned(),
            task_id: address.task_id.clone(),
            attempt_id: address.attempt_id.clone(),
            idempotency_key: address.idempotency_key.clone(),
            sequence_number: address.sequence_number,
            error,
            duplicate: matches!(verdict, Verdict::Duplicate),
            leases,
        };
        let subject = self.bus.subjects().worker(worker_id, WorkerVerb::Ack);
        if let Err(error) = self
            .bus
            .publish_core(subject, ack.encode_to_vec().into())
            .await
        {
            // The worker resends after its ack timeout and gets the same answer again.
            tracing::debug!(error = %telemetry::chain(&error), "ingest ack not sent");
        }
    }
}

impl BatchHandler for Ingestion {
    async fn handle(&self, batch: &[Delivery]) -> Vec<Decision> {
        let ParsedBatch {
            addresses,
            mut verdicts,
            mut valid,
        } = self.parse_batch(batch);
        valid.sort_by_key(|(_, message)| message.sort_key());
        let spans: Vec<&tracing::Span> = batch.iter().map(Delivery::span).collect();
        let mut leases = match self.decide_into(&valid, &spans, &mut verdicts).await {
            Some((staged, leases)) => {
                self.relay.hand_off(staged);
                leases
            }
            None => HashMap::new(),
        };
        let mut decisions = Vec::with_capacity(batch.len());
        for (index, (address, verdict)) in addresses.iter().zip(verdicts).enumerate() {
            let verdict = verdict.expect("every message decided");
            // The acknowledgement and the log line belong to the message's trace.
            let span = batch[index].span();
            self.answer(address, &verdict, leases.remove(&index).unwrap_or_default())
                .instrument(span.clone())
                .await;
            decisions.push(decision_of(span, address, verdict));
        }
        decisions
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<(), String> {
        runtime::record_dead_letter(&self.pool, CONSUMER_NAME, delivery, reason).await
    }
}

/// The wire leases handed on with each completion (by message index), each opened in the
/// completion's own span: the cause of the grant.
fn handed_on(
    messages: &[(usize, WorkerMessage)],
    spans: &[&tracing::Span],
    granted: &HashMap<uuid::Uuid, Vec<store::lease::GrantedLease>>,
) -> HashMap<usize, Vec<v1::Lease>> {
    messages
        .iter()
        .filter_map(|(index, message)| {
            let WorkerMessage::Complete { claim, .. } = message else {
                return None;
            };
            let leases = granted.get(&claim.attempt_id)?;
            let wire = spans[*index].in_scope(|| {
                leases
                    .iter()
                    .map(|lease| runtime::traced_lease(lease, "ingestion"))
                    .collect()
            });
            Some((*index, wire))
        })
        .collect()
}

/// What the bus does with a message given its verdict; a refusal is logged (but the routine
/// `lease_lost`), recorded on the message's span and counted.
fn decision_of(span: &tracing::Span, address: &AckAddress, verdict: Verdict) -> Decision {
    match verdict {
        Verdict::Accepted | Verdict::Duplicate => Decision::Ack,
        Verdict::Refused(error) => {
            span.in_scope(|| {
                if error.error_code() != Some(ErrorCode::LeaseLost) {
                    tracing::info!(code = %error.code, kind = address.kind, task_id = %address.task_id, "worker message refused");
                }
            });
            telemetry::record_error(span, &error.code, &error.message);
            bus::metrics::record_refusal(CONSUMER_NAME, &error.code);
            Decision::Reject { reason: error.code }
        }
        Verdict::Failed {
            reason,
            unavailable: true,
        } => Decision::Hold { reason },
        Verdict::Failed { reason, .. } => Decision::Retry { reason },
    }
}
