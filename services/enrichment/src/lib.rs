//! Enrichment (SPEC §4.4, I11): claims the one enrichment job of each completed scan under a
//! fenced lease, renews it while working, runs the job's steps through an [`Enricher`]
//! (checkpointing after each), and completes or fails it, fenced; a failed execution is
//! retried with the one backoff policy until `max_attempts` executions, then the job fails.
//! The reaper returns claims whose lease lapsed (`store::enrichment::recover_expired`).
//!
//! It also answers requests for a scan's enrichment ([`request`]: `created`, `requeued`,
//! `active`, `completed`), which wake the job loop at once.
//!
//! The enricher is chosen by configuration ([`cve`]): the local CVE table synced from the NVD
//! CVE API 2.0 ([`nvd`]), the local table alone (filled offline by [`import`]), or none.

pub mod cve;
pub mod import;
pub mod metrics;
pub mod nvd;
pub mod request;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::future::BoxFuture;
use messages::retry::RetryPolicy;
use messages::v1;
use runtime::{CommonSettings, Connections, Plumbing, SettingsError, env};
use store::PgPool;
use store::enrichment::{ClaimedJob, FailOutcome};
use telemetry::cost::{in_lane, lanes};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

/// Enrichment settings.
#[derive(Debug, Clone)]
pub struct Settings {
    pub common: CommonSettings,
    /// Pause when no job is due (`PALISADE_ENRICHMENT_POLL_MS`, default 1000).
    pub poll: Duration,
    /// Claim lease (`PALISADE_ENRICHMENT_LEASE_TTL_MS`, default 60000), renewed every third
    /// of it while a job is worked on.
    pub lease_ttl: Duration,
    /// Jobs worked on at once by this process (`PALISADE_ENRICHMENT_CONCURRENCY`, 1..=256,
    /// default 16); they are claimed together, in one statement.
    pub concurrency: i64,
    /// Backoff between executions of a failed job (`PALISADE_RETRY_BASE_MS` /
    /// `PALISADE_RETRY_CAP_MS`, as for tasks).
    pub retry: RetryPolicy,
    /// Where CVE data comes from.
    pub cve: cve::CveSettings,
    /// Where `/healthz` and `/readyz` listen (`PALISADE_HTTP_ADDR`, default `0.0.0.0:9090`,
    /// `off` for none); `None` where one process runs many services and serves them once.
    pub http_addr: Option<std::net::SocketAddr>,
}

impl Settings {
    pub fn from_env() -> Result<Self, SettingsError> {
        Self::from_common(CommonSettings::from_env()?)
    }

    pub fn from_common(common: CommonSettings) -> Result<Self, SettingsError> {
        Ok(Self {
            common,
            poll: Duration::from_millis(env::parse("PALISADE_ENRICHMENT_POLL_MS", 1_000_u64)?),
            lease_ttl: Duration::from_millis(env::parse_in(
                "PALISADE_ENRICHMENT_LEASE_TTL_MS",
                60_000_u64,
                300..=3_600_000,
            )?),
            concurrency: env::parse_in("PALISADE_ENRICHMENT_CONCURRENCY", 16_i64, 1..=256)?,
            retry: runtime::retry_policy_from_env()?,
            cve: cve::CveSettings::from_env()?,
            http_addr: runtime::health::http_addr_from_env()?,
        })
    }
}

/// What an enricher is given for one job.
#[derive(Debug, Clone)]
pub struct JobInput {
    pub job_id: uuid::Uuid,
    pub scan_id: uuid::Uuid,
    pub organization_id: uuid::Uuid,
    /// The distinct CVE ids of the scan's findings, sorted.
    pub cve_ids: Vec<String>,
    /// The claim every write of the job names.
    pub fence: store::cves::JobFence,
}

/// One step of a job's work.
#[derive(Debug, Clone, PartialEq)]
pub enum Step {
    /// Progress to record (fenced) before the next step; an execution that resumes the job
    /// after a crash starts from the last one recorded.
    Progress(serde_json::Value),
    /// The job's work is done; its final checkpoint.
    Done(serde_json::Value),
    /// A fenced write of the step found the job lost (a newer claim holds it, or its lease
    /// lapsed): it wrote nothing, and the execution ends without another write.
    Lost,
}

/// A step that failed: the job's execution ends, and is retried when `retryable` and
/// executions are left.
#[derive(Debug, Clone, PartialEq)]
pub struct StepError {
    /// Stable code (`nvd_unavailable`, …) and a message for operators; kept in `last_error`
    /// and published in `enrichment.failed`.
    pub error: v1::Error,
    pub retryable: bool,
}

/// Does a job's work, step by step from its checkpoint (`{}` at first).
pub trait Enricher: Send + Sync + 'static {
    fn step<'a>(
        &'a self,
        job: &'a JobInput,
        checkpoint: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Step, StepError>>;
}

/// Records the job's CVE ids with `"source": "none"` in one step: no CVE source yet.
#[derive(Debug, Clone, Copy, Default)]
pub struct RecordOnly;

impl Enricher for RecordOnly {
    fn step<'a>(
        &'a self,
        job: &'a JobInput,
        _checkpoint: &'a serde_json::Value,
    ) -> BoxFuture<'a, Result<Step, StepError>> {
        Box::pin(async move {
            Ok(Step::Done(
                serde_json::json!({ "cve_ids": job.cve_ids, "source": "none" }),
            ))
        })
    }
}

/// How one execution of a job ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Execution {
    Completed,
    /// Back to pending, after the backoff.
    Retrying,
    Failed,
    /// Another claim took the job (or its lease lapsed) meanwhile: nothing more was written.
    Lost,
}

/// A built enrichment service.
pub struct Service {
    settings: Settings,
    pool: PgPool,
    subjects: messages::Subjects,
    owner: String,
    enricher: Arc<dyn Enricher>,
    bus: bus::Bus,
    /// Wakes the job loop: a request made a job due.
    due: Arc<tokio::sync::Notify>,
    /// The health server and the outbox relay (`enrichment.*` events).
    plumbing: Plumbing,
    relay: outbox::Relay,
}

/// The request server's name in `palisade_requests_total` and its queue group.
const REQUEST_SERVER: &str = "enrichment.enrich";
const QUEUE_GROUP: &str = "enrichment";

impl Service {
    pub async fn build(settings: Settings) -> anyhow::Result<Self> {
        let connections = Connections::open(
            &settings.common,
            &messages::Identity::Service(messages::Service::Enrichment),
        )
        .await
        .context("failed to connect")?;
        Self::from_connections(settings, connections)
    }

    /// A service whose enricher is the one its settings choose (`PALISADE_CVE_SOURCE`).
    pub fn from_connections(settings: Settings, connections: Connections) -> anyhow::Result<Self> {
        let enricher = settings.cve.enricher(&connections.pool)?;
        Ok(Self::with_enricher(settings, connections, enricher))
    }

    /// A service whose jobs `enricher` works on.
    pub fn with_enricher(
        settings: Settings,
        connections: Connections,
        enricher: Arc<dyn Enricher>,
    ) -> Self {
        metrics::register();
        let mut plumbing = Plumbing::new(&settings.common, settings.http_addr, &connections);
        let relay = plumbing.relay_outbox(&connections);
        Self {
            settings,
            subjects: connections.bus.subjects().clone(),
            pool: connections.pool.clone(),
            owner: format!("enrichment-{}", uuid::Uuid::new_v4()),
            enricher,
            bus: connections.bus,
            due: Arc::new(tokio::sync::Notify::new()),
            plumbing,
            relay,
        }
    }

    /// Claims up to `concurrency` due jobs and works on them together until each ends; the
    /// outcomes in claim order (empty when none was due).
    pub async fn run_once(&self) -> Result<Vec<(uuid::Uuid, Execution)>, store::StoreError> {
        let jobs = store::enrichment::claim(
            &self.pool,
            &self.owner,
            self.settings.lease_ttl,
            self.settings.concurrency,
        )
        .await?;
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let scan_ids: Vec<uuid::Uuid> = jobs.iter().map(|job| job.scan_id).collect();
        let mut cve_ids = store::enrichment::scan_cve_ids(&self.pool, &scan_ids).await?;
        let executions = jobs.iter().map(|job| {
            let input = JobInput {
                job_id: job.id,
                scan_id: job.scan_id,
                organization_id: job.organization_id,
                cve_ids: cve_ids.remove(&job.scan_id).unwrap_or_default(),
                fence: job.fence(),
            };
            self.execute(job, input)
        });
        let outcomes = futures::future::join_all(executions).await;
        if outcomes
            .iter()
            .any(|(_, outcome)| *outcome != Execution::Lost)
        {
            self.relay.notify();
        }
        Ok(outcomes)
    }

    /// One execution of `job`: renewed every third of the lease while its steps run, each
    /// step's progress checkpointed, then completed or failed; every write fenced.
    async fn execute(&self, job: &ClaimedJob, input: JobInput) -> (uuid::Uuid, Execution) {
        // Enrichment is triggered by a poll, not a message: each job joins its scan's trace
        // through the context stored at admission, with a span that lasts until it ends.
        let span = tracing::info_span!(
            parent: None,
            "enrich",
            otel.name = "enrich scan",
            otel.kind = "internal",
            palisade.service = "enrichment",
            palisade.scan_id = %job.scan_id,
            palisade.enrichment_job_id = %job.id,
            palisade.attempt = job.attempt_count,
        );
        bus::trace::set_parent_from_traceparent(&span, job.trace_context.as_deref().unwrap_or(""));
        let outcome = async {
            let renewing = self.renew_until_lost(job);
            tokio::pin!(renewing);
            let working = self.work(job, &input);
            tokio::pin!(working);
            let outcome = tokio::select! {
                outcome = &mut working => outcome,
                () = &mut renewing => Execution::Lost,
            };
            metrics::execution(outcome);
            if outcome == Execution::Lost {
                tracing::warn!(
                    job_id = %job.id,
                    "enrichment job was lost (taken over, or its lease lapsed); nothing more is written"
                );
            }
            outcome
        }
        .instrument(span)
        .await;
        (job.id, outcome)
    }

    /// Renews `job`'s lease every third of it; returns once it is lost.
    async fn renew_until_lost(&self, job: &ClaimedJob) {
        let every = self.settings.lease_ttl / 3;
        loop {
            tokio::time::sleep(every).await;
            match store::enrichment::renew(&self.pool, job, self.settings.lease_ttl).await {
                Ok(true) => {}
                Ok(false) => break,
                // A renewal that fails is tried again at the next tick; the lease lapses
                // only after two more.
                Err(error) => {
                    tracing::warn!(error = %telemetry::chain(&error), job_id = %job.id, "could not renew the enrichment job's lease");
                }
            }
        }
    }

    /// Runs `job`'s steps from its checkpoint and ends the execution.
    async fn work(&self, job: &ClaimedJob, input: &JobInput) -> Execution {
        let mut checkpoint = job.checkpoint.clone();
        loop {
            match self.enricher.step(input, &checkpoint).await {
                Ok(Step::Progress(progress)) => {
                    match store::enrichment::checkpoint(&self.pool, job, &progress).await {
                        Ok(true) => checkpoint = progress,
                        Ok(false) => return Execution::Lost,
                        Err(error) => {
                            return self.fail(job, &store_failure(&error)).await;
                        }
                    }
                }
                Ok(Step::Lost) => return Execution::Lost,
                Ok(Step::Done(result)) => {
                    return match store::enrichment::complete(
                        &self.pool,
                        &self.subjects,
                        &[(job, result)],
                    )
                    .await
                    {
                        Ok(completed) if completed.contains(&job.id) => Execution::Completed,
                        Ok(_) => Execution::Lost,
                        Err(error) => self.fail(job, &store_failure(&error)).await,
                    };
                }
                Err(failure) => return self.fail(job, &failure).await,
            }
        }
    }

    async fn fail(&self, job: &ClaimedJob, failure: &StepError) -> Execution {
        tracing::warn!(
            job_id = %job.id,
            code = %failure.error.code,
            message = %failure.error.message,
            retryable = failure.retryable,
            attempt = job.attempt_count,
            max_attempts = job.max_attempts,
            "enrichment job execution failed"
        );
        match store::enrichment::fail(
            &self.pool,
            &self.subjects,
            self.settings.retry,
            job,
            &failure.error,
            failure.retryable,
        )
        .await
        {
            Ok(FailOutcome::Retrying { .. }) => Execution::Retrying,
            Ok(FailOutcome::Failed) => Execution::Failed,
            Ok(FailOutcome::Fenced) => Execution::Lost,
            // Not even the failure could be written: the lease lapses and the reaper
            // returns the job to the queue, counting this execution.
            Err(error) => {
                tracing::warn!(error = %telemetry::chain(&error), job_id = %job.id, "could not record the enrichment job's failure; the reaper recovers it once its lease lapses");
                Execution::Lost
            }
        }
    }

    pub async fn run_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        in_lane(lanes::ENRICHMENT, self.serve_until_stopped(shutdown)).await
    }

    async fn serve_until_stopped(self, shutdown: CancellationToken) -> anyhow::Result<()> {
        let stop = shutdown.child_token();
        let _stop_on_return = stop.clone().drop_guard();
        let plumbing = self
            .plumbing
            .start(&stop)
            .await
            .context("failed to serve the health endpoints")?;
        let (pool, subjects, due) = (self.pool.clone(), self.subjects.clone(), self.due.clone());
        let server = bus::serve::serve(
            &self.bus,
            REQUEST_SERVER,
            self.subjects.client_wildcard(messages::ClientVerb::Enrich),
            QUEUE_GROUP,
            move |message| {
                let (pool, subjects, due) = (pool.clone(), subjects.clone(), due.clone());
                async move {
                    use prost::Message as _;
                    let reply = answer(
                        &pool,
                        &subjects,
                        &due,
                        message.subject.as_str(),
                        &message.payload,
                    )
                    .await;
                    Some(reply.encode_to_vec().into())
                }
            },
            // Not stopped by the shutdown: the server ends when the job loop has (the select
            // below drops it), so a decision in flight at shutdown is finished, not dropped.
            CancellationToken::new(),
        );
        let result = tokio::select! {
            () = self.work_until(&shutdown) => Ok(()),
            result = server => result.context("enrichment request server stopped"),
        };
        plumbing.stop().await;
        result
    }

    /// The job loop: passes back to back while jobs are due, else a pause of the poll
    /// interval or until a request makes a job due; until `shutdown`.
    async fn work_until(&self, shutdown: &CancellationToken) {
        loop {
            let worked = match self.run_once().await {
                Ok(outcomes) => !outcomes.is_empty(),
                Err(error) => {
                    tracing::warn!(error = %telemetry::chain(&error), "enrichment pass failed");
                    false
                }
            };
            if worked {
                continue;
            }
            tokio::select! {
                () = shutdown.cancelled() => break,
                () = tokio::time::sleep(self.settings.poll) => {}
                () = self.due.notified() => {}
            }
        }
    }
}

/// Decides one request for a scan's enrichment: refusals for a malformed request, a scan of
/// another organization (`not_found`, as one that does not exist) or one not completed; else
/// one of the four outcomes. A job made due wakes the job loop.
async fn answer(
    pool: &PgPool,
    subjects: &messages::Subjects,
    due: &tokio::sync::Notify,
    subject: &str,
    payload: &[u8],
) -> v1::EnrichReply {
    let request = match request::parse(subjects, subject, payload) {
        Ok(request) => request,
        Err(error) => {
            return v1::EnrichReply {
                error: Some(error),
                ..Default::default()
            };
        }
    };
    match store::enrichment::request(pool, Some(request.organization_id), request.scan_id).await {
        Ok(outcome) => {
            if matches!(
                outcome,
                store::enrichment::RequestOutcome::Created { .. }
                    | store::enrichment::RequestOutcome::Requeued { .. }
            ) {
                due.notify_one();
            }
            request::reply(request.scan_id, &outcome)
        }
        Err(error) => v1::EnrichReply {
            error: Some(runtime::internal_error(
                "enrichment's decision",
                &telemetry::chain(&error),
                "retry the request",
            )),
            scan_id: request.scan_id.to_string(),
            ..Default::default()
        },
    }
}

/// A database failure during an execution: retryable. Its detail goes to the log line only:
/// the error is published in `enrichment.failed`, which tenants read.
pub(crate) fn store_failure(error: &store::StoreError) -> StepError {
    tracing::warn!(error = %telemetry::chain(error), "enrichment could not write its progress");
    if error.is_data_refused() {
        // Not the database's health: the data. Retrying writes the same data again. The
        // message goes to the tenant: no database text (the warning above has it).
        return StepError {
            error: v1::Error {
                code: "data_refused".into(),
                message: "PostgreSQL refused data the job tried to write, which retrying cannot \
                          change; the enrichment service's log names it"
                    .into(),
                ..Default::default()
            },
            retryable: false,
        };
    }
    StepError {
        error: v1::Error {
            code: "database_unavailable".into(),
            message: "palisade could not write the job's progress to its database".into(),
            ..Default::default()
        },
        retryable: true,
    }
}
