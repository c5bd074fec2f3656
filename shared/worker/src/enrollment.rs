//! Joining with an enrollment token, and keeping the credentials it gave valid
//! (`docs/protocol/worker.md`, "Enrolling"; reference 6.18 and 6.19).
//!
//! [`enroll`] generates the worker's own key pair, connects as the token's NATS user (which may
//! only send `enroll`), sends its public key with the token's id and secret, and keeps what
//! dispatch answers in a **state directory**: `worker.creds` (the JWT and the seed, mode 0600)
//! and `worker.json` (its id, the token it used, when the JWT expires). A restarted worker
//! reads them back ([`Enrolled::load`]) instead of enrolling again: a token is used once.
//! [`keep_renewed`] asks dispatch for a new JWT for the same key when a third of its lifetime
//! is left, writes it, and reconnects with it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use bus::{Bus, NatsCredentials, NatsTls};
use identity::enrollment::EnrollmentToken;
use messages::{Identity, Subjects, WorkerVerb, v1};
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::WorkerError;

/// The credentials file in the state directory.
const CREDS_FILE: &str = "worker.creds";
/// What else the state directory records.
const STATE_FILE: &str = "worker.json";
/// How long to wait for dispatch's answer to `enroll` and `credentials`.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(10);
/// Between failed renewals.
const RENEW_RETRY: Duration = Duration::from_secs(30);
/// How long an unanswered enrollment is asked again (with the same key: dispatch answers a
/// repeat again) before the worker gives up: dispatch starting, restarting or unreachable for
/// a while is waited out, as `hello` is.
const ENROLL_PATIENCE: Duration = Duration::from_secs(300);

/// An enrolled worker as its state directory records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EnrolledState {
    pub worker_id: Uuid,
    /// The token it enrolled with: another token given later enrolls again.
    pub token_id: Uuid,
    pub public_key: String,
    pub expires_at_unix_ms: i64,
    /// What it was enrolled for: the capabilities its hellos may declare (a worker runs only
    /// the plugins among them).
    #[serde(default)]
    pub capabilities: Vec<String>,
    #[serde(default)]
    pub organization_ids: Vec<String>,
}

/// An enrolled worker: its state and the credentials it connects with.
#[derive(Debug, Clone)]
pub struct Enrolled {
    pub state: EnrolledState,
    /// Shared with every connection made with them: renewing replaces them in place.
    pub credentials: NatsCredentials,
    dir: PathBuf,
}

fn enrollment_error(reason: impl Into<String>) -> WorkerError {
    WorkerError::Enrollment {
        reason: reason.into(),
    }
}

fn unix_ms_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |since| since.as_millis() as i64)
}

impl Enrolled {
    /// The enrollment recorded in `dir`, if any (whether or not its JWT has expired).
    pub fn load(dir: &Path) -> Result<Option<Self>, WorkerError> {
        let state_path = dir.join(STATE_FILE);
        if !state_path.exists() {
            return Ok(None);
        }
        let read = |path: PathBuf| {
            std::fs::read_to_string(&path).map_err(|error| {
                enrollment_error(format!("cannot read {}: {error}", path.display()))
            })
        };
        let state: EnrolledState =
            serde_json::from_str(&read(state_path.clone())?).map_err(|error| {
                enrollment_error(format!("{} is unreadable: {error}", state_path.display()))
            })?;
        let creds = read(dir.join(CREDS_FILE))?;
        Ok(Some(Self {
            state,
            credentials: NatsCredentials::from_creds(creds),
            dir: dir.to_owned(),
        }))
    }

    /// Whether its JWT has expired (it must enroll again, with a new token).
    pub fn expired(&self) -> bool {
        self.state.expires_at_unix_ms <= unix_ms_now()
    }

    fn save(&self, creds: &str) -> Result<(), WorkerError> {
        std::fs::create_dir_all(&self.dir).map_err(|error| {
            enrollment_error(format!("cannot create {}: {error}", self.dir.display()))
        })?;
        identity::write_secret(&self.dir.join(CREDS_FILE), creds)
            .map_err(|error| enrollment_error(error.to_string()))?;
        let state = serde_json::to_string_pretty(&self.state).expect("state serializes");
        identity::write_secret(&self.dir.join(STATE_FILE), &state)
            .map_err(|error| enrollment_error(error.to_string()))
    }
}

/// Where and how to reach NATS.
#[derive(Debug, Clone)]
pub struct BusAddress<'a> {
    pub url: &'a str,
    pub tls: &'a NatsTls,
    pub subjects: &'a Subjects,
}

/// Enrolls with `token`: a fresh key pair, the token's user on the bus, dispatch's answer kept
/// in `dir`. Asks for all of the token's organizations and capabilities.
pub async fn enroll(
    address: &BusAddress<'_>,
    token: &EnrollmentToken,
    dir: &Path,
) -> Result<Enrolled, WorkerError> {
    let key = nkeys::KeyPair::new_user();
    let token_credentials = if token.creds.is_empty() {
        NatsCredentials::none()
    } else {
        NatsCredentials::from_creds(token.creds.as_str())
    };
    let identity = Identity::Worker {
        worker_id: token.worker_id,
    };
    let bus = Bus::connect(
        address.url,
        &token_credentials,
        address.tls,
        address.subjects.clone(),
        &identity,
    )
    .await?;
    let request = v1::EnrollRequest {
        schema_version: messages::SCHEMA_VERSION,
        worker_id: token.worker_id.to_string(),
        token_id: token.token_id.to_string(),
        secret: token.secret.clone(),
        public_key: key.public_key(),
        organization_ids: Vec::new(),
        capabilities: Vec::new(),
    };
    let reply = ask_patiently(&bus, token, &request).await?;
    if let Some(error) = reply.error {
        return Err(enrollment_error(format!(
            "dispatch refused the enrollment: {}: {}",
            error.code, error.message
        )));
    }
    let seed = key.seed().expect("a generated key has its seed");
    let creds = identity::creds_file(&reply.jwt, &seed);
    let enrolled = Enrolled {
        state: EnrolledState {
            worker_id: token.worker_id,
            token_id: token.token_id,
            public_key: key.public_key(),
            expires_at_unix_ms: reply.expires_at_unix_ms,
            capabilities: reply.capabilities.clone(),
            organization_ids: reply.organization_ids.clone(),
        },
        credentials: NatsCredentials::from_creds(creds.as_str()),
        dir: dir.to_owned(),
    };
    enrolled.save(&creds)?;
    tracing::info!(
        worker_id = %token.worker_id,
        organizations = reply.organization_ids.len(),
        capabilities = %reply.capabilities.join(","),
        state = %dir.display(),
        "enrolled"
    );
    Ok(enrolled)
}

/// Sends `request` on the worker's `verb` subject and decodes the answer.
/// `enroll`, asked again with backoff while dispatch does not answer (no responders, a
/// timeout) on a connection that is up, until [`ENROLL_PATIENCE`] has passed or the token has
/// expired; an answer, refusal or not, and any other error end it at once.
async fn ask_patiently(
    bus: &Bus,
    token: &EnrollmentToken,
    request: &v1::EnrollRequest,
) -> Result<v1::EnrollReply, WorkerError> {
    use bus::async_nats::client::RequestErrorKind;
    use prost::Message as _;
    let subject = bus
        .subjects()
        .worker(&token.worker_id.to_string(), WorkerVerb::Enroll);
    let payload: bytes::Bytes = request.encode_to_vec().into();
    let started = std::time::Instant::now();
    let mut failures = 0;
    loop {
        let asked = bus.client().request(subject.clone(), payload.clone());
        let unanswered = match tokio::time::timeout(ANSWER_TIMEOUT, asked).await {
            Ok(Ok(answer)) => {
                return v1::EnrollReply::decode(answer.payload.as_ref()).map_err(|source| {
                    WorkerError::Decode {
                        what: WorkerVerb::Enroll.name(),
                        source,
                    }
                });
            }
            Ok(Err(error))
                if matches!(
                    error.kind(),
                    RequestErrorKind::NoResponders | RequestErrorKind::TimedOut
                ) =>
            {
                error.to_string()
            }
            Ok(Err(error)) => return Err(enrollment_error(format!("enroll: {error}"))),
            Err(_) => "dispatch did not answer enroll within 10 s".to_owned(),
        };
        let connected =
            bus.client().connection_state() == bus::async_nats::connection::State::Connected;
        if !connected
            || started.elapsed() >= ENROLL_PATIENCE
            || unix_ms_now() >= token.expires_at_unix_ms
        {
            return Err(enrollment_error(format!("enroll: {unanswered}")));
        }
        failures += 1;
        let delay = crate::retry::REQUESTS.jittered(failures);
        tracing::warn!(reason = unanswered, retry_in = ?delay, "enrollment unanswered, is dispatch running? asking again with the same key");
        tokio::time::sleep(delay).await;
    }
}

async fn ask<Reply: prost::Message + Default>(
    bus: &Bus,
    worker_id: Uuid,
    verb: WorkerVerb,
    request: &impl prost::Message,
) -> Result<Reply, WorkerError> {
    let subject = bus.subjects().worker(&worker_id.to_string(), verb);
    let answer = tokio::time::timeout(
        ANSWER_TIMEOUT,
        bus.client()
            .request(subject, request.encode_to_vec().into()),
    )
    .await
    .map_err(|_| {
        enrollment_error(format!(
            "dispatch did not answer {} within 10 s",
            verb.name()
        ))
    })?
    .map_err(|error| enrollment_error(format!("{}: {error}", verb.name())))?;
    Reply::decode(answer.payload.as_ref()).map_err(|source| WorkerError::Decode {
        what: verb.name(),
        source,
    })
}

/// Renews `enrolled`'s JWT when a third of its lifetime is left (retrying every 30 s on
/// failure until it expires), writes it to the state directory and reconnects `bus` with it,
/// until `stop`.
pub async fn keep_renewed(bus: Bus, mut enrolled: Enrolled, stop: CancellationToken) {
    let mut issued_at_unix_ms = unix_ms_now();
    loop {
        let lifetime = (enrolled.state.expires_at_unix_ms - issued_at_unix_ms).max(0);
        let renew_at = enrolled.state.expires_at_unix_ms - lifetime / 3;
        let wait = Duration::from_millis((renew_at - unix_ms_now()).max(0) as u64);
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        match renew(&bus, &mut enrolled).await {
            Ok(()) => {
                issued_at_unix_ms = unix_ms_now();
                if let Err(error) = bus.client().force_reconnect().await {
                    tracing::warn!(%error, "cannot reconnect with the renewed credentials; they take effect at the next reconnection");
                }
            }
            Err(error) => {
                tracing::warn!(
                    error = %error,
                    expires_at_unix_ms = enrolled.state.expires_at_unix_ms,
                    "cannot renew the worker's credentials; trying again in 30 s"
                );
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = tokio::time::sleep(RENEW_RETRY) => {}
                }
            }
        }
    }
}

/// One renewal: dispatch's new JWT for the same key, kept and presented from now on.
async fn renew(bus: &Bus, enrolled: &mut Enrolled) -> Result<(), WorkerError> {
    let worker_id = enrolled.state.worker_id;
    let request = v1::CredentialsRequest {
        schema_version: messages::SCHEMA_VERSION,
        worker_id: worker_id.to_string(),
        public_key: enrolled.state.public_key.clone(),
    };
    let reply: v1::CredentialsReply =
        ask(bus, worker_id, WorkerVerb::Credentials, &request).await?;
    if let Some(error) = reply.error {
        return Err(enrollment_error(format!(
            "dispatch refused to renew: {}: {}",
            error.code, error.message
        )));
    }
    let seed = enrolled
        .credentials
        .seed()
        .ok_or_else(|| enrollment_error("the worker's credentials hold no seed"))?;
    let creds = identity::creds_file(&reply.jwt, &seed);
    enrolled.state.expires_at_unix_ms = reply.expires_at_unix_ms;
    enrolled.save(&creds)?;
    enrolled.credentials.replace(creds.as_str());
    tracing::info!(
        worker_id = %worker_id,
        expires_at_unix_ms = reply.expires_at_unix_ms,
        "worker credentials renewed"
    );
    Ok(())
}
