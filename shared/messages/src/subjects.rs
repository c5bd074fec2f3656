//! Subject and stream names. Every name is derived from one prefix so that tests (and
//! several palisade installations on one NATS) never see each other's traffic.
//!
//! Who may use a subject is part of its name: a worker's subjects carry its id
//! (`<prefix>.v1.worker.<worker_id>.<verb>`), a client's carry its organization and its client
//! id (`<prefix>.v1.org.<organization_id>.client.<client_id>.<verb>`), and the events a tenant
//! may read carry its organization (`<prefix>.v1.org.<organization_id>.event.<name>`). NATS
//! permissions on those names ([`crate::access`]) are what confine each credential; the
//! services check that a message's fields agree with its subject's tokens.

use thiserror::Error;

/// A subject prefix that is not one NATS token of `[A-Za-z0-9_-]`.
#[derive(Debug, Error)]
#[error("invalid subject prefix {0:?}: use 1..=32 characters of [A-Za-z0-9_-]")]
pub struct InvalidPrefix(pub String);

/// A subject token built from an id that is not a NATS token of `[A-Za-z0-9_-]`: it could
/// inject a wildcard or an extra token.
#[derive(Debug, Error, PartialEq, Eq)]
#[error(
    "{what} {value:?} cannot be a subject token: use 1..={TOKEN_BYTES_MAX} characters of [A-Za-z0-9_-]"
)]
pub struct InvalidToken {
    pub what: &'static str,
    pub value: String,
}

/// Longest id palisade puts into a subject token.
pub const TOKEN_BYTES_MAX: usize = 64;

/// `value` as one subject token, or why it cannot be one.
pub fn token<'v>(what: &'static str, value: &'v str) -> Result<&'v str, InvalidToken> {
    let valid = !value.is_empty()
        && value.len() <= TOKEN_BYTES_MAX
        && value
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if valid {
        Ok(value)
    } else {
        Err(InvalidToken {
            what,
            value: value.to_owned(),
        })
    }
}

/// Who may read an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Audience {
    /// The scan's organization: published under `<prefix>.v1.org.<organization_id>.event.`.
    Tenant,
    /// palisade's services only (they name workers, attempts and tasks):
    /// `<prefix>.v1.event.`.
    Services,
}

/// Lifecycle events, published from the outbox: a tenant's to
/// `<prefix>.v1.org.<organization_id>.event.<name>`, the services' own to
/// `<prefix>.v1.event.<name>` (see [`EventKind::audience`]).
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
    EnrichmentCompleted,
    EnrichmentFailed,
}

impl EventKind {
    pub const ALL: [EventKind; 11] = [
        EventKind::ScanAdmitted,
        EventKind::ScanRejected,
        EventKind::ScanCompleted,
        EventKind::ScanFailed,
        EventKind::ScanCancelled,
        EventKind::TaskReady,
        EventKind::TaskLeased,
        EventKind::TaskCompleted,
        EventKind::TaskFailed,
        EventKind::EnrichmentCompleted,
        EventKind::EnrichmentFailed,
    ];

    /// Who may read it: scan events are the tenant's, task events the services'.
    pub const fn audience(self) -> Audience {
        match self {
            EventKind::ScanAdmitted
            | EventKind::ScanRejected
            | EventKind::ScanCompleted
            | EventKind::ScanFailed
            | EventKind::ScanCancelled
            | EventKind::EnrichmentCompleted
            | EventKind::EnrichmentFailed => Audience::Tenant,
            EventKind::TaskReady
            | EventKind::TaskLeased
            | EventKind::TaskCompleted
            | EventKind::TaskFailed => Audience::Services,
        }
    }

    /// The subject suffix after `…event.`.
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
            EventKind::EnrichmentCompleted => "enrichment.completed",
            EventKind::EnrichmentFailed => "enrichment.failed",
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
    /// Request/reply to ingestion: prepare and commit an artifact upload session.
    Artifact,
    /// Request/reply to dispatch: a new worker presents its enrollment token and public key
    /// and receives its credentials; the only verb an enrollment token's user may send.
    Enroll,
    /// Request/reply to dispatch: an enrolled worker renews its credentials before they
    /// expire.
    Credentials,
}

impl WorkerVerb {
    /// Every verb.
    pub const ALL: [WorkerVerb; 11] = [
        WorkerVerb::Hello,
        WorkerVerb::Acquire,
        WorkerVerb::Renew,
        WorkerVerb::Release,
        WorkerVerb::Result,
        WorkerVerb::Complete,
        WorkerVerb::Fail,
        WorkerVerb::Ack,
        WorkerVerb::Artifact,
        WorkerVerb::Enroll,
        WorkerVerb::Credentials,
    ];

    /// What a worker publishes durably: the results stream captures these, and ingestion's
    /// consumer decides them.
    pub const DURABLE: [WorkerVerb; 3] =
        [WorkerVerb::Result, WorkerVerb::Complete, WorkerVerb::Fail];

    /// What a worker sends (every verb but `ack`, which it receives).
    pub const SENT: [WorkerVerb; 10] = [
        WorkerVerb::Hello,
        WorkerVerb::Acquire,
        WorkerVerb::Renew,
        WorkerVerb::Release,
        WorkerVerb::Result,
        WorkerVerb::Complete,
        WorkerVerb::Fail,
        WorkerVerb::Artifact,
        WorkerVerb::Enroll,
        WorkerVerb::Credentials,
    ];

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
            WorkerVerb::Artifact => "artifact",
            WorkerVerb::Enroll => "enroll",
            WorkerVerb::Credentials => "credentials",
        }
    }
}

/// What a client sends; the last token of
/// `<prefix>.v1.org.<organization_id>.client.<client_id>.<verb>`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ClientVerb {
    /// JetStream, consumed by admission: a durable scan request.
    Request,
    /// Request/reply to admission: a scan request with a synchronous answer.
    Submit,
    /// Request/reply to dispatch: cancel a scan or a task of this organization.
    Cancel,
    /// Request/reply to enrichment: enrich a completed scan of this organization.
    Enrich,
    /// Request/reply to ingestion: read this organization's findings, set their dispositions.
    Findings,
    /// Request/reply to ingestion: read this organization's events after a cursor (long-poll).
    Events,
    /// Request/reply to ingestion: list this organization's scans.
    Scans,
    /// Request/reply to admission: manage this organization's recurring scans.
    Schedules,
}

impl ClientVerb {
    /// Every verb.
    pub const ALL: [ClientVerb; 8] = [
        ClientVerb::Request,
        ClientVerb::Submit,
        ClientVerb::Cancel,
        ClientVerb::Enrich,
        ClientVerb::Findings,
        ClientVerb::Events,
        ClientVerb::Scans,
        ClientVerb::Schedules,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            ClientVerb::Request => "request",
            ClientVerb::Submit => "submit",
            ClientVerb::Cancel => "cancel",
            ClientVerb::Enrich => "enrich",
            ClientVerb::Findings => "findings",
            ClientVerb::Events => "events",
            ClientVerb::Scans => "scans",
            ClientVerb::Schedules => "schedules",
        }
    }
}

/// The organization and client tokens of a client subject.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientSubject<'s> {
    pub organization_id: &'s str,
    pub client_id: &'s str,
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

    /// A client's subject: `<prefix>.v1.org.<organization_id>.client.<client_id>.<verb>`.
    /// The organization is a UUID in its canonical spelling; the client id must be a token.
    pub fn client(
        &self,
        organization_id: &uuid::Uuid,
        client_id: &str,
        verb: ClientVerb,
    ) -> Result<String, InvalidToken> {
        let client_id = token("client_id", client_id)?;
        Ok(format!(
            "{}.v1.org.{organization_id}.client.{client_id}.{}",
            self.prefix,
            verb.name()
        ))
    }

    /// `<prefix>.v1.org.*.client.*.<verb>`: what admission and dispatch serve, and the
    /// requests stream's subject.
    pub fn client_wildcard(&self, verb: ClientVerb) -> String {
        format!("{}.v1.org.*.client.*.{}", self.prefix, verb.name())
    }

    /// The organization and client tokens of a client subject of this installation:
    /// `<prefix>.v1.org.<organization_id>.client.<client_id>.<verb>`, each of the three one
    /// token as [`token`] defines it, so nothing it returns could make another subject.
    pub fn client_of<'s>(&self, subject: &'s str) -> Option<ClientSubject<'s>> {
        let (organization_id, client_id) = self.client_tokens(subject)?;
        Some(ClientSubject {
            organization_id: token("organization_id", organization_id).ok()?,
            client_id: token("client_id", client_id).ok()?,
        })
    }

    /// The client token of `<prefix>.v1.org.<organization_id>.client.<client_id>.<verb>` as
    /// NATS delivered it, whatever its spelling: a token [`Subjects::client_of`] refuses (65
    /// characters, a `:`) is still where the refusal of its request is answered, at the inbox
    /// that token names ([`Subjects::may_answer`]), which no other identity's inbox can be.
    pub fn client_token_of<'s>(&self, subject: &'s str) -> Option<&'s str> {
        let (_, client_id) = self.client_tokens(subject)?;
        let plain = !client_id.is_empty()
            && client_id != "*"
            && client_id != ">"
            && !client_id.bytes().any(|b| b.is_ascii_whitespace());
        plain.then_some(client_id)
    }

    /// The organization and client tokens of a client subject of this installation, as sent,
    /// its verb one token as [`token`] defines it.
    fn client_tokens<'s>(&self, subject: &'s str) -> Option<(&'s str, &'s str)> {
        let rest = subject
            .strip_prefix(&self.prefix)?
            .strip_prefix(".v1.org.")?;
        let (organization_id, rest) = rest.split_once('.')?;
        let (client_id, verb) = rest.strip_prefix("client.")?.split_once('.')?;
        token("verb", verb).ok()?;
        Some((organization_id, client_id))
    }

    /// An event of the services' own (`EventKind::audience` is `Services`):
    /// `<prefix>.v1.event.<name>`.
    pub fn event(&self, kind: EventKind) -> String {
        debug_assert_eq!(kind.audience(), Audience::Services, "{kind:?}");
        format!("{}.v1.event.{}", self.prefix, kind.name())
    }

    /// A tenant's event (`EventKind::audience` is `Tenant`):
    /// `<prefix>.v1.org.<organization_id>.event.<name>`.
    pub fn tenant_event(&self, organization_id: &uuid::Uuid, kind: EventKind) -> String {
        debug_assert_eq!(kind.audience(), Audience::Tenant, "{kind:?}");
        format!(
            "{}.v1.org.{organization_id}.event.{}",
            self.prefix,
            kind.name()
        )
    }

    /// One kind of tenant event, of every organization: `<prefix>.v1.org.*.event.<name>`.
    pub fn tenant_event_wildcard(&self, kind: EventKind) -> String {
        debug_assert_eq!(kind.audience(), Audience::Tenant, "{kind:?}");
        format!("{}.v1.org.*.event.{}", self.prefix, kind.name())
    }

    /// Every event of one organization: `<prefix>.v1.org.<organization_id>.event.>`.
    pub fn tenant_events(&self, organization_id: &uuid::Uuid) -> String {
        format!("{}.v1.org.{organization_id}.event.>", self.prefix)
    }

    /// Every tenant's events: `<prefix>.v1.org.*.event.>` (what ingestion hears to wake the
    /// `events` long-polls of an organization).
    pub fn tenant_events_wildcard(&self) -> String {
        format!("{}.v1.org.*.event.>", self.prefix)
    }

    /// The organization token and the event name of a tenant event subject
    /// `<prefix>.v1.org.<organization_id>.event.<name>`; `None` for anything else (the
    /// services' `<prefix>.v1.event.…` included). The organization is one token as [`token`]
    /// defines it; the name is what follows `.event.`, whatever it is.
    pub fn tenant_event_of<'s>(&self, subject: &'s str) -> Option<(&'s str, &'s str)> {
        let rest = subject
            .strip_prefix(&self.prefix)?
            .strip_prefix(".v1.org.")?;
        let (organization_id, rest) = rest.split_once('.')?;
        let name = rest.strip_prefix("event.")?;
        Some((token("organization_id", organization_id).ok()?, name))
    }

    /// The event kind a subject of the events stream names, tenant or services'.
    pub fn event_kind_of(&self, subject: &str) -> Option<EventKind> {
        let rest = subject.strip_prefix(&self.prefix)?.strip_prefix(".v1.")?;
        let name = match rest.strip_prefix("event.") {
            Some(name) => name,
            None => rest
                .strip_prefix("org.")?
                .split_once('.')?
                .1
                .strip_prefix("event.")?,
        };
        EventKind::ALL.into_iter().find(|kind| kind.name() == name)
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

    /// The events stream's subjects: the services' events and every tenant's.
    pub fn events_wildcards(&self) -> [String; 2] {
        [
            format!("{}.v1.event.>", self.prefix),
            self.tenant_events_wildcard(),
        ]
    }

    /// Where replies and PubAcks to one identity arrive: its own inbox prefix, so a
    /// credential may be granted its own replies and nobody else's (never `_INBOX.>`).
    pub fn inbox_prefix(&self, identity: &crate::access::Identity) -> String {
        format!("_INBOX_{}.{}", self.prefix, identity.token())
    }

    /// `worker_id` is a UUID in its canonical spelling (or, in tests that forge subjects,
    /// any token).
    pub fn worker(&self, worker_id: &str, verb: WorkerVerb) -> String {
        debug_assert!(token("worker_id", worker_id).is_ok(), "{worker_id:?}");
        format!("{}.v1.worker.{}.{}", self.prefix, worker_id, verb.name())
    }

    /// `<prefix>.v1.worker.*.<verb>`: what dispatch and ingestion subscribe to.
    pub fn worker_wildcard(&self, verb: WorkerVerb) -> String {
        format!("{}.v1.worker.*.{}", self.prefix, verb.name())
    }

    /// The worker id token of a `<prefix>.v1.worker.<worker_id>.<verb>` subject, when the
    /// worker id and the verb are each one token as [`token`] defines it. A subject NATS
    /// delivers on `worker.*.<verb>` may still carry a token of other characters (`{…}`, `:`);
    /// such a token is no worker's and gets `None`, so no subject built from it (ingestion's ack
    /// subject) can name anything but a worker.
    pub fn worker_id_of<'s>(&self, subject: &'s str) -> Option<&'s str> {
        let rest = subject
            .strip_prefix(&self.prefix)?
            .strip_prefix(".v1.worker.")?;
        let (worker_id, verb) = rest.split_once('.')?;
        token("verb", verb).ok()?;
        token("worker_id", worker_id).ok()
    }

    /// Where a worker publishes the chunks of one upload session (a JetStream publish, its
    /// PubAck awaited): `<prefix>.v1.upload.<worker_id>.<upload_id>`. Ingestion serves it: it
    /// checks that the session is open and the chunk is one of it, stores it on
    /// [`Subjects::upload_stored`] and answers in the PubAck's form. Both are tokens (a worker
    /// id and an upload id are UUIDs); a worker may publish under its own id only.
    pub fn upload(&self, worker_id: &str, upload_id: &str) -> String {
        debug_assert!(token("worker_id", worker_id).is_ok(), "{worker_id:?}");
        debug_assert!(token("upload_id", upload_id).is_ok(), "{upload_id:?}");
        format!("{}.v1.upload.{worker_id}.{upload_id}", self.prefix)
    }

    /// `<prefix>.v1.upload.<worker_id>.*`: every upload subject of one worker (its permission).
    pub fn worker_uploads(&self, worker_id: &str) -> String {
        format!("{}.v1.upload.{worker_id}.*", self.prefix)
    }

    /// `<prefix>.v1.upload.*.*`: every worker's upload subjects, what ingestion serves (and
    /// palisade's account exports, each worker's account importing its own). No stream
    /// captures it.
    pub fn upload_wildcard(&self) -> String {
        format!("{}.v1.upload.*.*", self.prefix)
    }

    /// The worker id and upload id tokens of a `<prefix>.v1.upload.<worker_id>.<upload_id>`
    /// subject, each one token as [`token`] defines it; `None` for anything else.
    pub fn upload_of<'s>(&self, subject: &'s str) -> Option<(&'s str, &'s str)> {
        let rest = subject
            .strip_prefix(&self.prefix)?
            .strip_prefix(".v1.upload.")?;
        let (worker_id, upload_id) = rest.split_once('.')?;
        Some((
            token("worker_id", worker_id).ok()?,
            token("upload_id", upload_id).ok()?,
        ))
    }

    /// Where ingestion stores a chunk it accepted on [`Subjects::upload`]: the uploads
    /// stream's subject `<prefix>.v1.uploaded.<worker_id>.<upload_id>`. Only palisade's
    /// services may publish there (ingestion does); no worker or client account imports it.
    pub fn upload_stored(&self, worker_id: &str, upload_id: &str) -> String {
        debug_assert!(token("worker_id", worker_id).is_ok(), "{worker_id:?}");
        debug_assert!(token("upload_id", upload_id).is_ok(), "{upload_id:?}");
        format!("{}.v1.uploaded.{worker_id}.{upload_id}", self.prefix)
    }

    /// `<prefix>.v1.uploaded.*.*`: the uploads stream's subjects (what ingestion publishes
    /// the chunks it accepted on).
    pub fn stored_uploads_wildcard(&self) -> String {
        format!("{}.v1.uploaded.*.*", self.prefix)
    }

    /// The template `subject` was built from, for span names (OpenTelemetry wants names of
    /// low cardinality): the prefix and every id replaced by a placeholder, e.g.
    /// `{prefix}.v1.org.{organization_id}.client.{client_id}.submit` or
    /// `{prefix}.v1.worker.{worker_id}.acquire`. Verbs and event names are kept when they are
    /// palisade's own and become `{verb}` / `{event}` otherwise, so a hostile subject adds no
    /// name either. A subject outside this installation keeps its first two tokens
    /// (`$JS.API.…` → `$JS.API.{request}`, `_INBOX_….…` → `{inbox}`).
    pub fn template_of(&self, subject: &str) -> String {
        let verb = |name: &str, known: &[&str]| {
            if known.contains(&name) {
                name.to_owned()
            } else {
                "{verb}".to_owned()
            }
        };
        let event = |name: &str| {
            EventKind::ALL
                .into_iter()
                .find(|kind| kind.name() == name)
                .map_or_else(|| "{event}".to_owned(), |kind| kind.name().to_owned())
        };
        let Some(rest) = subject
            .strip_prefix(&self.prefix)
            .and_then(|rest| rest.strip_prefix(".v1."))
        else {
            if subject.starts_with("_INBOX") {
                return "{inbox}".to_owned();
            }
            let mut tokens = subject.splitn(3, '.');
            return match (tokens.next(), tokens.next(), tokens.next()) {
                (Some(first), Some(second), Some(_)) => format!("{first}.{second}.{{request}}"),
                _ => "{subject}".to_owned(),
            };
        };
        let client_verbs: Vec<&str> = ClientVerb::ALL.iter().map(|verb| verb.name()).collect();
        let worker_verbs: Vec<&str> = WorkerVerb::ALL.iter().map(|verb| verb.name()).collect();
        let tokens: Vec<&str> = rest.split('.').collect();
        let tail = match tokens.as_slice() {
            ["org", _, "client", _, name] => format!(
                "org.{{organization_id}}.client.{{client_id}}.{}",
                verb(name, &client_verbs)
            ),
            ["org", _, "event", name @ ..] => {
                format!("org.{{organization_id}}.event.{}", event(&name.join(".")))
            }
            ["event", name @ ..] => format!("event.{}", event(&name.join("."))),
            ["worker", _, name] => format!("worker.{{worker_id}}.{}", verb(name, &worker_verbs)),
            ["upload", _, _] => "upload.{worker_id}.{upload_id}".to_owned(),
            ["uploaded", _, _] => "uploaded.{worker_id}.{upload_id}".to_owned(),
            ["dispatch", name @ ("wakeup" | "ready")] => format!("dispatch.{name}"),
            _ => "{subject}".to_owned(),
        };
        format!("{{prefix}}.v1.{tail}")
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

    /// Every worker's every verb: the filter of ingestion's consumer on the results stream,
    /// which holds the [`WorkerVerb::DURABLE`] ones.
    pub fn results_wildcard(&self) -> String {
        format!("{}.v1.worker.*.*", self.prefix)
    }

    /// Stream of worker results, completions and failures.
    pub fn results_stream(&self) -> String {
        self.stream("RESULTS")
    }

    /// Stream of artifact chunks in upload sessions not yet committed or removed.
    pub fn uploads_stream(&self) -> String {
        self.stream("UPLOADS")
    }

    /// The JetStream Object Store bucket that keeps committed artifacts (its stream is
    /// `OBJ_<bucket>`).
    pub fn artifacts_bucket(&self) -> String {
        self.stream("ARTIFACTS")
    }

    /// The artifacts bucket's stream, `OBJ_<bucket>` (the Object Store's naming).
    pub fn artifacts_stream(&self) -> String {
        format!("OBJ_{}", self.artifacts_bucket())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_derive_from_the_prefix() {
        let s = Subjects::new("t-1").unwrap();
        let org = uuid::Uuid::nil();
        assert_eq!(
            s.client(&org, "ci", ClientVerb::Request).unwrap(),
            "t-1.v1.org.00000000-0000-0000-0000-000000000000.client.ci.request"
        );
        assert_eq!(
            s.client_of("t-1.v1.org.o.client.c.cancel"),
            Some(ClientSubject {
                organization_id: "o",
                client_id: "c"
            })
        );
        assert_eq!(s.client_of("t-1.v1.org.o.event.scan.failed"), None);
        assert_eq!(s.event(EventKind::TaskReady), "t-1.v1.event.task.ready");
        let completed = s.tenant_event(&org, EventKind::ScanCompleted);
        assert_eq!(
            completed,
            "t-1.v1.org.00000000-0000-0000-0000-000000000000.event.scan.completed"
        );
        assert_eq!(s.event_kind_of(&completed), Some(EventKind::ScanCompleted));
        assert_eq!(
            s.tenant_event_of(&completed),
            Some(("00000000-0000-0000-0000-000000000000", "scan.completed"))
        );
        assert_eq!(s.tenant_event_of("t-1.v1.event.task.ready"), None);
        assert_eq!(s.tenant_event_of("t-1.v1.org.a.b.event.scan.failed"), None);
        assert_eq!(
            s.event_kind_of("t-1.v1.event.task.ready"),
            Some(EventKind::TaskReady)
        );
        assert_eq!(s.worker("w", WorkerVerb::Ack), "t-1.v1.worker.w.ack");
        assert_eq!(
            s.worker_wildcard(WorkerVerb::Result),
            "t-1.v1.worker.*.result"
        );
        assert_eq!(s.worker_id_of("t-1.v1.worker.abc.renew"), Some("abc"));
        assert_eq!(s.worker_id_of("other.v1.worker.abc.renew"), None);
        assert_eq!(s.results_stream(), "T_1_RESULTS");
        assert_eq!(s.upload("w", "u"), "t-1.v1.upload.w.u");
        assert_eq!(s.upload_of("t-1.v1.upload.w.u"), Some(("w", "u")));
        assert_eq!(s.upload_stored("w", "u"), "t-1.v1.uploaded.w.u");
        assert_eq!(s.upload_wildcard(), "t-1.v1.upload.*.*");
        assert_eq!(s.stored_uploads_wildcard(), "t-1.v1.uploaded.*.*");
        assert_eq!(s.uploads_stream(), "T_1_UPLOADS");
        assert_eq!(s.artifacts_bucket(), "T_1_ARTIFACTS");
    }

    #[test]
    fn span_names_come_from_templates_without_ids() {
        let subjects = Subjects::new("acme").unwrap();
        let organization = uuid::Uuid::new_v4();
        let worker = uuid::Uuid::new_v4().to_string();
        let cases = [
            (
                subjects
                    .client(&organization, "ci-1", ClientVerb::Submit)
                    .unwrap(),
                "{prefix}.v1.org.{organization_id}.client.{client_id}.submit",
            ),
            (
                subjects.worker(&worker, WorkerVerb::Acquire),
                "{prefix}.v1.worker.{worker_id}.acquire",
            ),
            (
                subjects.tenant_event(&organization, EventKind::ScanCompleted),
                "{prefix}.v1.org.{organization_id}.event.scan.completed",
            ),
            (
                subjects.event(EventKind::TaskReady),
                "{prefix}.v1.event.task.ready",
            ),
            (
                subjects.upload(&worker, "u1"),
                "{prefix}.v1.upload.{worker_id}.{upload_id}",
            ),
            (subjects.dispatch_ready(), "{prefix}.v1.dispatch.ready"),
            (
                "acme.v1.worker.w1.{forged}".to_owned(),
                "{prefix}.v1.worker.{worker_id}.{verb}",
            ),
            (
                "acme.v1.org.o.client.c.anything".to_owned(),
                "{prefix}.v1.org.{organization_id}.client.{client_id}.{verb}",
            ),
            ("acme.v1.a.b.c.d.e".to_owned(), "{prefix}.v1.{subject}"),
            (
                "$JS.API.STREAM.INFO.ACME_EVENTS".to_owned(),
                "$JS.API.{request}",
            ),
            ("_INBOX_acme.worker_x.abc".to_owned(), "{inbox}"),
        ];
        for (subject, template) in cases {
            assert_eq!(subjects.template_of(&subject), template, "{subject}");
        }
    }

    #[test]
    fn ids_that_are_not_one_token_cannot_become_subjects() {
        let s = Subjects::new("p").unwrap();
        for bad in ["", "a.b", "*", ">", "a b", "a\tb", &"x".repeat(65)] {
            assert!(
                s.client(&uuid::Uuid::nil(), bad, ClientVerb::Submit)
                    .is_err(),
                "{bad:?}"
            );
        }
        assert!(token("client_id", "ci-1_A").is_ok());
    }

    #[test]
    fn parsers_refuse_tokens_the_builders_would_not_build() {
        let s = Subjects::new("p").unwrap();
        assert_eq!(s.worker_id_of("p.v1.worker.{a}.result"), None);
        assert_eq!(s.worker_id_of("p.v1.worker..result"), None);
        assert_eq!(s.worker_id_of("p.v1.worker.a.result.x"), None);
        assert_eq!(s.client_of("p.v1.org.o.client.c:d.submit"), None);
        assert_eq!(s.client_of("p.v1.org.o.client.c.submit.x"), None);
        assert_eq!(s.upload_of("p.v1.upload.w.u.x"), None);
        assert_eq!(s.upload_of("p.v1.upload.w:x.u"), None);
        assert_eq!(s.upload_of("p.v1.uploaded.w.u"), None);
        assert_eq!(s.upload_of("p.v1.upload.w."), None);
    }

    #[test]
    fn rejects_prefixes_that_are_not_one_token() {
        for bad in ["", "a.b", "a*", "a>", "a b", &"x".repeat(33)] {
            assert!(Subjects::new(bad).is_err(), "{bad:?}");
        }
    }

    mod hostile {
        use super::*;
        use crate::testing::{cases, hostile_text, token_text, uuid_text};
        use proptest::prelude::*;

        /// Subjects made of this installation's words, other tokens and hostile text.
        fn subject() -> impl Strategy<Value = String> {
            let piece = prop_oneof![
                Just("p".to_owned()),
                Just("v1".to_owned()),
                Just("worker".to_owned()),
                Just("upload".to_owned()),
                Just("org".to_owned()),
                Just("client".to_owned()),
                Just("*".to_owned()),
                Just(">".to_owned()),
                token_text(),
                uuid_text(),
                hostile_text(),
            ];
            proptest::collection::vec(piece, 0..9).prop_map(|pieces| pieces.join("."))
        }

        fn is_one_token(text: &str) -> bool {
            token("t", text).is_ok()
        }

        proptest! {
            #![proptest_config(cases(512))]

            /// Whatever a subject holds, the parsers return only what the builders could
            /// have put there: one token each, never a wildcard or a separator.
            #[test]
            fn hostile_subject_parsers_return_only_tokens(subject in subject()) {
                let s = Subjects::new("p").unwrap();
                if let Some(worker_id) = s.worker_id_of(&subject) {
                    prop_assert!(is_one_token(worker_id), "{worker_id:?}");
                }
                if let Some(tokens) = s.client_of(&subject) {
                    prop_assert!(is_one_token(tokens.organization_id));
                    prop_assert!(is_one_token(tokens.client_id));
                }
                if let Some((worker_id, upload_id)) = s.upload_of(&subject) {
                    prop_assert!(is_one_token(worker_id), "{worker_id:?}");
                    prop_assert!(is_one_token(upload_id), "{upload_id:?}");
                }
                let _ = s.event_kind_of(&subject);
                if let Some((organization_id, _)) = s.tenant_event_of(&subject) {
                    prop_assert!(is_one_token(organization_id), "{organization_id:?}");
                }
            }

            /// Every id that becomes a subject token parses back to itself, and the subject
            /// has exactly the tokens its pattern says, none of them a wildcard.
            #[test]
            fn hostile_ids_round_trip_through_subjects(
                worker_id in token_text(),
                organization in any::<u128>(),
                client_id in prop_oneof![token_text(), hostile_text()],
                worker_verb in proptest::sample::select(WorkerVerb::ALL.to_vec()),
                client_verb in proptest::sample::select(ClientVerb::ALL.to_vec()),
            ) {
                let s = Subjects::new("p").unwrap();
                let worker = s.worker(&worker_id, worker_verb);
                prop_assert_eq!(s.worker_id_of(&worker), Some(worker_id.as_str()));
                prop_assert_eq!(worker.split('.').count(), 5);
                let organization = uuid::Uuid::from_u128(organization);
                match s.client(&organization, &client_id, client_verb) {
                    Ok(client) => {
                        prop_assert!(is_one_token(&client_id));
                        let tokens: Vec<&str> = client.split('.').collect();
                        prop_assert_eq!(tokens.len(), 7);
                        prop_assert!(tokens.iter().all(|t| is_one_token(t)), "{client:?}");
                        let parsed = s.client_of(&client).expect("a client subject");
                        prop_assert_eq!(parsed.organization_id, organization.to_string());
                        prop_assert_eq!(parsed.client_id, client_id.as_str());
                    }
                    Err(error) => {
                        prop_assert!(!is_one_token(&client_id));
                        prop_assert_eq!(error.value, client_id);
                    }
                }
            }
        }
    }
}
