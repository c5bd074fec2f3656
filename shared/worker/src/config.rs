//! The worker's own settings ([`WorkerConfig`]) and the ones dispatch hands it in its hello
//! reply ([`Session`]).

use std::time::Duration;

use messages::{limits, v1};
use uuid::Uuid;

use crate::WorkerError;

/// How the worker behaves; every field has a default from [`WorkerConfig::new`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerConfig {
    /// The identity registered with `palisade worker add`; also a token of every subject.
    pub worker_id: Uuid,
    /// Leases run at once, 1..=[`limits::WORKER_CAPACITY_MAX`].
    pub capacity: u32,
    /// Reported in hello, e.g. `"palisade-worker/0.1.0"`.
    pub software_version: String,
    /// How long one `acquire` long-polls when no task is due, at most
    /// [`limits::ACQUIRE_WAIT_MS_MAX`].
    pub acquire_wait: Duration,
    /// How long to wait for a reply to hello, renew and release; acquire waits this much
    /// longer than its long-poll.
    pub request_timeout: Duration,
    /// How long to wait for ingestion's acknowledgement of a batch, completion or failure
    /// before sending it again (doubling per resend up to [`WorkerConfig::RESEND_DELAY_MAX`]).
    pub ack_timeout: Duration,
    /// How long shutdown waits for in-flight leases to be released.
    pub shutdown_grace: Duration,
    /// Ask with every completion for the scan's next plugin, run in the slot the completion
    /// frees (`TaskComplete.lease_next`); `false` leaves every plugin to acquire.
    pub lease_next: bool,
}

impl WorkerConfig {
    pub const ACQUIRE_WAIT_DEFAULT: Duration = Duration::from_secs(10);
    pub const REQUEST_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
    pub const ACK_TIMEOUT_DEFAULT: Duration = Duration::from_secs(5);
    pub const SHUTDOWN_GRACE_DEFAULT: Duration = Duration::from_secs(15);
    /// Resends back off up to this, so an ingestion outage does not fill the results stream
    /// with copies of the same batch.
    pub const RESEND_DELAY_MAX: Duration = Duration::from_secs(60);

    /// The defaults for a worker with this identity and capacity.
    pub fn new(worker_id: Uuid, capacity: u32) -> Self {
        Self {
            worker_id,
            capacity,
            software_version: format!("palisade-worker-sdk/{}", env!("CARGO_PKG_VERSION")),
            acquire_wait: Self::ACQUIRE_WAIT_DEFAULT,
            request_timeout: Self::REQUEST_TIMEOUT_DEFAULT,
            ack_timeout: Self::ACK_TIMEOUT_DEFAULT,
            shutdown_grace: Self::SHUTDOWN_GRACE_DEFAULT,
            lease_next: true,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), WorkerError> {
        let invalid = |reason: String| Err(WorkerError::InvalidConfig { reason });
        if self.worker_id.is_nil() {
            return invalid(
                "worker_id is the nil UUID: use the id `palisade worker add` printed".into(),
            );
        }
        if self.capacity == 0 || self.capacity > limits::WORKER_CAPACITY_MAX {
            return invalid(format!(
                "capacity {} is outside 1..={}",
                self.capacity,
                limits::WORKER_CAPACITY_MAX
            ));
        }
        if self.acquire_wait > Duration::from_millis(limits::ACQUIRE_WAIT_MS_MAX.into()) {
            return invalid(format!(
                "acquire_wait {:?} is over the protocol's {} ms",
                self.acquire_wait,
                limits::ACQUIRE_WAIT_MS_MAX
            ));
        }
        for (name, value) in [
            ("request_timeout", self.request_timeout),
            ("ack_timeout", self.ack_timeout),
        ] {
            if value.is_zero() {
                return invalid(format!("{name} must be more than zero"));
            }
        }
        Ok(())
    }
}

/// What dispatch told this worker in its hello reply: the lease and batch limits every lease
/// task follows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Session {
    pub lease_ttl: Duration,
    /// The renew period the worker uses: the smaller of dispatch's renew interval and a third
    /// of the lease TTL, so two renewals can fail before the lease lapses.
    pub renew_interval: Duration,
    pub batch_findings_max: usize,
    /// The encoded `BatchPayload` bytes a batch may hold: dispatch's limit, lowered when the
    /// NATS server's `max_payload` would not carry a full batch with its envelope.
    pub batch_bytes_max: usize,
    pub organization_ids: Vec<String>,
}

impl Session {
    /// Bytes of a `ResultBatch` beyond its payload (lease ids, key, checksum) and of the NATS
    /// headers, rounded up generously.
    pub const ENVELOPE_BYTES_MAX: usize = 8 * 1024;

    /// Checks a hello reply that carries no error. `server_payload_max` is the NATS server's
    /// `max_payload`.
    pub(crate) fn from_reply(
        reply: &v1::HelloReply,
        server_payload_max: usize,
    ) -> Result<Self, WorkerError> {
        let invalid = |reason: String| Err(WorkerError::InvalidHelloReply { reason });
        if reply.lease_ttl_ms == 0 {
            return invalid("lease_ttl_ms is 0".into());
        }
        if reply.renew_interval_ms == 0 || reply.renew_interval_ms >= reply.lease_ttl_ms {
            return invalid(format!(
                "renew_interval_ms {} is not within 1..lease_ttl_ms ({})",
                reply.renew_interval_ms, reply.lease_ttl_ms
            ));
        }
        if reply.batch_findings_max == 0 || reply.batch_bytes_max == 0 {
            return invalid("batch_findings_max and batch_bytes_max must be more than zero".into());
        }
        if server_payload_max <= Self::ENVELOPE_BYTES_MAX {
            return invalid(format!(
                "the NATS server's max_payload ({server_payload_max} bytes) cannot carry a result batch"
            ));
        }
        let lease_ttl = Duration::from_millis(reply.lease_ttl_ms.into());
        let renew_interval =
            Duration::from_millis(reply.renew_interval_ms.into()).min(lease_ttl / 3);
        let batch_bytes_max =
            (reply.batch_bytes_max as usize).min(server_payload_max - Self::ENVELOPE_BYTES_MAX);
        Ok(Self {
            lease_ttl,
            renew_interval,
            batch_findings_max: reply.batch_findings_max as usize,
            batch_bytes_max,
            organization_ids: reply.organization_ids.clone(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply() -> v1::HelloReply {
        v1::HelloReply {
            error: None,
            lease_ttl_ms: 30_000,
            renew_interval_ms: 10_000,
            batch_findings_max: 1_000,
            batch_bytes_max: 1024 * 1024,
            organization_ids: vec![],
        }
    }

    #[test]
    fn renews_at_most_every_third_of_the_ttl() {
        let mut reply = reply();
        reply.renew_interval_ms = 20_000;
        let session = Session::from_reply(&reply, 8 * 1024 * 1024).unwrap();
        assert_eq!(session.renew_interval, Duration::from_secs(10));
        reply.renew_interval_ms = 2_000;
        let session = Session::from_reply(&reply, 8 * 1024 * 1024).unwrap();
        assert_eq!(session.renew_interval, Duration::from_secs(2));
    }

    #[test]
    fn batches_fit_the_server_payload_limit() {
        let session = Session::from_reply(&reply(), 1024 * 1024).unwrap();
        assert_eq!(
            session.batch_bytes_max,
            1024 * 1024 - Session::ENVELOPE_BYTES_MAX
        );
        let session = Session::from_reply(&reply(), 8 * 1024 * 1024).unwrap();
        assert_eq!(session.batch_bytes_max, 1024 * 1024);
    }

    #[test]
    fn refuses_replies_it_cannot_work_with() {
        let mut bad = reply();
        bad.renew_interval_ms = bad.lease_ttl_ms;
        assert!(Session::from_reply(&bad, 1 << 20).is_err());
        let mut bad = reply();
        bad.batch_findings_max = 0;
        assert!(Session::from_reply(&bad, 1 << 20).is_err());
        assert!(Session::from_reply(&reply(), 100).is_err());
    }

    #[test]
    fn validates_the_config() {
        let id = Uuid::new_v4();
        assert!(WorkerConfig::new(id, 4).validate().is_ok());
        assert!(WorkerConfig::new(id, 0).validate().is_err());
        assert!(WorkerConfig::new(id, 1_025).validate().is_err());
        assert!(WorkerConfig::new(Uuid::nil(), 1).validate().is_err());
        let mut config = WorkerConfig::new(id, 1);
        config.acquire_wait = Duration::from_secs(31);
        assert!(config.validate().is_err());
    }
}
