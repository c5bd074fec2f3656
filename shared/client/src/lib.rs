//! The client for services that submit scans: synchronous submission over request/reply
//! (retried with the same idempotency key, so a lost reply never creates a second scan),
//! durable fire-and-forget submission over JetStream, the one falling back to the other
//! (`submit_or_queue`), and scan outcomes read through the `events` verb (a client holds no
//! JetStream right: it never creates a consumer).

use std::time::Duration;

use bus::Bus;
use messages::{ClientVerb, ErrorCode, EventKind, v1};
use prost::Message as _;
use thiserror::Error;
use uuid::Uuid;

/// Attempts of a synchronous submission before giving up.
pub const SUBMIT_ATTEMPTS_MAX: u32 = 5;

/// Backoff between a synchronous submission's attempts: from 100 ms, doubling, at most 2 s
/// apart, full jitter (the one policy, `messages::retry::RetryPolicy`).
const SUBMIT_RETRY: messages::retry::RetryPolicy =
    messages::retry::RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(2));

/// What became of a request sent with [`Client::submit_or_queue`].
#[derive(Debug, Clone, PartialEq)]
pub enum Submitted {
    /// Admission answered: admitted, a replay of an earlier request, or refused.
    Answered(v1::ScanRequestReply),
    /// Admission did not answer (not running, or unable to decide: its database is down), so
    /// the request was published to the durable stream and JetStream confirmed it. Admission
    /// decides it once it can; its outcome arrives as an event (see [`Client::outcomes`]).
    Queued {
        /// Why the synchronous path gave up.
        reason: String,
    },
}

#[derive(Debug, Error)]
pub enum ClientError {
    #[error(transparent)]
    Bus(#[from] bus::BusError),
    #[error(
        "admission did not answer after {attempts} attempts: {last}; is palisade-admission \
         running? A request published to the durable stream instead (`submit_or_queue`, or \
         `publish`) is decided once admission can, and its outcome arrives as an event"
    )]
    NoAnswer { attempts: u32, last: String },
    #[error("palisade answered with bytes that are not the expected reply: {0}")]
    BadReply(prost::DecodeError),
    #[error("cannot follow scan events: {0}")]
    Events(String),
    #[error(
        "invalid request: {0}; the organization must be a UUID and the client id 1..=64 characters of [A-Za-z0-9_-]"
    )]
    InvalidRequest(String),
}

/// Submits scans for one client id.
#[derive(Debug, Clone)]
pub struct Client {
    bus: Bus,
    client_id: String,
    timeout: Duration,
}

impl Client {
    pub fn new(bus: Bus, client_id: impl Into<String>) -> Self {
        Self {
            bus,
            client_id: client_id.into(),
            timeout: Duration::from_secs(10),
        }
    }

    pub fn client_id(&self) -> &str {
        &self.client_id
    }

    /// A request for this client; fill in the rest.
    pub fn request(
        &self,
        organization_id: &str,
        target: &str,
        plugins: &[&str],
        idempotency_key: &str,
    ) -> v1::ScanRequest {
        v1::ScanRequest {
            schema_version: messages::SCHEMA_VERSION,
            organization_id: organization_id.to_owned(),
            target: target.to_owned(),
            plugins: plugins.iter().map(|plugin| (*plugin).to_owned()).collect(),
            priority: 0,
            execution_deadline_seconds: 0,
            client_id: self.client_id.clone(),
            idempotency_key: idempotency_key.to_owned(),
        }
    }

    /// Submits and waits for admission's answer. Retries timeouts and `internal` answers with
    /// the same request (same idempotency key), which admission answers with the same scan.
    #[tracing::instrument(name = "submit", skip_all, fields(
        otel.name = "submit scan",
        palisade.service = "client",
        palisade.idempotency_key = %request.idempotency_key,
    ))]
    pub async fn submit(
        &self,
        request: &v1::ScanRequest,
    ) -> Result<v1::ScanRequestReply, ClientError> {
        let payload = request.encode_to_vec();
        let subject = self.subject(request, ClientVerb::Submit)?;
        let mut last = String::new();
        for attempt in 1..=SUBMIT_ATTEMPTS_MAX {
            match self
                .bus
                .request(subject.clone(), payload.clone().into(), self.timeout)
                .await
            {
                Ok(reply) => {
                    let reply = v1::ScanRequestReply::decode(reply.payload.as_ref())
                        .map_err(ClientError::BadReply)?;
                    let internal = reply.error.as_ref().and_then(v1::Error::error_code)
                        == Some(ErrorCode::Internal);
                    if !internal {
                        return Ok(reply);
                    }
                    last = reply.error.map(|error| error.message).unwrap_or_default();
                }
                Err(error) => last = error.to_string(),
            }
            if attempt < SUBMIT_ATTEMPTS_MAX {
                tokio::time::sleep(SUBMIT_RETRY.jittered(attempt)).await;
            }
        }
        Err(ClientError::NoAnswer {
            attempts: SUBMIT_ATTEMPTS_MAX,
            last,
        })
    }

    /// [`Client::submit`], falling back to the durable path: when admission does not answer
    /// after every attempt, the same request (same idempotency key, so it can never make a
    /// second scan) is published to the durable stream, and the answer is
    /// [`Submitted::Queued`] once JetStream confirmed it. Fails only when neither path took
    /// the request.
    pub async fn submit_or_queue(
        &self,
        request: &v1::ScanRequest,
    ) -> Result<Submitted, ClientError> {
        match self.submit(request).await {
            Ok(reply) => Ok(Submitted::Answered(reply)),
            Err(ClientError::NoAnswer { last, .. }) => {
                tracing::warn!(reason = %last, idempotency_key = %request.idempotency_key, "admission did not answer; publishing the request to the durable stream");
                self.publish(request).await?;
                Ok(Submitted::Queued { reason: last })
            }
            Err(error) => Err(error),
        }
    }

    /// Publishes to the durable request stream and waits for the PubAck: the request is then
    /// durable and admission will decide it. `Nats-Msg-Id` is `client:key:fingerprint`, so an
    /// exact replay is de-duplicated by JetStream and a conflicting reuse still reaches admission.
    #[tracing::instrument(name = "publish", skip_all, fields(
        otel.name = "publish scan",
        palisade.service = "client",
        palisade.idempotency_key = %request.idempotency_key,
    ))]
    pub async fn publish(&self, request: &v1::ScanRequest) -> Result<(), ClientError> {
        let msg_id = format!(
            "{}:{}:{}",
            request.client_id,
            request.idempotency_key,
            messages::scan_request_fingerprint(request)
        );
        self.bus
            .publish_durable(
                self.subject(request, ClientVerb::Request)?,
                &msg_id,
                Default::default(),
                request.encode_to_vec().into(),
            )
            .await?;
        Ok(())
    }

    /// The subject of `request`: its organization's and this client's.
    fn subject(&self, request: &v1::ScanRequest, verb: ClientVerb) -> Result<String, ClientError> {
        let organization_id = Uuid::parse_str(&request.organization_id).map_err(|_| {
            ClientError::InvalidRequest(format!(
                "organization_id {:?} is not a UUID",
                request.organization_id
            ))
        })?;
        self.bus
            .subjects()
            .client(&organization_id, &request.client_id, verb)
            .map_err(|error| ClientError::InvalidRequest(error.to_string()))
    }

    /// Cancels a scan of `organization_id`; the reply says whether this request cancelled it
    /// or it had ended. A scan of another organization answers `not_found`.
    pub async fn cancel_scan(
        &self,
        organization_id: &Uuid,
        scan_id: &str,
        reason: &str,
    ) -> Result<v1::CancelReply, ClientError> {
        self.cancel(
            organization_id,
            v1::CancelRequest {
                schema_version: messages::SCHEMA_VERSION,
                scan_id: scan_id.to_owned(),
                task_id: String::new(),
                reason: reason.to_owned(),
            },
        )
        .await
    }

    /// Cancels one task of `organization_id`, and with it its scan.
    pub async fn cancel_task(
        &self,
        organization_id: &Uuid,
        task_id: &str,
        reason: &str,
    ) -> Result<v1::CancelReply, ClientError> {
        self.cancel(
            organization_id,
            v1::CancelRequest {
                schema_version: messages::SCHEMA_VERSION,
                scan_id: String::new(),
                task_id: task_id.to_owned(),
                reason: reason.to_owned(),
            },
        )
        .await
    }

    async fn cancel(
        &self,
        organization_id: &Uuid,
        request: v1::CancelRequest,
    ) -> Result<v1::CancelReply, ClientError> {
        let subject = self
            .bus
            .subjects()
            .client(organization_id, &self.client_id, ClientVerb::Cancel)
            .map_err(|error| ClientError::InvalidRequest(error.to_string()))?;
        let reply = self
            .bus
            .request(subject, request.encode_to_vec().into(), self.timeout)
            .await?;
        v1::CancelReply::decode(reply.payload.as_ref()).map_err(ClientError::BadReply)
    }

    /// Asks for the enrichment of a completed scan of `organization_id` (one request/reply to
    /// enrichment, not retried: a repeat is safe, it answers `active` or `completed`). The
    /// reply's `outcome` is `created`, `requeued`, `active` or `completed`; a refusal is in
    /// `error` (`not_found`, `scan_not_completed`, `internal`).
    pub async fn enrich_scan(
        &self,
        organization_id: &Uuid,
        scan_id: &str,
    ) -> Result<v1::EnrichReply, ClientError> {
        let subject = self
            .bus
            .subjects()
            .client(organization_id, &self.client_id, ClientVerb::Enrich)
            .map_err(|error| ClientError::InvalidRequest(error.to_string()))?;
        let request = v1::EnrichRequest {
            schema_version: messages::SCHEMA_VERSION,
            scan_id: scan_id.to_owned(),
        };
        let reply = self
            .bus
            .request(subject, request.encode_to_vec().into(), self.timeout)
            .await?;
        v1::EnrichReply::decode(reply.payload.as_ref()).map_err(ClientError::BadReply)
    }

    /// Asks ingestion about `organization_id`'s findings (one request/reply, not retried):
    /// a page of a scan's findings, one finding with its history, a disposition change, or a
    /// scan's gate, as `query` says. The answer is in the reply's `answer`; a refusal in
    /// `error` (`not_found`, `invalid_field`, `revision_conflict`, `internal`). A disposition
    /// change names the finding's revision, so repeating it after a lost reply answers
    /// `revision_conflict` once it was applied: read the finding again to know.
    pub async fn findings(
        &self,
        organization_id: &Uuid,
        query: v1::findings_request::Query,
    ) -> Result<v1::FindingsReply, ClientError> {
        let subject = self
            .bus
            .subjects()
            .client(organization_id, &self.client_id, ClientVerb::Findings)
            .map_err(|error| ClientError::InvalidRequest(error.to_string()))?;
        let request = v1::FindingsRequest {
            schema_version: messages::SCHEMA_VERSION,
            query: Some(query),
        };
        let reply = self
            .bus
            .request(subject, request.encode_to_vec().into(), self.timeout)
            .await?;
        v1::FindingsReply::decode(reply.payload.as_ref()).map_err(ClientError::BadReply)
    }

    /// Manages `organization_id`'s recurring scans (one request/reply to admission, not
    /// retried): add, list, show, pause, resume or delete, as `query` says. A schedule added
    /// here submits its scans as this client. The answer is in the reply's `answer`; a refusal
    /// in `error` (`invalid_field`, `not_found`, `unknown_plugin`, `unknown_organization`,
    /// `internal`). Adding again after a lost reply answers `invalid_field` (the name is taken)
    /// once the first was applied: list to know.
    pub async fn schedules(
        &self,
        organization_id: &Uuid,
        query: v1::schedules_request::Query,
    ) -> Result<v1::SchedulesReply, ClientError> {
        let subject = self
            .bus
            .subjects()
            .client(organization_id, &self.client_id, ClientVerb::Schedules)
            .map_err(|error| ClientError::InvalidRequest(error.to_string()))?;
        let request = v1::SchedulesRequest {
            schema_version: messages::SCHEMA_VERSION,
            query: Some(query),
        };
        let reply = self
            .bus
            .request(subject, request.encode_to_vec().into(), self.timeout)
            .await?;
        v1::SchedulesReply::decode(reply.payload.as_ref()).map_err(ClientError::BadReply)
    }

    /// Lists `organization_id`'s scans, newest first by admission (one request/reply to
    /// ingestion, not retried: it only reads), with the filters of `list` and a page after
    /// `list.after` (the previous page's `next_after`). A refusal is in `error`
    /// (`invalid_field`, `internal`).
    pub async fn scans(
        &self,
        organization_id: &Uuid,
        list: v1::ListScans,
    ) -> Result<v1::ScansReply, ClientError> {
        let subject = self
            .bus
            .subjects()
            .client(organization_id, &self.client_id, ClientVerb::Scans)
            .map_err(|error| ClientError::InvalidRequest(error.to_string()))?;
        let request = v1::ScansRequest {
            schema_version: messages::SCHEMA_VERSION,
            query: Some(v1::scans_request::Query::List(list)),
        };
        let reply = self
            .bus
            .request(subject, request.encode_to_vec().into(), self.timeout)
            .await?;
        v1::ScansReply::decode(reply.payload.as_ref()).map_err(ClientError::BadReply)
    }

    /// Reads `organization_id`'s events after `after_sequence` (one request/reply to ingestion,
    /// not retried: a repeat with the same cursor is safe): its `scan.*` and `enrichment.*`
    /// events, oldest first, and the `cursor` to pass as the next `after_sequence`. With
    /// `from_now` the reply holds no events and the cursor is the stream's end. When nothing
    /// follows the cursor, ingestion waits up to `wait` (at most 30 s) for the next event. A
    /// refusal is in `error` (`invalid_field`, `internal`).
    pub async fn events(
        &self,
        organization_id: &Uuid,
        after_sequence: u64,
        from_now: bool,
        wait: Duration,
    ) -> Result<v1::EventsReply, ClientError> {
        let subject = self
            .bus
            .subjects()
            .client(organization_id, &self.client_id, ClientVerb::Events)
            .map_err(|error| ClientError::InvalidRequest(error.to_string()))?;
        let request = v1::EventsRequest {
            schema_version: messages::SCHEMA_VERSION,
            organization_id: organization_id.to_string(),
            client_id: self.client_id.clone(),
            after_sequence,
            from_now,
            max_events: 0,
            wait_ms: u32::try_from(wait.as_millis()).unwrap_or(u32::MAX),
        };
        let reply = self
            .bus
            .request(subject, request.encode_to_vec().into(), wait + self.timeout)
            .await?;
        v1::EventsReply::decode(reply.payload.as_ref()).map_err(ClientError::BadReply)
    }

    /// Scan outcome events of `organization_id` from now on, read through the `events` verb:
    /// first the stream's end (`from_now`), then long-polls of [`OUTCOMES_WAIT`] each from the
    /// cursor of the previous reply, so no event is read twice or skipped. A failed or
    /// unanswered read is repeated with the same cursor after a backoff; dropping the stream
    /// stops the reads. Fails when the first read (where "now" is) fails.
    pub async fn outcomes(
        &self,
        organization_id: &Uuid,
    ) -> Result<impl futures::Stream<Item = Outcome> + use<>, ClientError> {
        let start = self
            .events(organization_id, 0, true, Duration::ZERO)
            .await
            .map_err(|error| ClientError::Events(error.to_string()))?;
        if let Some(error) = start.error {
            return Err(ClientError::Events(format!(
                "{} ({})",
                error.message, error.code
            )));
        }
        let follow = Follow {
            client: self.clone(),
            organization_id: *organization_id,
            cursor: start.cursor,
            ready: std::collections::VecDeque::new(),
            failures: 0,
        };
        // Boxed, so the stream is `Unpin` as a consumer's message stream was.
        Ok(futures::StreamExt::boxed(futures::stream::unfold(
            follow,
            |mut follow| async move {
                // Ends only when the stream is dropped: each pass waits at ingestion or backs off.
                loop {
                    if let Some(outcome) = follow.ready.pop_front() {
                        return Some((outcome, follow));
                    }
                    follow.read().await;
                }
            },
        )))
    }
}

/// How long each read of [`Client::outcomes`] waits at ingestion for the next event: below
/// the 30 s the verb allows, so a quiet organization costs a request every 20 s.
pub const OUTCOMES_WAIT: Duration = Duration::from_secs(20);

/// Backoff between failed reads of [`Client::outcomes`] (ingestion not answering, or answering
/// `internal`): from 100 ms, doubling, at most 5 s apart, full jitter (the one policy,
/// `messages::retry::RetryPolicy`).
const EVENTS_RETRY: messages::retry::RetryPolicy =
    messages::retry::RetryPolicy::new(Duration::from_millis(100), Duration::from_secs(5));

/// The state of one [`Client::outcomes`] stream.
struct Follow {
    client: Client,
    organization_id: Uuid,
    /// The last reply's cursor: every event at or below it was read.
    cursor: u64,
    /// Outcomes read and not yet taken.
    ready: std::collections::VecDeque<Outcome>,
    /// Failed reads in a row.
    failures: u32,
}

impl Follow {
    /// One read from the cursor: its outcomes are queued and the cursor moves, or, when it
    /// failed, a backoff passes and the cursor stays.
    async fn read(&mut self) {
        let reply = self
            .client
            .events(&self.organization_id, self.cursor, false, OUTCOMES_WAIT)
            .await;
        let failure = match reply {
            Ok(reply) if reply.error.is_none() => {
                debug_assert!(reply.cursor >= self.cursor, "a cursor never moves back");
                self.failures = 0;
                self.cursor = self.cursor.max(reply.cursor);
                self.ready
                    .extend(reply.events.iter().filter_map(Outcome::of_event));
                return;
            }
            Ok(reply) => reply
                .error
                .map(|error| format!("{} ({})", error.message, error.code))
                .unwrap_or_default(),
            Err(error) => error.to_string(),
        };
        self.failures = self.failures.saturating_add(1);
        tracing::warn!(reason = %failure, failures = self.failures, cursor = self.cursor, "reading scan events failed; reading again after a backoff");
        tokio::time::sleep(EVENTS_RETRY.jittered(self.failures)).await;
    }
}

/// How a scan ended (or why its request was refused).
#[derive(Debug, Clone, PartialEq)]
pub enum Outcome {
    Completed(v1::ScanCompleted),
    Failed(v1::ScanFailed),
    Cancelled(v1::ScanCancelled),
    Rejected(v1::ScanRejected),
}

impl Outcome {
    /// The outcome an event reports, if it reports one (`scan.admitted` and the
    /// `enrichment.*` events do not); `None` too for a payload that does not decode.
    pub fn of_event(event: &v1::TenantEvent) -> Option<Self> {
        let payload = event.payload.as_slice();
        match event.name.as_str() {
            name if name == EventKind::ScanCompleted.name() => v1::ScanCompleted::decode(payload)
                .ok()
                .map(Outcome::Completed),
            name if name == EventKind::ScanFailed.name() => {
                v1::ScanFailed::decode(payload).ok().map(Outcome::Failed)
            }
            name if name == EventKind::ScanCancelled.name() => v1::ScanCancelled::decode(payload)
                .ok()
                .map(Outcome::Cancelled),
            name if name == EventKind::ScanRejected.name() => v1::ScanRejected::decode(payload)
                .ok()
                .map(Outcome::Rejected),
            _ => None,
        }
    }
}
