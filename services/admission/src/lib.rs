//! Admission (SPEC §4.1): consumes scan requests from JetStream (and answers the synchronous
//! request/reply subject), and admits each request exactly once. A fetched batch is decided in
//! one transaction by `store::admit` with a fixed number of statements (one by one in savepoints
//! only when a set-wise statement fails); acknowledgements follow the commit. Request/reply
//! submissions are decided the same way: those that arrive together are decided together.

pub mod request;
pub mod schedules;

use std::sync::Arc;

use anyhow::Context as _;
use bus::{BatchHandler, Bus, ConsumerSpec, Decision, Delivery};
use bytes::Bytes;
use messages::{ClientVerb, ErrorCode, EventKind, v1};
use outbox::Relay;
use prost::Message as _;
use runtime::env::{ConsumerTuning, ConsumerVars};
use runtime::{CommonSettings, Connections, Plumbing, SettingsError, env};
use store::admit::{AdmitOutcome, AdmitParams};
use store::{PgPool, StoreError};
use telemetry::cost::{in_lane, lanes};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use crate::request::ValidScanRequest;

/// The durable consumer's name on the requests stream.
pub const CONSUMER_NAME: &str = "admission";
/// Queue group for the request/reply subject, shared by replicas.
pub const QUEUE_GROUP: &str = "admission";

/// Admission's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    /// Attempt budget of every task (`PALISADE_MAX_ATTEMPTS`, default 3).
    pub max_attempts: i32,
    /// The durable consumer (`PALISADE_ADMISSION_BATCH_SIZE` 128, `PALISADE_ADMISSION_ACK_WAIT_MS`
    /// 5000, `PALISADE_ADMISSION_MAX_DELIVER` 10, `PALISADE_ADMISSION_BATCHES_IN_FLIGHT` 4).
    pub consumer: ConsumerTuning,
    /// When set, profiles may only name these plugins; others get `unknown_plugin`
    /// (`PALISADE_KNOWN_PLUGINS`, comma-separated; unset accepts any plugin name).
    pub known_plugins: Option<Vec<String>>,
    /// Where `/healthz` and `/readyz` listen (`PALISADE_HTTP_ADDR`, default `0.0.0.0:9090`,
    /// `off` for none); `None` where one process runs many services and serves them once.
    pub http_addr: Option<std::net::SocketAddr>,
}

impl Settings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_common(CommonSettings::from_env()?)
    }

    /// Service-specific settings from the environment over the given common ones.
    pub fn from_common(common: CommonSettings) -> Result<Self, SettingsError> {
        let max_attempts = runtime::max_attempts_from_env()?;
        let consumer = ConsumerTuning::from_env(ConsumerVars {
            batch_size: "PALISADE_ADMISSION_BATCH_SIZE",
            ack_wait_ms: "PALISADE_ADMISSION_ACK_WAIT_MS",
            max_deliver: "PALISADE_ADMISSION_MAX_DELIVER",
            batches_in_flight: "PALISADE_ADMISSION_BATCHES_IN_FLIGHT",
        })?;
        Ok(Self {
            common,
            max_attempts,
            consumer,
            known_plugins: Some(
                env::string("PALISADE_KNOWN_PLUGINS", "")
                    .split(',')
                    .map(|name| name.trim().to_owned())
                    .filter(|name| !name.is_empty())
                    .collect::<Vec<_>>(),
            )
            .filter(|names| !names.is_empty()),
            http_addr: runtime::health::http_addr_from_env()?,
        })
    }
}

/// A built admission service, ready to run.
pub struct Service {
    settings: Settings,
    bus: Bus,
    admission: Arc<Admission>,
    /// Request/reply submissions waiting for a decider (`decide_submissions`).
    submissions: mpsc::UnboundedReceiver<Submission>,
    /// The health server and the outbox relay, started by `run_until_stopped`.
    plumbing: Plumbing,
    /// [`Service::crash_after_commit`].
    #[cfg(feature = "testing")]
    crash_after_commit: Option<Arc<std::sync::atomic::AtomicBool>>,
}

impl Service {
    /// Connects (checking NATS version, streams and schema) and builds the service.
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let connections = Connections::open(
            &settings.common,
            &messages::Identity::Service(messages::Service::Admission),
        )
        .await
        .context("failed to connect")?;
        Ok(Self::from_connections(settings, connections))
    }

    /// Builds over existing connections (the all-in-one command and the tests).
    pub fn from_connections(settings: Settings, connections: Connections) -> Self {
        let mut plumbing = Plumbing::new(&settings.common, settings.http_addr, &connections);
        let (submit, submissions) = mpsc::unbounded_channel();
        let admission = Arc::new(Admission {
            submit,
            relay: plumbing.relay_outbox(&connections),
            pool: connections.pool,
            bus: connections.bus.clone(),
            max_attempts: settings.max_attempts,
            known_plugins: settings.known_plugins.clone(),
            progress_events: settings.common.progress_events,
        });
        Self {
            settings,
            bus: connections.bus,
            admission,
            submissions,
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

    /// Runs the consumer, the request/reply server and the outbox relay until `shutdown`,
    /// or until one of them fails.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        in_lane(lanes::ADMISSION, self.serve_until_stopped(shutdown)).await
    }

    async fn serve_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let spec = self.consumer_spec();
        let stop = shutdown.child_token();
        let plumbing = self
            .plumbing
            .start(&stop)
            .await
            .context("failed to serve the health endpoints")?;
        let submit_server = serve_submit(&self.bus, self.admission.clone(), stop.clone());
        let schedules_server = serve_schedules(&self.bus, self.admission.clone(), stop.clone());
        // Request/reply submissions are decided by as many deciders as the durable path has
        // batches in flight, each taking what queued while it was busy, up to a batch.
        let deciding = self.admission.clone();
        let deciders = runtime::deciders::decide_queued(
            self.submissions,
            self.settings.consumer.batches_in_flight,
            self.settings.consumer.batch_size,
            stop.clone(),
            move |taken| deciding.clone().decide_submissions(taken),
        );
        let server = async move {
            let (submit, _, schedules) = tokio::join!(submit_server, deciders, schedules_server);
            submit.and(schedules)
        };
        let consumer = bus::consume::run(&self.bus, spec, self.admission.clone(), stop.clone());
        let result = tokio::select! {
            result = consumer => result.context("admission consumer stopped"),
            result = server => result.context("admission request server stopped"),
        };
        plumbing.stop().await;
        result
    }

    /// The durable consumer of `…client.*.request`, tuned by the settings.
    fn consumer_spec(&self) -> ConsumerSpec {
        let subjects = self.bus.subjects();
        let mut spec = ConsumerSpec::new(
            subjects.requests_stream(),
            CONSUMER_NAME,
            subjects.client_wildcard(ClientVerb::Request),
        );
        self.settings.consumer.apply(&mut spec);
        #[cfg(feature = "testing")]
        {
            spec.crash_after_commit = self.crash_after_commit.clone();
        }
        spec.removes_decided = true;
        spec
    }
}

/// Answers `…client.*.submit` until `stop`: each submission queued for a decider and
/// answered with its verdict.
async fn serve_submit(
    bus: &Bus,
    admission: Arc<Admission>,
    stop: CancellationToken,
) -> Result<(), bus::BusError> {
    bus::serve::serve(
        bus,
        "admission.submit",
        bus.subjects().client_wildcard(ClientVerb::Submit),
        QUEUE_GROUP,
        move |message| {
            let admission = admission.clone();
            async move {
                Some(
                    admission
                        .submit(message.subject.as_str(), message.payload)
                        .await,
                )
            }
        },
        stop,
    )
    .await
}

/// Answers the `schedules` verb until `stop`, checking plugins as admission does.
async fn serve_schedules(
    bus: &Bus,
    admission: Arc<Admission>,
    stop: CancellationToken,
) -> Result<(), bus::BusError> {
    let subjects = bus.subjects().clone();
    bus::serve::serve(
        bus,
        schedules::REQUEST_SERVER,
        subjects.client_wildcard(ClientVerb::Schedules),
        QUEUE_GROUP,
        move |message| {
            let (admission, subjects) = (admission.clone(), subjects.clone());
            async move {
                let known = |valid: &ValidScanRequest| admission.check_plugins(valid);
                let reply = schedules::reply(
                    &admission.pool,
                    &subjects,
                    &known,
                    message.subject.as_str(),
                    &message.payload,
                )
                .await;
                Some(reply.encode_to_vec().into())
            }
        },
        stop,
    )
    .await
}

/// What admission decided about one request.
#[derive(Debug)]
enum Verdict {
    Admitted {
        scan_id: uuid::Uuid,
    },
    Duplicate {
        scan_id: uuid::Uuid,
        state: store::states::ScanState,
    },
    Refused {
        /// The request as decoded, when it decoded (boxed: verdicts are kept per message).
        wire: Option<Box<v1::ScanRequest>>,
        error: v1::Error,
    },
    /// Something failed that retrying may fix, the error with its causes; `unavailable` when
    /// nothing is wrong with the request (PostgreSQL unreachable or the pool exhausted:
    /// `StoreError::is_unavailable`), so the bus holds it rather than spend its deliveries.
    Failed {
        reason: String,
        unavailable: bool,
    },
}

/// A request/reply submission waiting to be decided, and where its verdict goes.
struct Submission {
    subject: String,
    payload: Bytes,
    /// The request's span (its context becomes the scan's trace context).
    span: tracing::Span,
    verdict: oneshot::Sender<Verdict>,
}

struct Admission {
    /// Where [`Admission::submit`] queues a request/reply submission.
    submit: mpsc::UnboundedSender<Submission>,
    pool: PgPool,
    bus: Bus,
    relay: Relay,
    max_attempts: i32,
    known_plugins: Option<Vec<String>>,
    progress_events: store::ProgressEvents,
}

impl Admission {
    fn check_plugins(&self, request: &ValidScanRequest) -> Result<(), v1::Error> {
        let Some(known) = &self.known_plugins else {
            return Ok(());
        };
        match request
            .plugins
            .iter()
            .find(|plugin| !known.contains(plugin))
        {
            Some(unknown) => Err(v1::Error::new(
                ErrorCode::UnknownPlugin,
                format!(
                    "plugin {unknown:?} is not one of the known plugins: {}",
                    known.join(", ")
                ),
            )),
            None => Ok(()),
        }
    }

    /// Decides every request of a batch: refusals of the request itself without SQL, the rest
    /// in one transaction, in (organization, target) order (the order admission has always
    /// decided a batch in, so in-batch answers are what they were).
    async fn decide(&self, messages: &[(&str, &[u8])], spans: &[&tracing::Span]) -> Vec<Verdict> {
        assert_eq!(messages.len(), spans.len(), "one span per request");
        let mut verdicts: Vec<Option<Verdict>> = Vec::with_capacity(messages.len());
        let mut valid: Vec<(usize, ValidScanRequest)> = Vec::new();
        for (index, (subject, payload)) in messages.iter().enumerate() {
            let (wire, parsed) = request::parse(self.bus.subjects(), subject, payload);
            // A request the operator's plugin allow-list refuses is refused as a bad field is.
            let checked = parsed.and_then(|request| self.check_plugins(&request).map(|()| request));
            match (wire, checked) {
                (_, Ok(request)) => {
                    verdicts.push(None);
                    valid.push((index, request));
                }
                (wire, Err(error)) => verdicts.push(Some(Verdict::Refused {
                    wire: wire.map(Box::new),
                    error,
                })),
            }
        }
        valid.sort_by(|(_, a), (_, b)| {
            (a.organization_id, &a.target).cmp(&(b.organization_id, &b.target))
        });
        match self.decide_valid(&valid, spans).await {
            Ok(decided) => {
                for ((index, _), verdict) in valid.iter().zip(decided) {
                    verdicts[*index] = Some(verdict);
                }
            }
            Err(error) => {
                // Logged once per request where it is handled: the bus's redelivery line, or
                // the request/reply path's.
                let reason = format!("admission transaction failed: {}", telemetry::chain(&error));
                for (index, _) in &valid {
                    verdicts[*index] = Some(Verdict::Failed {
                        reason: reason.clone(),
                        unavailable: error.is_unavailable(),
                    });
                }
            }
        }
        verdicts
            .into_iter()
            .map(|verdict| verdict.expect("every request decided"))
            .collect()
    }

    /// Decides the valid requests in one transaction (`store::admit`: set-wise, with a fixed
    /// number of statements). When a set-wise statement fails for a reason retrying cannot fix,
    /// the batch is decided again one request per savepoint, so the request at fault fails
    /// alone and its neighbours go through.
    async fn decide_valid(
        &self,
        valid: &[(usize, ValidScanRequest)],
        spans: &[&tracing::Span],
    ) -> Result<Vec<Verdict>, StoreError> {
        if valid.is_empty() {
            return Ok(Vec::new());
        }
        // Each request's own span: its context becomes the scan's trace context.
        let trace_contexts: Vec<Option<String>> = valid
            .iter()
            .map(|(index, _)| bus::trace::traceparent_of(spans[*index]))
            .collect();
        let requests: Vec<AdmitParams<'_>> = valid
            .iter()
            .zip(&trace_contexts)
            .map(|((_, request), trace_context)| {
                request.params(self.max_attempts, trace_context.as_deref())
            })
            .collect();
        let subjects = self.bus.subjects();
        let script = store::admit::Admit {
            subjects,
            requests: &requests,
        };
        let (outcomes, staged) =
            store::decide_batch(&self.pool, self.progress_events, &script).await?;
        // Committed: the scans' events go out now (task.ready wakes dispatch).
        self.relay.hand_off(staged);
        let verdicts: Vec<Verdict> = valid
            .iter()
            .zip(outcomes)
            .map(|((index, _), outcome)| match outcome {
                Ok(AdmitOutcome::Admitted { scan_id, .. }) => {
                    spans[*index].record("palisade.scan_id", tracing::field::display(scan_id));
                    Verdict::Admitted { scan_id }
                }
                Ok(AdmitOutcome::Duplicate { scan_id, state }) => {
                    Verdict::Duplicate { scan_id, state }
                }
                Ok(AdmitOutcome::Refused(error)) => Verdict::Refused { wire: None, error },
                // Logged once, where the verdict is handled.
                Err(error) => Verdict::Failed {
                    reason: telemetry::chain(&error).to_string(),
                    unavailable: error.is_unavailable(),
                },
            })
            .collect();
        Ok(verdicts)
    }

    /// Decides request/reply submissions that queued together in one transaction, as the
    /// durable path decides a fetched batch, and answers each (`runtime::deciders`).
    async fn decide_submissions(self: Arc<Self>, taken: Vec<Submission>) {
        let messages: Vec<(&str, &[u8])> = taken
            .iter()
            .map(|submission| (submission.subject.as_str(), submission.payload.as_ref()))
            .collect();
        let spans: Vec<&tracing::Span> = taken.iter().map(|submission| &submission.span).collect();
        let verdicts = self.decide(&messages, &spans).await;
        for (submission, verdict) in taken.into_iter().zip(verdicts) {
            // A requester that stopped waiting reads its answer by asking again.
            let _ = submission.verdict.send(verdict);
        }
    }

    /// The request/reply path: the request is decided with whatever else was submitted at the
    /// same time, in one transaction, then answered.
    async fn submit(&self, subject: &str, payload: Bytes) -> Bytes {
        let (verdict, decided) = oneshot::channel();
        let submission = Submission {
            subject: subject.to_owned(),
            payload,
            span: tracing::Span::current(),
            verdict,
        };
        let verdict = match self.submit.send(submission) {
            Ok(()) => decided.await.ok(),
            Err(_) => None,
        };
        let reply = match verdict {
            None => v1::ScanRequestReply {
                error: Some(runtime::internal_error(
                    "admission's decision",
                    &"admission is stopping",
                    "retry with the same idempotency key",
                )),
                ..Default::default()
            },
            Some(verdict) => Self::reply(verdict),
        };
        reply.encode_to_vec().into()
    }

    /// Logs a refused request and builds its `scan.rejected` event, in the request's trace;
    /// `None` when its subject names no organization (such an event would have no reader).
    fn rejection(
        &self,
        delivery: &Delivery,
        wire: Option<Box<v1::ScanRequest>>,
        error: &v1::Error,
    ) -> Option<bus::OutgoingMessage> {
        let wire = wire
            .map(|wire| *wire)
            .or_else(|| v1::ScanRequest::decode(delivery.payload()).ok());
        let rejected = v1::ScanRejected {
            organization_id: wire
                .as_ref()
                .map(|w| w.organization_id.clone())
                .unwrap_or_default(),
            client_id: wire
                .as_ref()
                .map(|w| w.client_id.clone())
                .unwrap_or_default(),
            idempotency_key: wire
                .as_ref()
                .map(|w| w.idempotency_key.clone())
                .unwrap_or_default(),
            error: Some(error.clone()),
        };
        let span = delivery.span();
        span.in_scope(|| tracing::info!(code = %error.code, stream_sequence = delivery.stream_sequence, "scan request refused"));
        telemetry::record_error(span, &error.code, &error.message);
        // The rejection event is published in the request's trace.
        let mut headers = bus::async_nats::HeaderMap::new();
        bus::trace::inject_span(span, &mut headers);
        // Told to the organization the request was published for: the one its
        // sender's credentials allow (a subject that names none has no reader).
        let organization = self
            .bus
            .subjects()
            .client_of(delivery.subject())
            .and_then(|tokens| uuid::Uuid::parse_str(tokens.organization_id).ok())?;
        Some(bus::OutgoingMessage {
            subject: self
                .bus
                .subjects()
                .tenant_event(&organization, EventKind::ScanRejected),
            msg_id: format!("scan-rejected:{}", delivery.stream_sequence),
            headers,
            payload: rejected.encode_to_vec().into(),
        })
    }

    /// Publishes the rejection events, each with the index of its delivery's decision; a
    /// rejection NATS did not take holds its delivery, to be decided again later.
    async fn publish_rejections(
        &self,
        rejections: Vec<(usize, bus::OutgoingMessage)>,
        decisions: &mut [Decision],
    ) {
        if rejections.is_empty() {
            return;
        }
        let (indices, messages): (Vec<usize>, Vec<bus::OutgoingMessage>) =
            rejections.into_iter().unzip();
        for (index, result) in indices
            .into_iter()
            .zip(self.bus.publish_durable_all(messages).await)
        {
            if let Err(error) = result {
                // NATS, not the request, failed: the refusal is decided again later.
                decisions[index] = Decision::Hold {
                    reason: format!("could not publish the rejection: {error}"),
                };
            }
        }
    }

    /// The answer to a request/reply submission.
    fn reply(verdict: Verdict) -> v1::ScanRequestReply {
        match verdict {
            Verdict::Admitted { scan_id } => v1::ScanRequestReply {
                scan_id: scan_id.to_string(),
                deduplicated: false,
                state: store::states::ScanState::Pending.as_str().into(),
                error: None,
            },
            Verdict::Duplicate { scan_id, state } => v1::ScanRequestReply {
                scan_id: scan_id.to_string(),
                deduplicated: true,
                state: state.as_str().into(),
                error: None,
            },
            Verdict::Refused { error, .. } => v1::ScanRequestReply {
                error: Some(error),
                ..Default::default()
            },
            Verdict::Failed { reason, .. } => v1::ScanRequestReply {
                error: Some(runtime::internal_error(
                    "admission's decision",
                    &reason,
                    "retry with the same idempotency key",
                )),
                ..Default::default()
            },
        }
    }
}

impl BatchHandler for Admission {
    async fn handle(&self, batch: &[Delivery]) -> Vec<Decision> {
        let messages: Vec<(&str, &[u8])> = batch
            .iter()
            .map(|delivery| (delivery.subject(), delivery.payload()))
            .collect();
        let spans: Vec<&tracing::Span> = batch.iter().map(Delivery::span).collect();
        let verdicts = self.decide(&messages, &spans).await;

        // Refusals are answered on the events stream, after the commit.
        let mut rejections = Vec::new();
        let mut decisions: Vec<Decision> = Vec::with_capacity(batch.len());
        for (delivery, verdict) in batch.iter().zip(verdicts) {
            match verdict {
                Verdict::Admitted { .. } | Verdict::Duplicate { .. } => {
                    decisions.push(Decision::Ack)
                }
                Verdict::Failed {
                    reason,
                    unavailable: true,
                } => decisions.push(Decision::Hold { reason }),
                Verdict::Failed { reason, .. } => decisions.push(Decision::Retry { reason }),
                Verdict::Refused { wire, error } => {
                    if let Some(rejection) = self.rejection(delivery, wire, &error) {
                        rejections.push((decisions.len(), rejection));
                    }
                    bus::metrics::record_refusal(CONSUMER_NAME, &error.code);
                    decisions.push(Decision::Reject { reason: error.code });
                }
            }
        }
        self.publish_rejections(rejections, &mut decisions).await;
        decisions
    }

    async fn dead_letter(&self, delivery: &Delivery, reason: &str) -> Result<(), String> {
        runtime::record_dead_letter(&self.pool, CONSUMER_NAME, delivery, reason).await
    }
}
