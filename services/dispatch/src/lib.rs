//! Dispatch (SPEC §4.2): answers workers' hello, acquire (long-poll), renew and release on
//! `<prefix>.v1.worker.<worker_id>.<verb>`. Every decision is one PostgreSQL transaction;
//! `task.ready` events only wake long-polls early, they never decide anything.

pub mod parse;
mod waiters;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bus::Bus;
use bytes::Bytes;
use futures::StreamExt as _;
use messages::{ClientVerb, ErrorCode, EventKind, WorkerVerb, v1};
use outbox::Relay;
use prost::Message as _;
use runtime::{
    BatchLimits, CommonSettings, Connections, LeaseSettings, Plumbing, SettingsError, env,
};
use store::cancel::CancelOutcome;
use store::lease::{
    AcquireOutcome, AcquireParams, Acquired, HelloOutcome, ReleaseOutcome, RenewOutcome,
};
use store::{PgPool, Staged, StoreError};

use crate::waiters::Waiters;
use telemetry::cost::{Direction, count_messages, in_lane, inherit, lanes};
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// Transient failures (a deadlock lost to a racing completion) a cancel retries by itself.
const CANCEL_TRANSIENT_RETRIES_MAX: usize = 3;

/// Acquires decided at the same time (each decider takes what queued while it was busy, at
/// most [`ACQUIRE_BATCH_MAX`], and decides it in one transaction; `runtime::deciders`).
const ACQUIRE_DECIDERS: usize = 4;

/// Acquires one decision takes at most.
const ACQUIRE_BATCH_MAX: usize = 64;

/// Queue group shared by dispatch replicas.
pub const QUEUE_GROUP: &str = "dispatch";

/// The worker verbs dispatch answers (results, completions, failures and acks travel over
/// JetStream or to the worker, artifacts to ingestion).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Served {
    Hello,
    Acquire,
    Renew,
    Release,
    Enroll,
    Credentials,
}

impl Served {
    const ALL: [Served; 6] = [
        Served::Hello,
        Served::Acquire,
        Served::Renew,
        Served::Release,
        Served::Enroll,
        Served::Credentials,
    ];

    fn verb(self) -> WorkerVerb {
        match self {
            Served::Hello => WorkerVerb::Hello,
            Served::Acquire => WorkerVerb::Acquire,
            Served::Renew => WorkerVerb::Renew,
            Served::Release => WorkerVerb::Release,
            Served::Enroll => WorkerVerb::Enroll,
            Served::Credentials => WorkerVerb::Credentials,
        }
    }

    /// The request metrics' name for its server.
    fn server_name(self) -> &'static str {
        match self {
            Served::Hello => "dispatch.hello",
            Served::Acquire => "dispatch.acquire",
            Served::Renew => "dispatch.renew",
            Served::Release => "dispatch.release",
            Served::Enroll => "dispatch.enroll",
            Served::Credentials => "dispatch.credentials",
        }
    }
}

/// Dispatch's settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    pub lease: LeaseSettings,
    pub batch_limits: BatchLimits,
    /// A waiting acquire re-checks the database this often even without a wake-up, for tasks
    /// that became due by time (`PALISADE_ACQUIRE_POLL_MS`, default 1000).
    pub acquire_poll: Duration,
    /// How often this replica says on `dispatch.ready` that it serves, so that workers notice
    /// within two heartbeats that it died holding their long-polls
    /// (`PALISADE_DISPATCH_HEARTBEAT_MS`, default 1000, 100..=10000).
    pub heartbeat: Duration,
    /// Where `/healthz` and `/readyz` listen (`PALISADE_HTTP_ADDR`, default `0.0.0.0:9090`,
    /// `off` for none); `None` where one process runs many services and serves them once.
    pub http_addr: Option<std::net::SocketAddr>,
    /// The enrollment key workers' credentials are signed with (`PALISADE_NATS_ENROLLMENT_KEY`:
    /// the `enrollment.nk` seed file `palisade nats init` writes); without it, enrollments and
    /// renewals are refused, saying so.
    pub enroller: Option<Arc<identity::enrollment::Enroller>>,
    /// How long the credentials dispatch signs are valid
    /// (`PALISADE_WORKER_CREDENTIALS_TTL_SECS`, default 86400, 600..=2592000); workers renew
    /// them before.
    pub credentials_ttl: Duration,
}

/// The range `PALISADE_WORKER_CREDENTIALS_TTL_SECS` accepts: ten minutes to thirty days.
const CREDENTIALS_TTL_SECS: std::ops::RangeInclusive<u64> = 600..=2_592_000;

/// Reads `PALISADE_NATS_ENROLLMENT_KEY`'s seed file, when set.
fn enroller_from_env() -> Result<Option<Arc<identity::enrollment::Enroller>>, SettingsError> {
    const VAR: &str = "PALISADE_NATS_ENROLLMENT_KEY";
    let Some(path) = env::optional_string(VAR) else {
        return Ok(None);
    };
    identity::enrollment::Enroller::read(std::path::Path::new(&path))
        .map(|enroller| Some(Arc::new(enroller)))
        .map_err(|error| SettingsError::Invalid {
            name: VAR,
            value: path,
            reason: error.to_string(),
        })
}

impl Settings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_common(CommonSettings::from_env()?)
    }

    pub fn from_common(common: CommonSettings) -> Result<Self, SettingsError> {
        Ok(Self {
            common,
            lease: LeaseSettings::from_env()?,
            batch_limits: BatchLimits::from_env()?,
            acquire_poll: Duration::from_millis(env::parse("PALISADE_ACQUIRE_POLL_MS", 1_000_u64)?),
            heartbeat: Duration::from_millis(env::parse_in(
                "PALISADE_DISPATCH_HEARTBEAT_MS",
                1_000_u64,
                HEARTBEAT_MS,
            )?),
            http_addr: runtime::health::http_addr_from_env()?,
            enroller: enroller_from_env()?,
            credentials_ttl: Duration::from_secs(env::parse_in(
                "PALISADE_WORKER_CREDENTIALS_TTL_SECS",
                86_400_u64,
                CREDENTIALS_TTL_SECS,
            )?),
        })
    }
}

/// A built dispatch service.
pub struct Service {
    bus: Bus,
    dispatch: Arc<Dispatch>,
    /// Acquires waiting for a decider (`Dispatch::decide_acquires`).
    acquires: mpsc::UnboundedReceiver<QueuedAcquire>,
    /// The health server and the outbox relay, started by `run_until_stopped`.
    plumbing: Plumbing,
}

impl Service {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let connections = Connections::open(
            &settings.common,
            &messages::Identity::Service(messages::Service::Dispatch),
        )
        .await
        .context("failed to connect")?;
        Ok(Self::from_connections(settings, connections))
    }

    pub fn from_connections(settings: Settings, connections: Connections) -> Self {
        let mut plumbing = Plumbing::new(&settings.common, settings.http_addr, &connections);
        let (queue_acquire, acquires) = mpsc::unbounded_channel();
        let dispatch = Arc::new(Dispatch {
            queue_acquire,
            relay: plumbing.relay_outbox(&connections),
            pool: connections.pool,
            bus: connections.bus.clone(),
            settings,
            waiters: Waiters::default(),
        });
        Self {
            bus: connections.bus,
            dispatch,
            acquires,
            plumbing,
        }
    }

    /// Serves the four worker verbs and relays the outbox until `shutdown`.
    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        in_lane(lanes::DISPATCH, self.serve_until_stopped(shutdown)).await
    }

    async fn serve_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let stop = shutdown.child_token();
        let plumbing = self
            .plumbing
            .start(&stop)
            .await
            .context("failed to serve the health endpoints")?;
        let waker = spawn_waker(&self.bus, self.dispatch.clone(), stop.clone()).await?;

        // Every subscription is in place before dispatch says it serves: a worker that hears
        // `dispatch.ready` asks again at once and must find someone to answer.
        let subscriptions = subscribe_served(&self.bus).await?;
        self.bus.flush().await.context("failed to reach NATS")?;
        let announcer = tokio::spawn(inherit(announce(
            self.bus.clone(),
            self.dispatch.settings.heartbeat,
            stop.clone(),
        )));

        let deciding = self.dispatch.clone();
        let deciders = tokio::spawn(inherit(runtime::deciders::decide_queued(
            self.acquires,
            ACQUIRE_DECIDERS,
            ACQUIRE_BATCH_MAX,
            stop.clone(),
            move |taken| deciding.clone().decide_acquires(taken),
        )));

        let mut servers = spawn_servers(&self.bus, &self.dispatch, subscriptions, &stop);
        let result = tokio::select! {
            () = stop.cancelled() => Ok(()),
            Some(joined) = servers.join_next() => match joined {
                Ok(result) => result.context("dispatch server stopped"),
                Err(error) => Err(error).context("dispatch server panicked"),
            },
        };
        stop.cancel();
        while servers.join_next().await.is_some() {}
        let _ = waker.await;
        let _ = announcer.await;
        let _ = deciders.await;
        plumbing.stop().await;
        result
    }
}

/// The subscriptions dispatch serves on, all taken before it announces itself.
struct ServedSubscriptions {
    /// One per [`Served::ALL`], in its order.
    worker_verbs: Vec<bus::async_nats::Subscriber>,
    cancels: bus::async_nats::Subscriber,
}

/// Subscribes to `task.ready` and `dispatch.wakeup` and spawns the task that wakes waiting
/// acquires on them until `stop`.
async fn spawn_waker(
    bus: &Bus,
    dispatch: Arc<Dispatch>,
    stop: CancellationToken,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let subjects = bus.subjects();
    let ready = bus
        .client()
        .subscribe(subjects.event(EventKind::TaskReady))
        .await
        .context("failed to subscribe to task.ready")?;
    let hints = bus
        .client()
        .subscribe(subjects.dispatch_wakeup())
        .await
        .context("failed to subscribe to dispatch wake-ups")?;
    let mut ready = futures::stream::select(ready, hints);
    let ready_subject = subjects.event(EventKind::TaskReady);
    Ok(tokio::spawn(inherit(async move {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                event = ready.next() => match event {
                    Some(message) => {
                        count_messages(Direction::Received, 1);
                        dispatch.wake(&ready_subject, &message);
                    }
                    None => return,
                },
            }
        }
    })))
}

/// Takes the queue subscriptions of the worker verbs and of clients' cancels.
async fn subscribe_served(bus: &Bus) -> anyhow::Result<ServedSubscriptions> {
    let subjects = bus.subjects();
    let mut worker_verbs = Vec::with_capacity(Served::ALL.len());
    for served in Served::ALL {
        worker_verbs.push(
            bus::serve::subscribe(bus, subjects.worker_wildcard(served.verb()), QUEUE_GROUP)
                .await
                .context("failed to serve the worker verbs")?,
        );
    }
    let cancels = bus::serve::subscribe(
        bus,
        subjects.client_wildcard(ClientVerb::Cancel),
        QUEUE_GROUP,
    )
    .await
    .context("failed to serve cancellations")?;
    Ok(ServedSubscriptions {
        worker_verbs,
        cancels,
    })
}

/// Spawns one server per subscription, each answering until `stop`.
fn spawn_servers(
    bus: &Bus,
    dispatch: &Arc<Dispatch>,
    subscriptions: ServedSubscriptions,
    stop: &CancellationToken,
) -> tokio::task::JoinSet<Result<(), bus::BusError>> {
    let mut servers = tokio::task::JoinSet::new();
    for (served, subscription) in Served::ALL.into_iter().zip(subscriptions.worker_verbs) {
        let dispatch = dispatch.clone();
        let bus = bus.clone();
        let stop = stop.clone();
        servers.spawn(inherit(async move {
            bus::serve::serve_subscribed(
                &bus,
                served.server_name(),
                subscription,
                QUEUE_GROUP,
                move |message| {
                    let dispatch = dispatch.clone();
                    async move { Some(dispatch.answer(served, &message).await) }
                },
                stop,
            )
            .await
        }));
    }
    let dispatch = dispatch.clone();
    let bus = bus.clone();
    let stop = stop.clone();
    servers.spawn(inherit(async move {
        bus::serve::serve_subscribed(
            &bus,
            "dispatch.cancel",
            subscriptions.cancels,
            QUEUE_GROUP,
            move |message| {
                let dispatch = dispatch.clone();
                async move {
                    let reply = dispatch
                        .cancel(message.subject.as_str(), &message.payload)
                        .await;
                    runtime::record_refusal(reply.error.as_ref());
                    Some(reply.encode_to_vec().into())
                }
            },
            stop,
        )
        .await
    }));
    servers
}

/// The range `PALISADE_DISPATCH_HEARTBEAT_MS` accepts.
const HEARTBEAT_MS: std::ops::RangeInclusive<u64> = 100..=10_000;

/// Says on `dispatch.ready` that this replica serves: at once, then every `heartbeat` until
/// `stop`, under an instance id of this start. Only a hint: workers that miss it recover at
/// their own request timeouts.
async fn announce(bus: Bus, heartbeat: Duration, stop: CancellationToken) {
    let instance_id = Uuid::new_v4().to_string();
    let payload: bytes::Bytes = v1::DispatchReady {
        instance_id: instance_id.clone(),
        heartbeat_ms: u32::try_from(heartbeat.as_millis()).unwrap_or(u32::MAX),
    }
    .encode_to_vec()
    .into();
    let subject = bus.subjects().dispatch_ready();
    tracing::info!(%instance_id, ?heartbeat, "dispatch serves; announcing it on {subject}");
    let mut ticks = tokio::time::interval(heartbeat);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = ticks.tick() => {}
        }
        match bus.publish_untraced(subject.clone(), payload.clone()).await {
            Ok(()) => failing = false,
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(error = %telemetry::chain(&error), "could not announce dispatch.ready");
            }
            Err(_) => {}
        }
    }
}

/// An acquire waiting for a decider, and where its answer goes.
struct QueuedAcquire {
    params: AcquireParams,
    answer: oneshot::Sender<Result<Acquired, v1::Error>>,
}

struct Dispatch {
    /// Where [`Dispatch::decide_acquire`] queues an acquire.
    queue_acquire: mpsc::UnboundedSender<QueuedAcquire>,
    pool: PgPool,
    bus: Bus,
    relay: Relay,
    settings: Settings,
    /// Acquires waiting for a task, woken one per ready task.
    waiters: Waiters,
}

fn internal(error: &StoreError) -> v1::Error {
    runtime::internal_error("dispatch's decision", &telemetry::chain(error), "retry")
}

impl Dispatch {
    /// A `task.ready` wakes one waiting acquire that may take the task; anything else on the
    /// wake-up subjects (the reaper's hint, an undecodable event) wakes them all.
    fn wake(&self, ready_subject: &str, message: &bus::async_nats::Message) {
        if message.subject.as_str() == ready_subject
            && let Ok(ready) = v1::TaskReady::decode(message.payload.as_ref())
            && let Ok(organization_id) = Uuid::parse_str(&ready.organization_id)
        {
            self.waiters
                .task_ready(organization_id, &ready.required_capabilities);
            return;
        }
        self.waiters.wake_all();
    }

    /// Decides a cancel; a cancel racing a completion can lose a deadlock, and the cancel is
    /// idempotent, so a transient failure is retried.
    async fn decide_cancel(
        &self,
        organization_id: Uuid,
        target: store::cancel::CancelTarget,
        reason: &str,
    ) -> Result<CancelOutcome, store::StoreError> {
        let cancel = || {
            store::cancel::cancel(
                &self.pool,
                self.bus.subjects(),
                Some(organization_id),
                target,
                reason,
            )
        };
        let mut outcome = cancel().await;
        for _ in 0..CANCEL_TRANSIENT_RETRIES_MAX {
            match &outcome {
                Err(error) if error.is_transient() => outcome = cancel().await,
                _ => break,
            }
        }
        outcome
    }

    /// Cancels a scan or a task of the organization the subject names; persisted before the
    /// reply says so.
    async fn cancel(&self, subject: &str, payload: &[u8]) -> v1::CancelReply {
        let refuse = |error: v1::Error| v1::CancelReply {
            error: Some(error),
            ..Default::default()
        };
        let parse::Cancel {
            organization_id,
            target,
            reason,
        } = match parse::cancel(self.bus.subjects(), subject, payload) {
            Ok(cancel) => cancel,
            Err(error) => return refuse(error),
        };
        let outcome = self.decide_cancel(organization_id, target, &reason).await;
        if let Ok(
            CancelOutcome::Cancelled { scan_id, .. }
            | CancelOutcome::AlreadyTerminal { scan_id, .. },
        ) = &outcome
        {
            // The request's span names the scan it acted on.
            tracing::Span::current().record("palisade.scan_id", tracing::field::display(scan_id));
        }
        match outcome {
            Ok(CancelOutcome::Cancelled {
                scan_id,
                trace_context,
            }) => {
                let by = self
                    .bus
                    .subjects()
                    .client_of(subject)
                    .map_or_else(String::new, |client| format!("client {}", client.client_id));
                runtime::trace_cancel(scan_id, trace_context.as_deref(), &by, &reason);
                self.relay.notify();
                v1::CancelReply {
                    error: None,
                    outcome: "cancelled".into(),
                    state: store::states::ScanState::Cancelled.as_str().into(),
                    scan_id: scan_id.to_string(),
                }
            }
            Ok(CancelOutcome::AlreadyTerminal { scan_id, state }) => v1::CancelReply {
                error: None,
                outcome: "already_terminal".into(),
                state,
                scan_id: scan_id.to_string(),
            },
            Ok(CancelOutcome::NotFound) => {
                refuse(v1::Error::new(ErrorCode::NotFound, "no such scan or task"))
            }
            Err(error) => refuse(internal(&error)),
        }
    }

    async fn answer(&self, served: Served, message: &bus::async_nats::Message) -> Bytes {
        let subject_worker = self.bus.subjects().worker_id_of(message.subject.as_str());
        let payload = &message.payload;
        let reply = match served {
            Served::Hello => {
                let error = |error| v1::HelloReply {
                    error: Some(error),
                    ..Default::default()
                };
                let reply = match self.hello(subject_worker, payload).await {
                    Ok(reply) => reply,
                    Err(refusal) => error(refusal),
                };
                runtime::record_refusal(reply.error.as_ref());
                reply.encode_to_vec()
            }
            Served::Acquire => {
                let reply = match self.acquire(subject_worker, payload).await {
                    Ok(leases) => v1::AcquireReply {
                        error: None,
                        leases,
                    },
                    Err(error) => v1::AcquireReply {
                        error: Some(error),
                        leases: Vec::new(),
                    },
                };
                runtime::record_refusal(reply.error.as_ref());
                reply.encode_to_vec()
            }
            Served::Renew => {
                let reply = match self.renew(subject_worker, payload).await {
                    Ok(reply) => reply,
                    Err(error) => v1::RenewReply {
                        error: Some(error),
                        ..Default::default()
                    },
                };
                // A lost lease is a refusal, of the whole renew or of one lease in a batch (the
                // first names the span's error); a cancellation is what someone asked for.
                let refused = std::iter::once(reply.error.as_ref())
                    .chain(reply.renewals.iter().map(|renewal| renewal.error.as_ref()))
                    .flatten()
                    .find(|error| error.error_code() != Some(ErrorCode::CancelRequested));
                runtime::record_refusal(refused);
                reply.encode_to_vec()
            }
            Served::Release => {
                let reply = v1::ReleaseReply {
                    error: self.release(subject_worker, payload).await.err(),
                };
                runtime::record_refusal(reply.error.as_ref());
                reply.encode_to_vec()
            }
            Served::Enroll => self.answer_enroll(subject_worker, payload).await,
            Served::Credentials => self.answer_credentials(subject_worker, payload).await,
        };
        reply.into()
    }

    /// Answers `enroll`.
    async fn answer_enroll(&self, subject_worker: Option<&str>, payload: &[u8]) -> Vec<u8> {
        let reply = self
            .enroll(subject_worker, payload)
            .await
            .unwrap_or_else(|error| v1::EnrollReply {
                error: Some(error),
                ..Default::default()
            });
        runtime::record_refusal(reply.error.as_ref());
        reply.encode_to_vec()
    }

    /// Answers `credentials`.
    async fn answer_credentials(&self, subject_worker: Option<&str>, payload: &[u8]) -> Vec<u8> {
        let reply = self
            .credentials(subject_worker, payload)
            .await
            .unwrap_or_else(|error| v1::CredentialsReply {
                error: Some(error),
                ..Default::default()
            });
        runtime::record_refusal(reply.error.as_ref());
        reply.encode_to_vec()
    }

    /// The enrollment key, or the refusal a worker gets when this dispatch has none.
    fn enroller(&self) -> Result<&identity::enrollment::Enroller, v1::Error> {
        self.settings.enroller.as_deref().ok_or_else(|| {
            v1::Error::new(
                ErrorCode::EnrollmentRefused,
                "this installation enrolls no workers: dispatch has no enrollment key (PALISADE_NATS_ENROLLMENT_KEY); ask its operator",
            )
        })
    }

    /// Signs a user JWT for `public_key` in `account`, valid for the credentials' lifetime.
    fn sign_credentials(
        &self,
        enroller: &identity::enrollment::Enroller,
        account: &str,
        worker_id: Uuid,
        public_key: &str,
    ) -> Result<(String, i64), v1::Error> {
        let expires = std::time::SystemTime::now() + self.settings.credentials_ttl;
        let expires_secs = expires
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |since| since.as_secs() as i64);
        let identity = messages::Identity::Worker { worker_id };
        enroller
            .sign_user(account, public_key, &identity.token(), expires_secs)
            .map(|jwt| (jwt, expires_secs * 1_000))
            .map_err(|error| v1::Error::new(ErrorCode::InvalidField, error.to_string()))
    }

    /// Reference 6.18: a worker's first credentials, for a one-time token.
    async fn enroll(
        &self,
        subject_worker: Option<&str>,
        payload: &[u8],
    ) -> Result<v1::EnrollReply, v1::Error> {
        let request = parse::enroll(subject_worker, payload)?;
        let enroller = self.enroller()?;
        let claim = store::enrollment::EnrollClaim {
            worker_id: request.worker_id,
            token_id: request.token_id,
            secret_sha256: &request.secret_sha256,
            public_key: &request.public_key,
            organization_ids: &request.organization_ids,
            capabilities: &request.capabilities,
        };
        match store::enrollment::enroll(&self.pool, &claim).await {
            Ok(store::enrollment::EnrollOutcome::Enrolled {
                account_public_key,
                organization_ids,
                capabilities,
            }) => {
                let (jwt, expires_at_unix_ms) = self.sign_credentials(
                    enroller,
                    &account_public_key,
                    request.worker_id,
                    &request.public_key,
                )?;
                tracing::info!(worker_id = %request.worker_id, token_id = %request.token_id, "worker enrolled");
                Ok(v1::EnrollReply {
                    error: None,
                    jwt,
                    expires_at_unix_ms,
                    organization_ids: organization_ids.iter().map(Uuid::to_string).collect(),
                    capabilities,
                })
            }
            Ok(store::enrollment::EnrollOutcome::Refused(reason)) => {
                Err(v1::Error::new(ErrorCode::EnrollmentRefused, reason))
            }
            Err(error) => Err(internal(&error)),
        }
    }

    /// Reference 6.19: an enrolled worker's credentials again, before they expire.
    async fn credentials(
        &self,
        subject_worker: Option<&str>,
        payload: &[u8],
    ) -> Result<v1::CredentialsReply, v1::Error> {
        let request = parse::credentials(subject_worker, payload)?;
        let enroller = self.enroller()?;
        match store::enrollment::renewal(&self.pool, request.worker_id, &request.public_key).await {
            Ok(store::enrollment::RenewalOutcome::Renew { account_public_key }) => {
                let (jwt, expires_at_unix_ms) = self.sign_credentials(
                    enroller,
                    &account_public_key,
                    request.worker_id,
                    &request.public_key,
                )?;
                Ok(v1::CredentialsReply {
                    error: None,
                    jwt,
                    expires_at_unix_ms,
                })
            }
            Ok(store::enrollment::RenewalOutcome::Refused(reason)) => {
                Err(v1::Error::new(ErrorCode::EnrollmentRefused, reason))
            }
            Err(error) => Err(internal(&error)),
        }
    }

    async fn hello(
        &self,
        subject_worker: Option<&str>,
        payload: &[u8],
    ) -> Result<v1::HelloReply, v1::Error> {
        let hello = parse::hello(subject_worker, payload)?;
        match store::lease::hello(&self.pool, &hello.params()).await {
            Ok(HelloOutcome::Accepted { organization_ids }) => Ok(v1::HelloReply {
                error: None,
                lease_ttl_ms: self.settings.lease.ttl.as_millis() as u32,
                renew_interval_ms: self.settings.lease.renew_interval.as_millis() as u32,
                batch_findings_max: self.settings.batch_limits.findings_max as u32,
                batch_bytes_max: self.settings.batch_limits.bytes_max as u32,
                organization_ids: organization_ids.iter().map(Uuid::to_string).collect(),
            }),
            Ok(HelloOutcome::Refused(error)) => Err(error),
            Err(error) => Err(internal(&error)),
        }
    }

    /// Grants leases at once when tasks are due; otherwise waits up to `wait_ms` in the queue
    /// of waiting acquires, trying again when woken for a ready task it may take, and on the
    /// poll interval.
    async fn acquire(
        &self,
        subject_worker: Option<&str>,
        payload: &[u8],
    ) -> Result<Vec<v1::Lease>, v1::Error> {
        let request = parse::acquire(subject_worker, payload)?;
        let params = AcquireParams {
            worker_id: request.worker_id,
            request_id: request.request_id,
            max_tasks: i64::from(request.max_tasks),
            lease_ttl: self.settings.lease.ttl,
        };
        let deadline =
            tokio::time::Instant::now() + Duration::from_millis(u64::from(request.wait_ms));
        let mut waiter: Option<crate::waiters::Waiter<'_>> = None;
        loop {
            // A dispatch that stops answers with no lease: the worker asks again, elsewhere.
            let Some(decided) = self.decide_acquire(params.clone()).await else {
                return Ok(Vec::new());
            };
            let eligibility = match decided? {
                (AcquireOutcome::Leases(leases), _) if !leases.is_empty() => {
                    return Ok(leases
                        .iter()
                        .map(|lease| runtime::traced_lease(lease, "dispatch"))
                        .collect());
                }
                (AcquireOutcome::Leases(_), eligibility) => eligibility,
                (AcquireOutcome::Refused(error), _) => return Err(error),
            };
            let now = tokio::time::Instant::now();
            if now >= deadline {
                return Ok(Vec::new());
            }
            let waiter = match &waiter {
                Some(waiter) => {
                    waiter.update(eligibility);
                    waiter
                }
                None => waiter.insert(self.waiters.join(eligibility)),
            };
            let pause = (deadline - now).min(self.settings.acquire_poll);
            let _ = bus::serve::long_poll(tokio::time::timeout(pause, waiter.woken())).await;
        }
    }

    /// Decides one look of an acquire together with whatever other acquires queued with it;
    /// `None` when dispatch is stopping (its deciders are gone).
    async fn decide_acquire(&self, params: AcquireParams) -> Option<Result<Acquired, v1::Error>> {
        let (answer, answered) = oneshot::channel();
        self.queue_acquire
            .send(QueuedAcquire { params, answer })
            .ok()?;
        answered.await.ok()
    }

    /// Decides acquires that queued together: those of distinct workers in one transaction
    /// (a worker's second acquire, a resent request, in the next), each alone when their
    /// shared transaction fails, so one acquire's failure is only its own.
    async fn decide_acquires(self: Arc<Self>, mut taken: Vec<QueuedAcquire>) {
        while !taken.is_empty() {
            let mut workers = std::collections::HashSet::new();
            let (round, later): (Vec<_>, Vec<_>) = taken
                .into_iter()
                .partition(|queued| workers.insert(queued.params.worker_id));
            taken = later;
            let mut staged = Staged::new(self.settings.common.progress_events);
            let params: Vec<AcquireParams> =
                round.iter().map(|queued| queued.params.clone()).collect();
            match store::lease::acquire_many(&self.pool, &mut staged, self.bus.subjects(), &params)
                .await
            {
                Ok(decided) => {
                    self.relay.hand_off(staged);
                    for (queued, acquired) in round.into_iter().zip(decided) {
                        let _ = queued.answer.send(Ok(acquired));
                    }
                }
                Err(error) if round.len() == 1 => {
                    let queued = round.into_iter().next().expect("one acquire");
                    let _ = queued.answer.send(Err(internal(&error)));
                }
                Err(error) => {
                    tracing::debug!(
                        error = %telemetry::chain(&error),
                        acquires = round.len(),
                        "acquires decided together failed; deciding each alone"
                    );
                    for queued in round {
                        Box::pin(self.clone().decide_acquires(vec![queued])).await;
                    }
                }
            }
        }
    }

    /// Renews one lease, or a worker's batch of them in one statement. The reply's top-level
    /// fields answer `lease` exactly as a single renew always has; a batch (a request with
    /// `more_leases`) also gets one answer per lease in `renewals`.
    async fn renew(
        &self,
        subject_worker: Option<&str>,
        payload: &[u8],
    ) -> Result<v1::RenewReply, v1::Error> {
        let parse::Renew { claims, batch } = parse::renew(subject_worker, payload)?;
        let outcomes = store::lease::renew_many(&self.pool, &claims, self.settings.lease.ttl)
            .await
            .map_err(|error| internal(&error))?;
        let mut renewals: Vec<v1::LeaseRenewal> = claims
            .claims()
            .iter()
            .zip(outcomes)
            .map(|(claim, outcome)| {
                let (error, lease_expires_in_ms) = match outcome {
                    RenewOutcome::Renewed {
                        lease_expires_in_ms,
                    } => (
                        None,
                        lease_expires_in_ms.clamp(0, i64::from(u32::MAX)) as u32,
                    ),
                    RenewOutcome::Refused(error) => (Some(error), 0),
                };
                v1::LeaseRenewal {
                    attempt_id: claim.attempt_id.to_string(),
                    error,
                    lease_expires_in_ms,
                }
            })
            .collect();
        let first = renewals[0].clone();
        if !batch {
            // A single renew's reply is what it has always been: no `renewals`.
            renewals.clear();
        }
        Ok(v1::RenewReply {
            error: first.error,
            lease_expires_in_ms: first.lease_expires_in_ms,
            renewals,
        })
    }

    async fn release(&self, subject_worker: Option<&str>, payload: &[u8]) -> Result<(), v1::Error> {
        let parse::Release { claim, reason } = parse::release(subject_worker, payload)?;
        let mut staged = Staged::new(self.settings.common.progress_events);
        let released = store::lease::release(
            &self.pool,
            &mut staged,
            self.bus.subjects(),
            &claim,
            &reason,
        )
        .await;
        match released {
            Ok(ReleaseOutcome::Released) => {
                self.relay.hand_off(staged);
                Ok(())
            }
            Ok(ReleaseOutcome::Refused(error)) => Err(error),
            Err(error) => Err(internal(&error)),
        }
    }
}
