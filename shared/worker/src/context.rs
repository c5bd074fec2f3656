//! What every lease task of one worker shares: the bus, the worker's identity and settings,
//! the session from hello, the counters and the leases being renewed; plus the request/reply
//! and release helpers.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use messages::{WorkerVerb, v1};

use crate::acks::AckRouter;
use crate::plugin::Plugin;
use crate::renew::Renewals;
use crate::stats::Counter;
use crate::{Session, WorkerConfig, WorkerStats};

/// Times a release is tried before the lease is left to expire.
const RELEASE_SENDS_MAX: u32 = 2;

/// Why a request to dispatch got no usable reply.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RequestError {
    /// Timed out, no responders, or the connection is down: the request may be retried.
    #[error(transparent)]
    Bus(#[from] bus::BusError),
    #[error("undecodable reply: {0}")]
    Decode(#[from] prost::DecodeError),
}

pub(crate) struct Context {
    pub bus: bus::Bus,
    pub worker_id: String,
    pub config: WorkerConfig,
    pub session: Session,
    pub stats: Arc<WorkerStats>,
    /// The session's leases, renewed together by `renew::run`.
    pub renewals: Renewals,
    /// Where ingestion's acknowledgements go: the lease task of their attempt.
    pub router: Arc<AckRouter>,
    /// The worker's plugins by name.
    pub plugins: HashMap<&'static str, Arc<dyn Plugin>>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("worker_id", &self.worker_id)
            .field("session", &self.session)
            .finish_non_exhaustive()
    }
}

impl Context {
    /// `<prefix>.v1.worker.<worker_id>.<verb>`.
    pub fn subject(&self, verb: WorkerVerb) -> String {
        self.bus.subjects().worker(&self.worker_id, verb)
    }

    /// A core-NATS request to dispatch and its decoded reply.
    pub async fn request<Reply>(
        &self,
        verb: WorkerVerb,
        request: &impl prost::Message,
        timeout: Duration,
    ) -> Result<Reply, RequestError>
    where
        Reply: prost::Message + Default,
    {
        let payload = Bytes::from(request.encode_to_vec());
        let reply = self
            .bus
            .request(self.subject(verb), payload, timeout)
            .await?;
        Ok(Reply::decode(reply.payload)?)
    }

    /// Hands `lease` back to dispatch so its task runs again without spending an attempt.
    /// Best effort: a lease whose release is lost expires and the reaper recovers it.
    pub async fn release(&self, lease: &v1::LeaseRef, reason: &str) {
        let request = v1::ReleaseRequest {
            schema_version: messages::SCHEMA_VERSION,
            worker_id: self.worker_id.clone(),
            lease: Some(lease.clone()),
            reason: reason.to_owned(),
        };
        for send in 1..=RELEASE_SENDS_MAX {
            let reply = self
                .request::<v1::ReleaseReply>(
                    WorkerVerb::Release,
                    &request,
                    self.config.request_timeout,
                )
                .await;
            match reply {
                Ok(v1::ReleaseReply { error: None }) => {
                    self.stats.add(Counter::Released);
                    tracing::info!(task_id = %lease.task_id, attempt_id = %lease.attempt_id, "lease released");
                    return;
                }
                Ok(v1::ReleaseReply { error: Some(error) }) => {
                    // lease_lost here means the lease had already ended: nothing left to return.
                    tracing::info!(task_id = %lease.task_id, attempt_id = %lease.attempt_id, code = %error.code, message = %error.message, "release refused");
                    return;
                }
                Err(error) => {
                    tracing::warn!(task_id = %lease.task_id, attempt_id = %lease.attempt_id, error = %telemetry::chain(&error), send, "release unanswered");
                }
            }
        }
        tracing::warn!(task_id = %lease.task_id, attempt_id = %lease.attempt_id, "release gave up; the lease will expire");
    }
}
