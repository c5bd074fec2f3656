//! Subject and stream names. Every name is derived from one prefix so that tests (and
//! several palisade installations on one NATS) never see each other's traffic.

use thiserror::Error;

/// A subject prefix that is not one NATS token of `[A-Za-z0-9_-]`.
#[derive(Debug, Error)]
#[error("invalid subject prefix {0:?}: use 1..=32 characters of [A-Za-z0-9_-]")]
pub struct InvalidPrefix(pub String);

/// Lifecycle events, published from the outbox to `<prefix>.v1.event.<name>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EventKind {
    ScanAdmitted,
    ScanRejected,
    ScanCompleted,
    ScanFailed,
    ScanCancelled,
    TaskReady,
    TaskLeased,
    TaskCompleted,
    TaskFailed,
}

impl EventKind {
    pub const ALL: [EventKind; 9] = [
        EventKind::ScanAdmitted,
        EventKind::ScanRejected,
        EventKind::ScanCompleted,
        EventKind::ScanFailed,
        EventKind::ScanCancelled,
        EventKind::TaskReady,
        EventKind::TaskLeased,
        EventKind::TaskCompleted,
        EventKind::TaskFailed,
    ];

    /// The subject suffix after `<prefix>.v1.event.`.
    pub const fn name(self) -> &'static str {
        match self {
            EventKind::ScanAdmitted => "scan.admitted",
            EventKind::ScanRejected => "scan.rejected",
            EventKind::ScanCompleted => "scan.completed",
            EventKind::ScanFailed => "scan.failed",
            EventKind::ScanCancelled => "scan.cancelled",
            EventKind::TaskReady => "task.ready",
            EventKind::TaskLeased => "task.leased",
            EventKind::TaskCompleted => "task.completed",
            EventKind::TaskFailed => "task.failed",
        }
    }
}

/// What a worker sends; the last token of `<prefix>.v1.worker.<worker_id>.<verb>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WorkerVerb {
    /// Request/reply to dispatch.
    Hello,
    Acquire,
    Renew,
    Release,
    /// JetStream, consumed by ingestion.
    Result,
    Complete,
    Fail,
    /// Ingestion's answers, core NATS, to the worker.
    Ack,
}

impl WorkerVerb {
    pub const fn name(self) -> &'static str {
        match self {
            WorkerVerb::Hello => "hello",
            WorkerVerb::Acquire => "acquire",
            WorkerVerb::Renew => "renew",
            WorkerVerb::Release => "release",
            WorkerVerb::Result => "result",
            WorkerVerb::Complete => "complete",
            WorkerVerb::Fail => "fail",
            WorkerVerb::Ack => "ack",
        }
    }
}

/// All subject and stream names of one palisade installation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subjects {
    prefix: String,
}

impl Subjects {
    /// The prefix production uses.
    pub const DEFAULT_PREFIX: &'static str = "palisade";

    pub fn new(prefix: &str) -> Result<Self, InvalidPrefix> {
        let valid = !prefix.is_empty()
            && prefix.len() <= 32
            && prefix
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
        if !valid {
            return Err(InvalidPrefix(prefix.to_owned()));
        }
        Ok(Self {
            prefix: prefix.to_owned(),
        })
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// JetStream: durable scan requests.
    pub fn scan_request(&self) -> String {
        format!("{}.v1.scan.request", self.prefix)
    }

    /// Core NATS request/reply: scan request with a synchronous answer.
    pub fn scan_submit(&self) -> String {
        format!("{}.v1.scan.submit", self.prefix)
    }

    pub fn event(&self, kind: EventKind) -> String {
        format!("{}.v1.event.{}", self.prefix, kind.name())
    }

    /// Core NATS request/reply: cancel a scan or a task (answered by dispatch).
    pub fn cancel(&self) -> String {
        format!("{}.v1.cancel", self.prefix)
    }

    /// Core NATS only (no stream captures it): hints that wake dispatch's waiting acquires,
    /// e.g. when the reaper sees retried tasks become due. Never a decision.
    pub fn dispatch_wakeup(&self) -> String {
        format!("{}.v1.dispatch.wakeup", self.prefix)
    }

    /// Core NATS only (no stream captures it): a dispatch replica publishes it once it serves
    /// the worker verbs. A worker whose acquire (or hello) is still unanswered asks again at
    /// once, with the same request id: its dispatch may have died holding the long-poll.
    /// Never a decision.
    pub fn dispatch_ready(&self) -> String {
        format!("{}.v1.dispatch.ready", self.prefix)
    }

    pub fn events_wildcard(&self) -> String {
        format!("{}.v1.event.>", self.prefix)
    }

    pub fn worker(&self, worker_id: &str, verb: WorkerVerb) -> String {
        format!("{}.v1.worker.{}.{}", self.prefix, worker_id, verb.name())
    }

    /// `<prefix>.v1.worker.*.<verb>`: what dispatch and ingestion subscribe to.
    pub fn worker_wildcard(&self, verb: WorkerVerb) -> String {
        format!("{}.v1.worker.*.{}", self.prefix, verb.name())
    }

    /// The worker id token of a `<prefix>.v1.worker.<worker_id>.<verb>` subject.
    pub fn worker_id_of<'s>(&self, subject: &'s str) -> Option<&'s str> {
        let rest = subject
            .strip_prefix(&self.prefix)?
            .strip_prefix(".v1.worker.")?;
        let (worker_id, _verb) = rest.split_once('.')?;
        Some(worker_id)
    }

    fn stream(&self, suffix: &str) -> String {
        format!(
            "{}_{}",
            self.prefix.replace('-', "_").to_ascii_uppercase(),
            suffix
        )
    }

    /// Stream of scan requests.
    pub fn requests_stream(&self) -> String {
        self.stream("REQUESTS")
    }

    /// Stream of lifecycle events (the outbox's destination).
    pub fn events_stream(&self) -> String {
        self.stream("EVENTS")
    }

    /// Stream of worker results, completions and failures.
    pub fn results_stream(&self) -> String {
        self.stream("RESULTS")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_prefix() {
        let s = Subjects::new("t-1").unwrap();
        assert_eq!(s.scan_request(), "t-1.v1.scan.request");
        assert_eq!(s.event(EventKind::TaskReady), "t-1.v1.event.task.ready");
        assert_eq!(s.worker("w", WorkerVerb::Ack), "t-1.v1.worker.w.ack");
        assert_eq!(
            s.worker_wildcard(WorkerVerb::Result),
            "t-1.v1.worker.*.result"
        );
        assert_eq!(s.worker_id_of("t-1.v1.worker.abc.renew"), Some("abc"));
        assert_eq!(s.worker_id_of("other.v1.worker.abc.renew"), None);
        assert_eq!(s.results_stream(), "T_1_RESULTS");
    }

    #[test]
    fn rejects_prefixes_that_are_not_one_token() {
        for bad in ["", "a.b", "a*", "a>", "a b", &"x".repeat(33)] {
            assert!(Subjects::new(bad).is_err(), "{bad:?}");
        }
    }
}
