//! One lease, from grant to its end: run the plugin, stream its results as batches until each
//! is acknowledged, then complete or fail the attempt, all while a renewer keeps the lease
//! alive. The task stops without a word when the lease is lost, and releases it on shutdown.
//!
//! ```text
//! Running ──plugin Ok──▶ Draining ──every batch acked──▶ Finishing(complete) ──ack──▶ Completed
//!    │                      ▲                                  │
//!    │                      └────────── batch_missing ─────────┘
//!    └──plugin Err / deadline / refused batch──▶ Finishing(fail) ──ack──▶ Failed
//! any phase: lease_lost / cancel_requested / expiry ▶ Lost; shutdown ▶ Released
//! ```

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use messages::retry::RetryPolicy;
use messages::{ErrorCode, WorkerVerb, limits, v1};
use prost::Message as _;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tokio::task::{JoinError, JoinHandle};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use crate::acks::{AckRouter, Route, Waiting};
use crate::batch::{self, Batcher};
use crate::config::Session;
use crate::context::Context;
use crate::plugin::{Plugin, PluginError, ResultItem, ResultSink, TaskInput};
use crate::renew::{LeaseLoss, Renewal};

use crate::stats::Counter;

/// Batches sent and not yet acknowledged before the plugin's sink stops taking results: bounds
/// what is resent after an outage, and how far a plugin can outrun ingestion.
pub(crate) const BATCHES_UNACKED_MAX: usize = 64;
/// Results a plugin can push before the SDK has cut them into batches.
pub(crate) const SINK_QUEUE_MAX: usize = 256;
/// A partly filled batch is sent after this, so a long scan's findings show up as it runs.
pub(crate) const BATCH_LINGER: Duration = Duration::from_secs(1);
/// Sends of one message (batch, completion or failure) without an acknowledgement before the
/// attempt is abandoned to the reaper; with the resend backoff this is about a quarter hour.
pub(crate) const SENDS_MAX: u32 = 20;
/// A message JetStream did not confirm (no PubAck: a stream electing a leader on a NATS cluster,
/// a connection lost) is published again after this, under the same `Nats-Msg-Id`, rather than
/// after the acknowledgement timeout: it was most likely never stored, and if it was, the
/// stream drops the repeat. Such repeats neither count against [`SENDS_MAX`] nor grow the
/// resend backoff.
pub(crate) const REPUBLISH_DELAY: Duration = Duration::from_millis(500);
/// A message refused at this worker's quota of waiting results (or waiting behind such
/// messages) is published again as soon as ingestion decides one of the worker's messages of
/// its verb ([`AckRouter::room`]), or after this when no acknowledgement says so (one lost:
/// they travel on core NATS). Not sooner: while ingestion is behind, trying again on a timer
/// only adds refusals.
pub(crate) const ROOM_WAIT_MAX: Duration = Duration::from_secs(5);
/// Whether the warning that results are at their quota is due: at most once per
/// [`QUOTA_WARNING_EVERY`] in a process.
fn quota_warning_due() -> bool {
    use std::sync::atomic::{AtomicU64, Ordering};
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_secs());
    let last = LAST.load(Ordering::Relaxed);
    now >= last + QUOTA_WARNING_EVERY.as_secs()
        && LAST
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
}

/// How often a worker says its results are at their quota.
const QUOTA_WARNING_EVERY: Duration = Duration::from_secs(30);

/// Completions answered with `batch_missing` before the attempt fails: each answer should
/// have been the last, so repeated ones mean a bug, not bad luck.
pub(crate) const COMPLETE_ROUNDS_MAX: u32 = 5;
/// Encoded result bytes one attempt may produce; every batch is kept until completion (to
/// answer `batch_missing`), so this bounds the attempt's memory.
pub(crate) const ATTEMPT_RESULT_BYTES_MAX: usize = 256 * 1024 * 1024;
/// How long a cancelled plugin gets to return before it is aborted.
pub(crate) const PLUGIN_STOP_GRACE: Duration = Duration::from_secs(2);
/// The release reason dispatch records on shutdown.
pub(crate) const RELEASE_REASON_SHUTDOWN: &str = "worker shutting down";
/// The release reason for leases granted beyond what the worker asked for.
pub(crate) const RELEASE_REASON_OVER_CAPACITY: &str = "worker over capacity";

/// How a lease ended; each is counted in [`crate::WorkerStats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Outcome {
    Completed,
    Failed,
    Lost(LeaseLoss),
    Released,
    Abandoned,
}

/// Everything a lease task needs, handed over by the acquire loop.
pub(crate) struct LeaseRun {
    pub lease: v1::Lease,
    pub lease_ref: v1::LeaseRef,
    /// `None` when this worker has no plugin of the lease's name.
    pub plugin: Option<Arc<dyn Plugin>>,
    /// When the acquire reply that granted the lease arrived: the lease's clocks (expiry,
    /// execution deadline) are measured from here, as dispatch computed them when answering.
    pub granted_at: Instant,
    pub acks: mpsc::Receiver<v1::IngestAck>,
    pub route: Route,
    pub permit: OwnedSemaphorePermit,
}

/// A lease ready to run, with the span its work is recorded in.
pub(crate) struct Prepared {
    run: LeaseRun,
    span: tracing::Span,
}

/// Makes a granted lease (from an acquire, or handed with a completion's acknowledgement) ready
/// to run in `permit`'s slot: its acknowledgements routed to it, its plugin found, its span in
/// the scan's trace. `None` when it cannot run: malformed (ignored), already running, or the
/// worker is stopping (released).
pub(crate) async fn prepare(
    ctx: &Arc<Context>,
    stop: &CancellationToken,
    lease: v1::Lease,
    permit: OwnedSemaphorePermit,
    granted_at: Instant,
) -> Option<Prepared> {
    let Some(lease_ref) = lease.lease.clone().filter(|lease_ref| {
        !lease_ref.task_id.is_empty()
            && !lease_ref.attempt_id.is_empty()
            && !lease_ref.lease_token.is_empty()
    }) else {
        tracing::error!(plugin = %lease.plugin, "a lease without ids was granted, ignored");
        return None;
    };
    ctx.stats.add(Counter::LeasesAcquired);
    if stop.is_cancelled() {
        ctx.release(&lease_ref, RELEASE_REASON_SHUTDOWN).await;
        return None;
    }
    let Some((route, acks)) = ctx.router.register(&lease_ref.attempt_id) else {
        tracing::error!(attempt_id = %lease_ref.attempt_id, "a lease was granted for an attempt already running, ignored");
        return None;
    };
    // The execution span joins the scan's trace as a child of the grant's lease span; every
    // batch, completion and failure the lease publishes is its child.
    let span = tracing::info_span!(
        "lease",
        otel.name = %format!("execute {}", lease.plugin),
        otel.kind = "consumer",
        palisade.service = "worker",
        palisade.scan_id = %lease.scan_id,
        palisade.task_id = %lease_ref.task_id,
        task_id = %lease_ref.task_id,
        attempt_id = %lease_ref.attempt_id,
        attempt_number = lease_ref.attempt_number,
        plugin = %lease.plugin,
        scan_id = %lease.scan_id,
    );
    bus::trace::set_parent_from_traceparent(&span, &lease.traceparent);
    span.in_scope(|| tracing::info!(target = %lease.target, "lease granted"));
    let run = LeaseRun {
        plugin: ctx.plugins.get(lease.plugin.as_str()).cloned(),
        lease,
        lease_ref,
        granted_at,
        acks,
        route,
        permit,
    };
    Some(Prepared { run, span })
}

/// Runs a lease to its end, then, in the same slot, each lease handed with its completion's
/// acknowledgement (the scan's next plugin), until one ends without.
pub(crate) async fn run(ctx: Arc<Context>, first: Prepared, stop: CancellationToken) {
    let mut next = Some(first);
    while let Some(Prepared { run, span }) = next.take() {
        let handed = run_one(ctx.clone(), run, stop.clone())
            .instrument(span)
            .await;
        if let Some((lease, permit, granted_at)) = handed {
            next = prepare(&ctx, &stop, lease, permit, granted_at).await;
        }
    }
}

/// Runs one lease to its end and counts the outcome; returns the lease its completion's
/// acknowledgement handed on, with the slot's permit and when it arrived.
async fn run_one(
    ctx: Arc<Context>,
    run: LeaseRun,
    stop: CancellationToken,
) -> Option<(v1::Lease, OwnedSemaphorePermit, Instant)> {
    let LeaseRun {
        lease,
        lease_ref,
        plugin,
        granted_at,
        acks,
        route,
        permit,
    } = run;
    let _running = ctx.stats.running();
    let expires_at = granted_at + Duration::from_millis(lease.lease_expires_in_ms.into());
    let deadline = (lease.execution_deadline_in_ms > 0)
        .then(|| granted_at + Duration::from_millis(lease.execution_deadline_in_ms));
    // Renewed by the session's renewer with the worker's other leases, until it ends.
    let renewal = ctx
        .renewals
        .hold(lease_ref.clone(), expires_at, ctx.session.renew_interval);
    let plugin = start_plugin(&ctx, &lease, &lease_ref, plugin);
    let mut task = LeaseTask::new(
        ctx.clone(),
        lease_ref.clone(),
        deadline,
        stop,
        plugin,
        acks,
        renewal,
    );
    let outcome = task.drive().await;
    task.renewal.end();
    task.stop_plugin().await;
    if outcome == Outcome::Released {
        ctx.release(&lease_ref, RELEASE_REASON_SHUTDOWN).await;
    }
    record(&ctx, outcome);
    drop(route);
    let next = hand_on(&ctx, std::mem::take(&mut task.handed)).await;
    next.map(|lease| (lease, permit, task.handed_at))
}

/// A plugin running in a task of its own.
struct StartedPlugin {
    cancel: CancellationToken,
    task: JoinHandle<Result<String, PluginError>>,
    /// What it pushes into its sink.
    results: mpsc::Receiver<ResultItem>,
}

/// Starts the lease's plugin (or, when this worker has none of its name, a permanent
/// `unknown_plugin` failure) on the lease's input, with a sink that uploads its artifacts
/// under the lease.
fn start_plugin(
    ctx: &Arc<Context>,
    lease: &v1::Lease,
    lease_ref: &v1::LeaseRef,
    plugin: Option<Arc<dyn Plugin>>,
) -> StartedPlugin {
    let cancel = CancellationToken::new();
    let (sink, results) = ResultSink::channel(SINK_QUEUE_MAX);
    let sink = sink.with_artifacts(Arc::new(crate::artifacts::LeaseUploader {
        ctx: ctx.clone(),
        lease: lease_ref.clone(),
    }));
    let input = TaskInput {
        plugin: lease.plugin.clone(),
        target: lease.target.clone(),
        discovered_assets: lease.discovered_assets.clone(),
        scan_id: lease.scan_id.clone(),
        scan_job_id: lease.scan_job_id.clone(),
        organization_id: lease.organization_id.clone(),
        task_id: lease_ref.task_id.clone(),
        attempt_number: lease_ref.attempt_number,
        position: lease.position,
    };
    let task = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            match plugin {
                Some(plugin) => plugin.run(input, sink, cancel).await,
                None => Err(PluginError::permanent(
                    "unknown_plugin",
                    format!("this worker has no plugin {:?}", input.plugin),
                )),
            }
        })
    };
    StartedPlugin {
        cancel,
        task,
        results,
    }
}

/// The lease handed on by the completion's acknowledgement, if any. At most one lease is
/// handed on (a scan runs one plugin at a time); any other is given back rather than run
/// beyond the worker's capacity.
async fn hand_on(ctx: &Context, handed: Vec<v1::Lease>) -> Option<v1::Lease> {
    let mut handed = handed.into_iter();
    let next = handed.next();
    for extra in handed {
        if let Some(extra) = &extra.lease {
            ctx.release(extra, RELEASE_REASON_OVER_CAPACITY).await;
        }
    }
    next
}

fn record(ctx: &Context, outcome: Outcome) {
    match outcome {
        Outcome::Completed => {
            ctx.stats.add(Counter::Completed);
            tracing::info!("attempt completed");
        }
        Outcome::Failed => {
            ctx.stats.add(Counter::Failed);
            tracing::info!("attempt failed");
        }
        Outcome::Lost(loss) => {
            ctx.stats.add(Counter::Lost);
            tracing::info!(reason = loss.as_str(), "lease ended, work stopped");
            // A cancellation is what was asked for; a lost or expired lease is a failure of
            // this attempt (another one runs the task).
            if loss != LeaseLoss::Cancelled {
                telemetry::record_error(
                    &tracing::Span::current(),
                    loss.as_str(),
                    "the lease was lost: the work stopped and another attempt runs the task",
                );
            }
        }
        // Counted by the release itself, which may not be answered.
        Outcome::Released => {}
        Outcome::Abandoned => {
            ctx.stats.add(Counter::Abandoned);
            tracing::error!("attempt abandoned; its lease will expire and the reaper retries it");
            telemetry::record_error(
                &tracing::Span::current(),
                "abandoned",
                "the attempt's messages were never acknowledged; its lease expires and the reaper retries it",
            );
        }
    }
}

/// Where the attempt is (see the diagram in the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Phase {
    Running,
    /// The plugin succeeded; waiting for every batch's acknowledgement before completing.
    Draining {
        summary: String,
    },
    /// The completion is sent; waiting for its acknowledgement.
    Completing {
        summary: String,
    },
    /// The failure is sent; waiting for its acknowledgement.
    Failing,
}

/// What one event leads to.
#[derive(Debug)]
enum Step {
    Continue,
    /// Stop the plugin and send this failure.
    Fail(PluginError),
    End(Outcome),
}

/// A message sent to the results stream and kept until acknowledged.
#[derive(Debug)]
struct Outbound {
    /// Which of the worker's durable verbs it is: its quota of waiting messages is per verb.
    verb: WorkerVerb,
    subject: String,
    first_msg_id: String,
    message: Bytes,
    /// Sends so far; the next send's `Nats-Msg-Id` is derived from it.
    sends: u32,
    /// Whether JetStream confirmed the current send (its PubAck arrived).
    stored: bool,
    /// Counted among its verb's messages waiting for room under the worker's quota.
    waiting: Option<Waiting>,
}

/// The last message of an attempt: its completion or failure.
#[derive(Debug)]
struct Last {
    outbound: Outbound,
    resend_at: Instant,
}

struct LeaseTask {
    ctx: Arc<Context>,
    lease: v1::LeaseRef,
    result_subject: String,
    deadline: Option<Instant>,
    stop: CancellationToken,
    plugin_cancel: CancellationToken,
    plugin_task: JoinHandle<Result<String, PluginError>>,
    results: mpsc::Receiver<ResultItem>,
    acks: mpsc::Receiver<v1::IngestAck>,
    renewal: Renewal,
    batcher: Batcher,
    /// When the first result of the batch being filled arrived.
    batch_started_at: Option<Instant>,
    /// Every batch of this attempt, indexed by sequence number. Kept after acknowledgement:
    /// a completion answered with `batch_missing` resends them.
    batches: Vec<Outbound>,
    /// Sequence number → when to resend, for batches not yet acknowledged.
    unacked: BTreeMap<u32, Instant>,
    result_bytes: usize,
    last: Option<Last>,
    complete_rounds: u32,
    /// Sends of the completion in earlier rounds: the next one's `Nats-Msg-Id` follows on.
    complete_sends: u32,
    /// The plugin finished and its last partial batch (if any) is still in the batcher.
    final_pending: bool,
    /// Leases the completion's acknowledgement handed on, and when it arrived.
    handed: Vec<v1::Lease>,
    handed_at: Instant,
}

impl LeaseTask {
    /// A lease task at the start of its attempt: running, nothing sent yet.
    fn new(
        ctx: Arc<Context>,
        lease: v1::LeaseRef,
        deadline: Option<Instant>,
        stop: CancellationToken,
        plugin: StartedPlugin,
        acks: mpsc::Receiver<v1::IngestAck>,
        renewal: Renewal,
    ) -> Self {
        Self {
            batcher: Batcher::new(ctx.session.batch_findings_max, ctx.session.batch_bytes_max),
            result_subject: ctx.subject(WorkerVerb::Result),
            ctx,
            lease,
            deadline,
            stop,
            plugin_cancel: plugin.cancel,
            plugin_task: plugin.task,
            results: plugin.results,
            acks,
            renewal,
            batch_started_at: None,
            batches: Vec::new(),
            unacked: BTreeMap::new(),
            result_bytes: 0,
            last: None,
            complete_rounds: 0,
            complete_sends: 0,
            final_pending: false,
            handed: Vec::new(),
            handed_at: Instant::now(),
        }
    }

    async fn drive(&mut self) -> Outcome {
        let mut phase = Phase::Running;
        let mut sink_open = true;
        loop {
            let running = phase == Phase::Running;
            let resend_at = self.next_resend_at();
            let linger_at = self.batch_started_at.map(|started| started + BATCH_LINGER);
            let deadline_armed = matches!(phase, Phase::Running | Phase::Draining { .. });
            let taking_results = running && sink_open && self.unacked.len() < BATCHES_UNACKED_MAX;
            // A sent completion is waited for, through a shutdown (within the worker's grace) and
            // through a refused renewal (ingestion may just have accepted it, so the attempt no
            // longer holds a lease): its acknowledgement says how it ended, and may hand on a
            // lease, which would be lost with nobody listening.
            let completing = matches!(phase, Phase::Completing { .. });
            let unstored = self.unstored_verb();
            let step = tokio::select! {
                biased;
                () = self.stop.cancelled(), if !completing => Step::End(Outcome::Released),
                loss = self.renewal.lost(), if !completing => Step::End(Outcome::Lost(loss)),
                () = sleep_until(self.deadline), if deadline_armed && self.deadline.is_some() => {
                    tracing::warn!("execution deadline passed, stopping the plugin");
                    Step::Fail(PluginError::permanent("deadline_exceeded", "the task ran past its execution deadline"))
                }
                ack = self.acks.recv() => {
                    let ack = ack.expect("the route keeps the ack sender alive while the task runs");
                    self.on_ack(ack, &mut phase)
                }
                joined = &mut self.plugin_task, if running => self.on_plugin_end(joined, &mut phase).await,
                item = self.results.recv(), if taking_results => match item {
                    Some(item) => self.add(item).await,
                    None => {
                        sink_open = false;
                        Step::Continue
                    }
                },
                () = room(&self.ctx.router, unstored), if unstored.is_some() => {
                    self.publish_unstored_now(unstored).await
                }
                () = sleep_until(resend_at), if resend_at.is_some() => self.resend_due().await,
                () = sleep_until(linger_at), if running && linger_at.is_some() => self.flush().await,
            };
            match step {
                Step::Continue => {}
                Step::End(outcome) => return outcome,
                Step::Fail(error) => {
                    self.plugin_cancel.cancel();
                    // Unblocks a plugin waiting on a full sink; its results are not wanted.
                    self.results.close();
                    self.send_fail(error).await;
                    phase = Phase::Failing;
                }
            }
            if let Some(outcome) = self.complete_when_drained(&mut phase).await {
                return outcome;
            }
        }
    }

    /// Once the plugin has returned and every batch is acknowledged: sends the completion
    /// (with the last batch inside when it fits). `Some` when the attempt ended instead.
    async fn complete_when_drained(&mut self, phase: &mut Phase) -> Option<Outcome> {
        let Phase::Draining { summary } = &*phase else {
            return None;
        };
        if !self.unacked.is_empty() {
            return None;
        }
        let summary = summary.clone();
        let final_batch = if std::mem::take(&mut self.final_pending) {
            match self.take_final_batch(&summary).await {
                Ok(batch) => batch,
                Err(Step::Fail(error)) => {
                    self.send_fail(error).await;
                    *phase = Phase::Failing;
                    return None;
                }
                Err(Step::End(outcome)) => return Some(outcome),
                // Sent on its own: the completion follows once it is acknowledged.
                Err(Step::Continue) => return None,
            }
        } else {
            None
        };
        if !self.unacked.is_empty() {
            // The last batch went out on its own; complete once it is acknowledged.
            return None;
        }
        self.send_complete(&summary, final_batch).await;
        *phase = Phase::Completing { summary };
        None
    }

    /// The plugin returned (or panicked): collect what it left in the sink, then drain or fail.
    async fn on_plugin_end(
        &mut self,
        joined: Result<Result<String, PluginError>, JoinError>,
        phase: &mut Phase,
    ) -> Step {
        match joined {
            Ok(Ok(summary)) => {
                // The plugin is done, so nothing new arrives: take what is queued, then send
                // the last partial batch.
                self.results.close();
                while let Ok(item) = self.results.try_recv() {
                    let step = self.add(item).await;
                    if !matches!(step, Step::Continue) {
                        return step;
                    }
                }
                tracing::info!(batches = self.batches.len(), %summary, "plugin finished");
                // The last partial batch waits for the completion it may travel in.
                self.final_pending = true;
                *phase = Phase::Draining { summary };
                Step::Continue
            }
            Ok(Err(error)) => {
                tracing::info!(code = %error.code, message = %error.message, retryable = error.retryable, "plugin failed");
                Step::Fail(error)
            }
            Err(join_error) => {
                tracing::error!(error = %telemetry::chain(&join_error), "plugin panicked");
                Step::Fail(PluginError::permanent(
                    "plugin_panicked",
                    format!("the plugin panicked: {join_error}"),
                ))
            }
        }
    }

    async fn add(&mut self, item: ResultItem) -> Step {
        match self.batcher.push(item) {
            Ok(None) => {
                self.batch_started_at.get_or_insert_with(Instant::now);
                Step::Continue
            }
            Ok(Some(full)) => {
                // The item that did not fit starts the next batch.
                self.batch_started_at = Some(Instant::now());
                self.send_new_batch(full).await
            }
            Err(too_large) => Step::Fail(PluginError::permanent(
                "result_too_large",
                too_large.to_string(),
            )),
        }
    }

    async fn flush(&mut self) -> Step {
        self.batch_started_at = None;
        match self.batcher.take() {
            Some(payload) => self.send_new_batch(payload).await,
            None => Step::Continue,
        }
    }

    async fn send_new_batch(&mut self, payload: v1::BatchPayload) -> Step {
        let sequence_number = u32::try_from(self.batches.len()).unwrap_or(u32::MAX);
        if sequence_number > limits::BATCH_SEQUENCE_MAX {
            return Step::Fail(PluginError::permanent(
                "too_many_results",
                format!(
                    "the plugin produced more than {} batches",
                    limits::BATCH_SEQUENCE_MAX
                ),
            ));
        }
        let message =
            batch::batch_message(&self.ctx.worker_id, &self.lease, sequence_number, &payload);
        let mut outbound = match self.record_batch(&message) {
            Ok(outbound) => outbound,
            Err(error) => return Step::Fail(error),
        };
        send(&self.ctx, &mut outbound).await;
        self.ctx.stats.add(Counter::BatchesSent);
        tracing::debug!(
            sequence_number,
            findings = payload.findings.len(),
            assets = payload.assets.len(),
            "result batch sent"
        );
        self.unacked
            .insert(sequence_number, self.next_send_at(&outbound));
        self.batches.push(outbound);
        Step::Continue
    }

    /// Counts a batch against the attempt's result bytes and returns it as a message of its
    /// own, kept for a resend (after `batch_missing`) whether or not it is published alone.
    fn record_batch(&mut self, message: &v1::ResultBatch) -> Result<Outbound, PluginError> {
        let bytes = Bytes::from(message.encode_to_vec());
        self.result_bytes += bytes.len();
        if self.result_bytes > ATTEMPT_RESULT_BYTES_MAX {
            return Err(PluginError::permanent(
                "too_many_results",
                format!(
                    "the plugin produced more than {ATTEMPT_RESULT_BYTES_MAX} bytes of results"
                ),
            ));
        }
        Ok(Outbound {
            verb: WorkerVerb::Result,
            subject: self.result_subject.clone(),
            first_msg_id: message.idempotency_key.clone(),
            message: bytes,
            sends: 0,
            stored: false,
            waiting: None,
        })
    }

    /// The last batch, to travel inside the completion when it fits beside it: a task whose
    /// results fit one batch is then one message. Otherwise it is sent on its own first.
    async fn take_final_batch(&mut self, summary: &str) -> Result<Option<v1::ResultBatch>, Step> {
        self.batch_started_at = None;
        let Some(payload) = self.batcher.take() else {
            return Ok(None);
        };
        let sequence_number = u32::try_from(self.batches.len()).unwrap_or(u32::MAX);
        let message =
            batch::batch_message(&self.ctx.worker_id, &self.lease, sequence_number, &payload);
        let fits = message.encoded_len() + summary.len()
            <= self.ctx.session.batch_bytes_max + Session::ENVELOPE_BYTES_MAX / 2;
        if sequence_number > limits::BATCH_SEQUENCE_MAX || !fits {
            return match self.send_new_batch(payload).await {
                Step::Continue => Ok(None),
                step => Err(step),
            };
        }
        let outbound = self.record_batch(&message).map_err(Step::Fail)?;
        // Never published alone unless ingestion asks for it again (`batch_missing`).
        self.batches.push(outbound);
        self.ctx.stats.add(Counter::BatchesSent);
        Ok(Some(message))
    }

    async fn send_complete(&mut self, summary: &str, final_batch: Option<v1::ResultBatch>) {
        let complete = v1::TaskComplete {
            schema_version: messages::SCHEMA_VERSION,
            worker_id: self.ctx.worker_id.clone(),
            lease: Some(self.lease.clone()),
            batch_count: u32::try_from(self.batches.len())
                .expect("batches are bounded by BATCH_SEQUENCE_MAX"),
            summary: summary.to_owned(),
            final_batch,
            // The slot this completion frees goes to the scan's next plugin, when this worker
            // may take it.
            lease_next: self.ctx.config.lease_next && !self.stop.is_cancelled(),
        };
        let outbound = Outbound {
            verb: WorkerVerb::Complete,
            subject: self.ctx.subject(WorkerVerb::Complete),
            first_msg_id: format!("complete:{}", self.lease.attempt_id),
            message: Bytes::from(complete.encode_to_vec()),
            // A later round after batch_missing carries the same completion under a fresh id.
            sends: self.complete_sends,
            stored: false,
            waiting: None,
        };
        self.send_last(outbound).await;
        tracing::debug!(batch_count = complete.batch_count, "completion sent");
    }

    async fn send_fail(&mut self, error: PluginError) {
        // A failed attempt's results are not wanted: stop resending them.
        self.unacked.clear();
        for batch in &mut self.batches {
            batch.waiting = None;
        }
        self.batch_started_at = None;
        let fail = v1::TaskFail {
            schema_version: messages::SCHEMA_VERSION,
            worker_id: self.ctx.worker_id.clone(),
            lease: Some(self.lease.clone()),
            error: Some(v1::Error {
                code: error.code.clone(),
                message: error.message.clone(),
                ..Default::default()
            }),
            retryable: error.retryable,
        };
        let outbound = Outbound {
            verb: WorkerVerb::Fail,
            subject: self.ctx.subject(WorkerVerb::Fail),
            first_msg_id: format!("fail:{}", self.lease.attempt_id),
            message: Bytes::from(fail.encode_to_vec()),
            sends: 0,
            stored: false,
            waiting: None,
        };
        self.send_last(outbound).await;
        tracing::info!(code = %error.code, retryable = error.retryable, "failure sent");
        telemetry::record_error(&tracing::Span::current(), &error.code, &error.message);
    }

    async fn send_last(&mut self, mut outbound: Outbound) {
        send(&self.ctx, &mut outbound).await;
        let resend_at = self.next_send_at(&outbound);
        self.last = Some(Last {
            outbound,
            resend_at,
        });
    }

    /// When to send `outbound` again: once its acknowledgement is overdue when JetStream
    /// confirmed it, else after [`REPUBLISH_DELAY`].
    fn next_send_at(&self, outbound: &Outbound) -> Instant {
        let wait = if outbound.stored {
            self.resend_delay(outbound.sends)
        } else if outbound.waiting.is_some() {
            ROOM_WAIT_MAX
        } else {
            REPUBLISH_DELAY
        };
        Instant::now() + wait
    }

    /// How long to wait for an acknowledgement after send number `sends` (0 for the first).
    fn resend_delay(&self, sends: u32) -> Duration {
        RetryPolicy::new(
            self.ctx.config.ack_timeout,
            crate::WorkerConfig::RESEND_DELAY_MAX,
        )
        .delay_max(sends + 1)
    }

    /// The verb of a message JetStream did not store (refused at this worker's quota of
    /// waiting results, most often): the last message's first, then the batches'.
    fn unstored_verb(&self) -> Option<WorkerVerb> {
        let last = self.last.as_ref().map(|last| &last.outbound);
        let batches = self
            .unacked
            .keys()
            .map(|&sequence| &self.batches[sequence as usize]);
        last.into_iter()
            .chain(batches)
            .find(|outbound| !outbound.stored)
            .map(|outbound| outbound.verb)
    }

    /// Ingestion decided one of this worker's `verb` messages, so there may be room under its
    /// quota: publishes that verb's unstored messages now instead of at their fallback time
    /// ([`ROOM_WAIT_MAX`], [`REPUBLISH_DELAY`]).
    async fn publish_unstored_now(&mut self, verb: Option<WorkerVerb>) -> Step {
        let now = Instant::now();
        for (sequence, resend_at) in &mut self.unacked {
            let outbound = &self.batches[*sequence as usize];
            if Some(outbound.verb) == verb && !outbound.stored {
                *resend_at = now;
            }
        }
        if let Some(last) = &mut self.last
            && Some(last.outbound.verb) == verb
            && !last.outbound.stored
        {
            last.resend_at = now;
        }
        self.resend_due().await
    }

    fn next_resend_at(&self) -> Option<Instant> {
        let batches = self.unacked.values().copied();
        let last = self.last.as_ref().map(|last| last.resend_at);
        batches.chain(last).min()
    }

    /// Resends every message whose acknowledgement is overdue, under a fresh `Nats-Msg-Id`.
    async fn resend_due(&mut self) -> Step {
        let now = Instant::now();
        let due: Vec<u32> = self
            .unacked
            .iter()
            .filter(|(_, resend_at)| **resend_at <= now)
            .map(|(sequence_number, _)| *sequence_number)
            .collect();
        for sequence_number in due {
            let index = sequence_number as usize;
            if !self.batches[index].stored {
                // Never confirmed: the same send again, under the same `Nats-Msg-Id`.
                send(&self.ctx, &mut self.batches[index]).await;
                let resend_at = self.next_send_at(&self.batches[index]);
                self.unacked.insert(sequence_number, resend_at);
                continue;
            }
            if self.batches[index].sends + 1 >= SENDS_MAX {
                tracing::error!(
                    sequence_number,
                    "no acknowledgement for a result batch after {SENDS_MAX} sends"
                );
                return Step::End(Outcome::Abandoned);
            }
            self.batches[index].sends += 1;
            send(&self.ctx, &mut self.batches[index]).await;
            self.ctx.stats.add(Counter::BatchesResent);
            tracing::info!(
                sequence_number,
                sends = self.batches[index].sends,
                "result batch resent"
            );
            let resend_at = self.next_send_at(&self.batches[index]);
            self.unacked.insert(sequence_number, resend_at);
        }
        let last_due = self.last.as_ref().is_some_and(|last| last.resend_at <= now);
        if last_due {
            let mut last = self.last.take().expect("checked above");
            if !last.outbound.stored {
                // Never confirmed: the same send again, under the same `Nats-Msg-Id`.
                send(&self.ctx, &mut last.outbound).await;
                last.resend_at = self.next_send_at(&last.outbound);
                self.last = Some(last);
                return Step::Continue;
            }
            if last.outbound.sends + 1 >= SENDS_MAX {
                tracing::error!(msg_id = %last.outbound.first_msg_id, "no acknowledgement after {SENDS_MAX} sends");
                return Step::End(Outcome::Abandoned);
            }
            last.outbound.sends += 1;
            send(&self.ctx, &mut last.outbound).await;
            self.ctx.stats.add(Counter::BatchesResent);
            tracing::info!(msg_id = %last.outbound.first_msg_id, sends = last.outbound.sends, "resent");
            last.resend_at = self.next_send_at(&last.outbound);
            self.last = Some(last);
        }
        Step::Continue
    }

    fn on_ack(&mut self, ack: v1::IngestAck, phase: &mut Phase) -> Step {
        let code = ack.error.as_ref().map(|error| error.error_code());
        match code {
            Some(Some(ErrorCode::LeaseLost)) => return Step::End(Outcome::Lost(LeaseLoss::Lost)),
            Some(Some(ErrorCode::CancelRequested)) => {
                return Step::End(Outcome::Lost(LeaseLoss::Cancelled));
            }
            _ => {}
        }
        let kind = ack.kind.clone();
        match (kind.as_str(), &*phase) {
            ("result", _) => self.on_result_ack(ack),
            ("complete", Phase::Completing { summary }) => {
                let summary = summary.clone();
                self.on_complete_ack(ack, summary, phase)
            }
            ("fail", Phase::Failing) => on_fail_ack(ack),
            (kind, _) => {
                // A late duplicate of an acknowledgement already acted on.
                tracing::debug!(kind, "ack not awaited, ignored");
                Step::Continue
            }
        }
    }

    fn on_result_ack(&mut self, ack: v1::IngestAck) -> Step {
        let sequence_number = ack.sequence_number;
        if !self.unacked.contains_key(&sequence_number) {
            tracing::debug!(sequence_number, "ack for a batch not awaiting one, ignored");
            return Step::Continue;
        }
        let Some(error) = ack.error else {
            self.unacked.remove(&sequence_number);
            tracing::debug!(
                sequence_number,
                duplicate = ack.duplicate,
                "result batch acknowledged"
            );
            return Step::Continue;
        };
        if error.error_code() == Some(ErrorCode::Internal) {
            tracing::warn!(sequence_number, message = %error.message, "ingestion failed on a batch, will resend");
            return Step::Continue;
        }
        // checksum_mismatch, batch_conflict, too_large...: the SDK or ingestion is wrong, and
        // sending the same batch again cannot help.
        tracing::error!(sequence_number, code = %error.code, message = %error.message, "ingestion refused a result batch");
        Step::Fail(PluginError::permanent(
            "result_refused",
            format!(
                "ingestion refused result batch {sequence_number}: {}: {}",
                error.code, error.message
            ),
        ))
    }

    fn on_complete_ack(&mut self, ack: v1::IngestAck, summary: String, phase: &mut Phase) -> Step {
        let Some(error) = ack.error else {
            // The scan's next plugin, when ingestion handed it on with the acknowledgement.
            self.handed = ack.leases;
            self.handed_at = Instant::now();
            return Step::End(Outcome::Completed);
        };
        match error.error_code() {
            Some(ErrorCode::BatchMissing) => {
                self.complete_rounds += 1;
                if self.complete_rounds > COMPLETE_ROUNDS_MAX {
                    return Step::Fail(PluginError::retryable(
                        "batch_missing",
                        format!(
                            "ingestion still misses batches after {COMPLETE_ROUNDS_MAX} completions"
                        ),
                    ));
                }
                let now = Instant::now();
                for &sequence_number in &error.missing_sequence_numbers {
                    if sequence_number as usize >= self.batches.len() {
                        return Step::Fail(PluginError::permanent(
                            "completion_refused",
                            format!(
                                "ingestion misses batch {sequence_number}, which this attempt never sent"
                            ),
                        ));
                    }
                    self.unacked.insert(sequence_number, now);
                }
                // The completion waits until those batches are acknowledged again.
                if let Some(last) = self.last.take() {
                    self.complete_sends = last.outbound.sends + 1;
                }
                tracing::warn!(missing = ?error.missing_sequence_numbers, "ingestion misses batches, resending them");
                // Resent at once (their resend time is now); the completion follows when
                // every one is acknowledged.
                *phase = Phase::Draining { summary };
                Step::Continue
            }
            Some(ErrorCode::Internal) => {
                tracing::warn!(message = %error.message, "ingestion failed on the completion, will resend");
                Step::Continue
            }
            Some(ErrorCode::EvidenceConflict) => {
                // Another attempt published this scan job's evidence: the work is done.
                tracing::info!(message = %error.message, "evidence already published by another attempt");
                Step::End(Outcome::Lost(LeaseLoss::Lost))
            }
            _ => {
                tracing::error!(code = %error.code, message = %error.message, "ingestion refused the completion");
                Step::Fail(PluginError::permanent(
                    "completion_refused",
                    format!(
                        "ingestion refused the completion: {}: {}",
                        error.code, error.message
                    ),
                ))
            }
        }
    }

    /// Cancels the plugin and waits a moment for it to return, then aborts it.
    async fn stop_plugin(&mut self) {
        self.plugin_cancel.cancel();
        // Results nobody will send: unblock a plugin waiting on a full sink.
        self.results.close();
        if self.plugin_task.is_finished() {
            return;
        }
        if tokio::time::timeout(PLUGIN_STOP_GRACE, &mut self.plugin_task)
            .await
            .is_err()
        {
            tracing::warn!("plugin ignored its cancellation, aborting it");
            self.plugin_task.abort();
        }
    }
}

fn on_fail_ack(ack: v1::IngestAck) -> Step {
    let Some(error) = ack.error else {
        return Step::End(Outcome::Failed);
    };
    if error.error_code() == Some(ErrorCode::Internal) {
        tracing::warn!(message = %error.message, "ingestion failed on the failure, will resend");
        return Step::Continue;
    }
    tracing::error!(code = %error.code, message = %error.message, "ingestion refused the failure");
    Step::End(Outcome::Abandoned)
}

/// Publishes `outbound` with the `Nats-Msg-Id` of its current send, setting `stored` once
/// JetStream confirmed it; a failed publish is logged only, and the message is published again
/// when its time comes ([`REPUBLISH_DELAY`], or room under the quota). While messages of its
/// verb wait for room, a message not yet among them joins them unpublished: the room an
/// acknowledgement makes goes to the messages already waiting, not to the newest.
async fn send(ctx: &Context, outbound: &mut Outbound) {
    let others_wait = ctx
        .router
        .room(outbound.verb)
        .is_some_and(|room| room.waiting() > 0);
    if outbound.waiting.is_none() && others_wait {
        outbound.stored = false;
        outbound.waiting = ctx.router.start_waiting(outbound.verb);
        return;
    }
    let msg_id = batch::msg_id(&outbound.first_msg_id, outbound.sends);
    let published = ctx
        .bus
        .publish_durable(
            outbound.subject.clone(),
            &msg_id,
            bus::async_nats::HeaderMap::new(),
            outbound.message.clone(),
        )
        .await;
    outbound.stored = published.is_ok();
    match &published {
        Ok(_) => outbound.waiting = None,
        // Backpressure, not a fault: ingestion is behind and this worker's waiting messages
        // are at their quota. Said once in a while, not for every message refused.
        Err(error @ bus::BusError::Quota { .. }) => {
            ctx.stats.add(Counter::QuotaRefused);
            if outbound.waiting.is_none() {
                outbound.waiting = ctx.router.start_waiting(outbound.verb);
            }
            tracing::debug!(error = %telemetry::chain(error), %msg_id, "at the quota of waiting results, will resend");
            if quota_warning_due() {
                tracing::warn!(error = %telemetry::chain(error), "this worker's results waiting for ingestion are at their quota (ingestion is behind): each is published again when ingestion has decided one of this worker's messages, those already waiting first; nothing is lost (said at most once every 30 s)");
            }
        }
        Err(error) => {
            tracing::warn!(error = %telemetry::chain(error), %msg_id, "publish failed, will resend");
        }
    }
}

/// Waits for ingestion to decide one of this worker's `verb` messages
/// ([`AckRouter::room`]); forever when there is no `verb` (the caller guards that arm).
async fn room(router: &AckRouter, verb: Option<WorkerVerb>) {
    match verb.and_then(|verb| router.room(verb)) {
        Some(room) => room.decided().notified().await,
        None => std::future::pending().await,
    }
}

/// Sleeps until `at`; forever when there is no `at` (the caller guards that arm).
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}
