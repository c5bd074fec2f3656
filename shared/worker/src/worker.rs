//! The [`Worker`]: ack subscription, hello, the acquire loop within capacity, and shutdown
//! that releases every lease still running.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use messages::{ErrorCode, WorkerVerb, limits, v1};
use telemetry::cost::{in_lane, inherit, lanes};
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use uuid::Uuid;

use crate::acks::AckRouter;
use crate::context::{Context, RequestError};
use crate::dispatchers::{Change, Dispatchers};
use crate::lease::{self, RELEASE_REASON_OVER_CAPACITY};
use crate::renew::{self, Renewals};
use crate::retry;
use crate::{Plugin, Session, WorkerConfig, WorkerError, WorkerStats};

/// Pause after an acquire that came back empty, so a dispatch that answers at once instead of
/// long-polling is not polled in a tight loop.
const ACQUIRE_EMPTY_PAUSE: Duration = Duration::from_millis(100);

/// A plugin's rules as dispatch takes them (reference 6.3 check 8): ids and kinds non-empty
/// and within their limits, each rule once.
fn check_rules(plugin: &str, rules: &[crate::Rule]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    for rule in rules {
        let bad = |text: &str, max: usize| text.is_empty() || text.len() > max;
        if bad(rule.id, limits::IDENTIFIER_BYTES_MAX)
            || rule.applies_to.is_empty()
            || rule.applies_to.len() > limits::RULE_KINDS_MAX
            || rule
                .applies_to
                .iter()
                .any(|kind| bad(kind, limits::RESOURCE_KIND_BYTES_MAX))
        {
            return Err(format!(
                "plugin {plugin:?} declares rule {:?} with an empty or too long id, or not 1..={} \
                 resource kinds of at most {} bytes",
                rule.id,
                limits::RULE_KINDS_MAX,
                limits::RESOURCE_KIND_BYTES_MAX
            ));
        }
        if !seen.insert(rule.id) {
            return Err(format!(
                "plugin {plugin:?} declares rule {:?} twice",
                rule.id
            ));
        }
    }
    Ok(())
}

/// A worker process's connection to palisade: runs the plugins it was built with on the
/// tasks dispatch leases to it.
pub struct Worker {
    bus: bus::Bus,
    config: WorkerConfig,
    plugins: HashMap<&'static str, Arc<dyn Plugin>>,
    stats: Arc<WorkerStats>,
}

impl std::fmt::Debug for Worker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Worker")
            .field("config", &self.config)
            .field("plugins", &self.capabilities())
            .finish()
    }
}

impl Worker {
    /// Checks `config` and the plugin set (at least one, names unique and non-empty).
    pub fn new(
        bus: bus::Bus,
        config: WorkerConfig,
        plugins: Vec<Arc<dyn Plugin>>,
    ) -> Result<Self, WorkerError> {
        config.validate()?;
        let invalid = |reason: String| Err(WorkerError::InvalidConfig { reason });
        if plugins.is_empty() {
            return invalid("a worker needs at least one plugin".into());
        }
        if plugins.len() > limits::WORKER_CAPABILITIES_MAX {
            return invalid(format!(
                "{} plugins is over the protocol's {} capabilities",
                plugins.len(),
                limits::WORKER_CAPABILITIES_MAX
            ));
        }
        let mut by_name = HashMap::new();
        for plugin in plugins {
            let name = plugin.name();
            if name.is_empty() || name.len() > limits::IDENTIFIER_BYTES_MAX {
                return invalid(format!("plugin name {name:?} is empty or too long"));
            }
            if let Err(reason) = check_rules(name, plugin.rules()) {
                return invalid(reason);
            }
            if by_name.insert(name, plugin).is_some() {
                return invalid(format!("two plugins are named {name:?}"));
            }
        }
        let rules: usize = by_name.values().map(|plugin| plugin.rules().len()).sum();
        if rules > limits::WORKER_RULES_MAX {
            return invalid(format!(
                "the plugins declare {rules} rules, over the protocol's {}",
                limits::WORKER_RULES_MAX
            ));
        }
        Ok(Self {
            bus,
            config,
            plugins: by_name,
            stats: Arc::default(),
        })
    }

    /// The counters of this worker, live while it runs.
    pub fn stats(&self) -> Arc<WorkerStats> {
        self.stats.clone()
    }

    /// The plugin names this worker advertises, sorted.
    pub fn capabilities(&self) -> Vec<String> {
        let mut names: Vec<String> = self.plugins.keys().map(|name| (*name).to_owned()).collect();
        names.sort();
        names
    }

    /// The rules its plugins declare ([`Plugin::rules`]), as its hello carries them: by plugin
    /// name, then in each plugin's order.
    pub fn declared_rules(&self) -> Vec<v1::RuleDeclaration> {
        let mut plugins: Vec<(&&str, &Arc<dyn Plugin>)> = self.plugins.iter().collect();
        plugins.sort_by_key(|(name, _)| **name);
        plugins
            .into_iter()
            .flat_map(|(name, plugin)| {
                plugin.rules().iter().map(|rule| v1::RuleDeclaration {
                    plugin: (*name).to_owned(),
                    rule_id: rule.id.to_owned(),
                    resource_kinds: rule.applies_to.iter().map(|k| (*k).to_owned()).collect(),
                })
            })
            .collect()
    }

    /// Runs until `shutdown` fires, then releases every running lease (waiting at most
    /// [`WorkerConfig::shutdown_grace`]). Returns an error only for what retrying cannot fix:
    /// dispatch refusing this worker, a reply this build cannot read, a NATS subscription
    /// that fails. Timeouts and unanswered requests are retried with backoff.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), WorkerError> {
        let worker_id = self.config.worker_id.to_string();
        // Gives every log line the worker id; never exported (a process-lifetime trace would
        // grow without end): its hellos, acquires and renewals are short traces of their own.
        let span =
            tracing::info_span!(target: telemetry::UNTRACED, "worker", worker_id = %worker_id);
        let running = async move {
            // Subscribe before sending anything: ingestion's first acknowledgement must
            // find the subscription in place.
            let ack_subject = self.bus.subjects().worker(&worker_id, WorkerVerb::Ack);
            let subscription = self
                .bus
                .client()
                .subscribe(ack_subject.clone())
                .await
                .map_err(|error| bus::BusError::Subscribe {
                    subject: ack_subject,
                    message: error.to_string(),
                })?;
            // Dispatch replicas announce themselves and then heartbeat: an acquire or hello
            // still unanswered when one starts or falls silent (it may have died holding it)
            // is sent again at once.
            let ready_subject = self.bus.subjects().dispatch_ready();
            let mut ready_hints = self
                .bus
                .client()
                .subscribe(ready_subject.clone())
                .await
                .map_err(|error| bus::BusError::Subscribe {
                    subject: ready_subject,
                    message: error.to_string(),
                })?;
            self.bus.flush().await?;
            let dispatch_ready = Arc::new(Notify::new());
            let ready_task = tokio::spawn({
                let dispatch_ready = dispatch_ready.clone();
                async move {
                    let mut dispatchers = Dispatchers::default();
                    loop {
                        let silence = dispatchers.next_silence();
                        let change = tokio::select! {
                            hint = ready_hints.next() => match hint {
                                Some(hint) => dispatchers.heard(&hint.payload, Instant::now()),
                                None => return,
                            },
                            () = sleep_until(silence) => dispatchers.forget_silent(Instant::now()),
                        };
                        match change {
                            Change::None => {}
                            Change::Started => {
                                tracing::debug!("a dispatch replica started");
                                dispatch_ready.notify_waiters();
                            }
                            Change::Silent => {
                                tracing::info!("a dispatch replica fell silent; an unanswered request is sent again");
                                dispatch_ready.notify_waiters();
                            }
                        }
                    }
                }
            });
            let router = Arc::new(AckRouter::default());
            let router_task = tokio::spawn(inherit(router.clone().run(subscription)));
            let result = self
                .serve(worker_id, &router, &dispatch_ready, &shutdown)
                .await;
            router_task.abort();
            ready_task.abort();
            let stats = self.stats.snapshot();
            tracing::info!(?stats, "worker stopped");
            result
        }
        .instrument(span);
        // Charged to the worker lane when it shares a process with palisade's services.
        in_lane(lanes::WORKER, running).await
    }

    async fn serve(
        &self,
        worker_id: String,
        router: &Arc<AckRouter>,
        dispatch_ready: &Notify,
        shutdown: &CancellationToken,
    ) -> Result<(), WorkerError> {
        let Some(session) = self.hello(&worker_id, dispatch_ready, shutdown).await? else {
            return Ok(());
        };
        tracing::info!(
            lease_ttl_ms = session.lease_ttl.as_millis() as u64,
            renew_interval_ms = session.renew_interval.as_millis() as u64,
            batch_findings_max = session.batch_findings_max,
            batch_bytes_max = session.batch_bytes_max,
            organizations = session.organization_ids.len(),
            capabilities = ?self.capabilities(),
            "worker ready"
        );
        let ctx = Arc::new(Context {
            bus: self.bus.clone(),
            worker_id,
            config: self.config.clone(),
            session,
            stats: self.stats.clone(),
            renewals: Renewals::default(),
            router: router.clone(),
            plugins: self.plugins.clone(),
        });
        // One renewer for every lease of the session; it outlives the lease tasks.
        let renewer_stop = CancellationToken::new();
        let renewer =
            tokio::spawn(inherit(renew::run(ctx.clone(), renewer_stop.clone())).in_current_span());
        // Lease tasks stop on this, whether the caller shuts down or acquiring hit an error.
        let stop = shutdown.child_token();
        let mut leases = JoinSet::new();
        let result = self
            .acquire_loop(&ctx, dispatch_ready, &stop, &mut leases)
            .await;
        stop.cancel();
        let drained = tokio::time::timeout(self.config.shutdown_grace, async {
            while leases.join_next().await.is_some() {}
        })
        .await;
        if drained.is_err() {
            tracing::warn!(
                remaining = leases.len(),
                "leases still running after the shutdown grace, abandoning them to expiry"
            );
            leases.abort_all();
            while leases.join_next().await.is_some() {}
        }
        renewer_stop.cancel();
        let _ = renewer.await;
        result
    }

    /// Says hello until dispatch answers; `None` when shut down first.
    async fn hello(
        &self,
        worker_id: &str,
        dispatch_ready: &Notify,
        shutdown: &CancellationToken,
    ) -> Result<Option<Session>, WorkerError> {
        let request = v1::HelloRequest {
            schema_version: messages::SCHEMA_VERSION,
            worker_id: worker_id.to_owned(),
            software_version: self.config.software_version.clone(),
            protocol_version: messages::PROTOCOL_VERSION.to_owned(),
            capabilities: self.capabilities(),
            capacity: self.config.capacity,
            rules: self.declared_rules(),
        };
        let subject = self.bus.subjects().worker(worker_id, WorkerVerb::Hello);
        let mut failures = 0;
        loop {
            let payload = bytes::Bytes::from(prost::Message::encode_to_vec(&request));
            let reply = tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                () = dispatch_ready.notified() => continue,
                reply = self.bus.request(subject.clone(), payload, self.config.request_timeout) => reply,
            };
            match reply.map(|message| prost::Message::decode(message.payload)) {
                Ok(Ok(v1::HelloReply {
                    error: Some(error), ..
                })) if error.error_code() != Some(ErrorCode::Internal) => {
                    return Err(WorkerError::refused("hello", &error));
                }
                Ok(Ok(reply @ v1::HelloReply { error: None, .. })) => {
                    let server_payload_max = self.bus.client().server_info().max_payload;
                    return Session::from_reply(&reply, server_payload_max).map(Some);
                }
                Ok(Ok(v1::HelloReply {
                    error: Some(error), ..
                })) => {
                    tracing::warn!(code = %error.code, message = %error.message, "dispatch failed on hello, retrying");
                }
                Ok(Err(source)) => {
                    return Err(WorkerError::Decode {
                        what: "hello",
                        source,
                    });
                }
                Err(error) => {
                    tracing::warn!(error = %telemetry::chain(&error), "hello unanswered, is dispatch running? retrying");
                }
            }
            failures += 1;
            let delay = retry::REQUESTS.jittered(failures);
            tokio::select! {
                () = shutdown.cancelled() => return Ok(None),
                () = dispatch_ready.notified() => {}
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Asks for as many leases as there is free capacity, runs each in its own task, and
    /// repeats until `stop`.
    async fn acquire_loop(
        &self,
        ctx: &Arc<Context>,
        dispatch_ready: &Notify,
        stop: &CancellationToken,
        leases: &mut JoinSet<()>,
    ) -> Result<(), WorkerError> {
        let permits = Arc::new(Semaphore::new(self.config.capacity as usize));
        let mut refusals = 0;
        loop {
            // Finished lease tasks leave their results in the set until joined.
            while leases.try_join_next().is_some() {}
            let first = tokio::select! {
                () = stop.cancelled() => return Ok(()),
                permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
            };
            let mut held = vec![first];
            while held.len() < limits::ACQUIRE_TASKS_MAX as usize {
                match permits.clone().try_acquire_owned() {
                    Ok(permit) => held.push(permit),
                    Err(_) => break,
                }
            }
            let request = v1::AcquireRequest {
                schema_version: messages::SCHEMA_VERSION,
                worker_id: ctx.worker_id.clone(),
                request_id: Uuid::new_v4().to_string(),
                max_tasks: held.len() as u32,
                wait_ms: self.config.acquire_wait.as_millis() as u32,
            };
            let Some((reply, granted_at)) =
                self.acquire(ctx, &request, dispatch_ready, stop).await?
            else {
                return Ok(());
            };
            if let Some(error) = reply.error {
                if is_fatal(&error) {
                    return Err(WorkerError::refused("acquire", &error));
                }
                refusals += 1;
                tracing::warn!(code = %error.code, message = %error.message, "acquire refused, retrying");
                let delay = retry::REQUESTS.jittered(refusals);
                tokio::select! {
                    () = stop.cancelled() => return Ok(()),
                    () = tokio::time::sleep(delay) => {}
                }
                continue;
            }
            refusals = 0;
            let granted = reply.leases.len();
            for lease in reply.leases {
                self.start_lease(ctx, stop, leases, &mut held, lease, granted_at)
                    .await;
            }
            if granted == 0 && !stop.is_cancelled() {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = tokio::time::sleep(ACQUIRE_EMPTY_PAUSE) => {}
                }
            }
        }
    }

    /// Sends `request` until a reply arrives, resending it unchanged (same request id, so
    /// dispatch answers with the leases it may already have granted) after a timeout. Returns
    /// the reply and when it arrived; `None` when stopped before a reply.
    async fn acquire(
        &self,
        ctx: &Context,
        request: &v1::AcquireRequest,
        dispatch_ready: &Notify,
        stop: &CancellationToken,
    ) -> Result<Option<(v1::AcquireReply, Instant)>, WorkerError> {
        // Dispatch computes `lease_expires_in_ms` when it answers (a replayed request id gets
        // what remains of the original lease), so the reply's arrival is the origin, off by
        // one network hop only. A send time is not: a long-poll may be answered seconds after
        // it was sent, with a lease granted just before the answer.
        let timeout = self.config.acquire_wait + self.config.request_timeout;
        let mut failures = 0;
        loop {
            // Not raced against `stop`: a reply on its way may carry leases, and they are
            // released below rather than left to expire. Raced against a dispatch starting:
            // the long-poll may have died with its dispatch, and the same request id sent
            // again gets whatever that one granted.
            let reply = tokio::select! {
                reply = ctx.request::<v1::AcquireReply>(WorkerVerb::Acquire, request, timeout) => reply,
                () = dispatch_ready.notified() => {
                    tracing::info!(request_id = %request.request_id, "a dispatch replica started or fell silent; asking again with the same request id");
                    continue;
                }
            };
            match reply {
                Ok(reply) => return Ok(Some((reply, Instant::now()))),
                Err(RequestError::Decode(source)) => {
                    return Err(WorkerError::Decode {
                        what: "acquire",
                        source,
                    });
                }
                Err(RequestError::Bus(error)) => {
                    failures += 1;
                    tracing::warn!(error = %telemetry::chain(&error), request_id = %request.request_id, failures, "acquire unanswered, retrying with the same request id");
                }
            }
            let delay = retry::REQUESTS.jittered(failures);
            tokio::select! {
                () = stop.cancelled() => return Ok(None),
                () = dispatch_ready.notified() => {}
                () = tokio::time::sleep(delay) => {}
            }
        }
    }

    /// Runs a granted lease in its own task, in the slot of one of the `held` permits.
    async fn start_lease(
        &self,
        ctx: &Arc<Context>,
        stop: &CancellationToken,
        leases: &mut JoinSet<()>,
        held: &mut Vec<OwnedSemaphorePermit>,
        lease: v1::Lease,
        granted_at: Instant,
    ) {
        let Some(permit) = held.pop() else {
            tracing::error!(plugin = %lease.plugin, "dispatch granted more leases than asked for");
            if let Some(lease_ref) = &lease.lease {
                ctx.release(lease_ref, RELEASE_REASON_OVER_CAPACITY).await;
            }
            return;
        };
        let Some(run) = lease::prepare(ctx, stop, lease, permit, granted_at).await else {
            return;
        };
        leases.spawn(inherit(lease::run(ctx.clone(), run, stop.clone())));
    }
}

/// Refusals of acquire that retrying cannot fix; anything else (internal errors, codes this
/// build does not know) is retried with backoff.
fn is_fatal(error: &v1::Error) -> bool {
    matches!(
        error.error_code(),
        Some(
            ErrorCode::UnknownWorker
                | ErrorCode::WorkerDisabled
                | ErrorCode::UnsupportedSchemaVersion
                | ErrorCode::MalformedMessage
                | ErrorCode::InvalidField
                | ErrorCode::TooLarge
        )
    )
}

/// Sleeps until `at`, or forever when there is no `at`.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
