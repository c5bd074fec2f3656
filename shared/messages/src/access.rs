//! Who may do what on the bus: every identity (service, operator, worker, client) and the
//! subjects it may publish and subscribe to, written once. The NATS server enforces these
//! lists (they are issued into each identity's credentials), so a credential confines its
//! holder whatever it sends; the services still check that a message's fields agree with its
//! subject's tokens (`validate`).
//!
//! **Accounts are the tenant boundary.** The services, the operator and the streams live in
//! palisade's own NATS account; every worker and every client connects in an account of its
//! own, which reaches palisade's only through imports of exactly its subjects
//! ([`Subjects::imports`]) of what palisade's account exports ([`Subjects::exports`]). An
//! answer to a request that crossed an account boundary goes back through the server's
//! response mapping (the service sees a `_R_.…` reply subject, never the requester's), so a
//! requester can receive an answer but never aim it: whatever reply subject it names, the
//! answer lands in its own account, where nothing but its own imports lead anywhere.
//!
//! The JetStream API is a set of subjects too (`$JS.API.…`): only the services (and the
//! operator) hold any of it, in palisade's account. Workers' and clients' accounts have no
//! JetStream at all: their results and requests are publishes the streams capture across the
//! import (their PubAcks come back the same way), and a client reads its organizations'
//! events through the `events` verb.

use uuid::Uuid;

use crate::subjects::{ClientVerb, Subjects, WorkerVerb, token};

/// One of palisade's five services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    Admission,
    Dispatch,
    Ingestion,
    Enrichment,
    Reaper,
}

impl Service {
    pub const ALL: [Service; 5] = [
        Service::Admission,
        Service::Dispatch,
        Service::Ingestion,
        Service::Enrichment,
        Service::Reaper,
    ];

    pub const fn name(self) -> &'static str {
        match self {
            Service::Admission => "admission",
            Service::Dispatch => "dispatch",
            Service::Ingestion => "ingestion",
            Service::Enrichment => "enrichment",
            Service::Reaper => "reaper",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|service| service.name() == name)
    }
}

/// Who is on the bus.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Identity {
    Service(Service),
    /// The `palisade` command run by an operator: submits and cancels for any organization
    /// and manages streams; no worker subjects.
    Operator,
    Worker {
        worker_id: Uuid,
    },
    /// A service that submits scans, bound to the organizations it may act for.
    Client {
        client_id: String,
        organizations: Vec<Uuid>,
    },
}

impl Identity {
    /// One subject token that names the identity (its inbox prefix ends with it).
    pub fn token(&self) -> String {
        match self {
            Identity::Service(service) => format!("service-{}", service.name()),
            Identity::Operator => "operator".to_owned(),
            Identity::Worker { worker_id } => format!("worker-{worker_id}"),
            Identity::Client { client_id, .. } => format!("client-{client_id}"),
        }
    }
}

/// What one identity may do: subjects it may publish to and subscribe to (NATS wildcards
/// allowed), and whether it may answer the requests it receives (`allow_responses`: one
/// reply per request to whatever inbox the requester gave, and nothing else there).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Permissions {
    pub publish: Vec<String>,
    pub subscribe: Vec<String>,
    pub responses: bool,
}

/// What crosses between palisade's account and another: `services` are subjects the other
/// account publishes on (requests, and JetStream publishes the streams capture), whose answers
/// and PubAcks come back through the server's response mapping; `streams` are subjects
/// palisade's account publishes on that the other account hears. NATS wildcards allowed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Crossing {
    pub services: Vec<String>,
    pub streams: Vec<String>,
}

/// The JetStream API prefix.
const JS_API: &str = "$JS.API";

/// How a server-made response subject starts: the answer to a request that crossed an account
/// boundary goes there, and the server maps it back into the requester's own account.
pub const RESPONSE_MAPPING_PREFIX: &str = "_R_.";

impl Subjects {
    /// What `identity` may publish and subscribe to in this installation.
    ///
    /// Panics if a client id is not a subject token: `palisade client add` refuses such ids
    /// before credentials are issued.
    pub fn permissions(&self, identity: &Identity) -> Permissions {
        let prefix = self.prefix();
        let inbox = format!("{}.>", self.inbox_prefix(identity));
        match identity {
            Identity::Service(service) => self.service_permissions(*service, inbox),
            Identity::Operator => {
                let mut publish = vec![
                    format!("{prefix}.v1.org.*.client.*.*"),
                    format!("{JS_API}.>"),
                ];
                publish.extend(self.event_publish());
                Permissions {
                    publish,
                    subscribe: vec![inbox],
                    responses: false,
                }
            }
            Identity::Worker { worker_id } => {
                let id = worker_id.to_string();
                Permissions {
                    publish: WorkerVerb::SENT
                        .into_iter()
                        .map(|verb| self.worker(&id, verb))
                        .chain([self.worker_uploads(&id)])
                        .collect(),
                    subscribe: vec![
                        inbox,
                        self.worker(&id, WorkerVerb::Ack),
                        self.dispatch_ready(),
                    ],
                    responses: false,
                }
            }
            Identity::Client {
                client_id,
                organizations,
            } => {
                let client_id = token("client_id", client_id).expect("client ids are tokens");
                Permissions {
                    publish: organizations
                        .iter()
                        .map(|organization| {
                            format!("{prefix}.v1.org.{organization}.client.{client_id}.*")
                        })
                        .collect(),
                    subscribe: vec![inbox],
                    responses: false,
                }
            }
        }
    }

    /// What the user of a worker's enrollment token may do: send `enroll` on the worker's own
    /// subject and read the answer at its inbox, nothing else. It connects in the worker's own
    /// account, so its answers cross back there whatever reply subject it names.
    pub fn enrollment_permissions(&self, worker_id: Uuid) -> Permissions {
        let identity = Identity::Worker { worker_id };
        Permissions {
            publish: vec![self.worker(&worker_id.to_string(), WorkerVerb::Enroll)],
            subscribe: vec![format!("{}.>", self.inbox_prefix(&identity))],
            responses: false,
        }
    }

    /// Whether a service may answer a request received on `subject` at `reply`: only where
    /// the answer reaches the requester and nobody else. That is a server-made response
    /// subject (`_R_.…`: the request crossed an account boundary, and the answer can only go
    /// back into the requester's own account), or, inside palisade's account (an open server,
    /// the operator's command), the inbox prefix of the identity the subject names, or the
    /// operator's. Anything else, a JetStream API subject, another tenant's events or request
    /// subject, another worker's acks, is never answered, whatever the credentials let the
    /// requester aim at.
    pub fn may_answer(&self, subject: &str, reply: &str) -> bool {
        let plain = !reply.is_empty()
            && reply
                .split('.')
                .all(|token| !token.is_empty() && token != "*" && token != ">");
        if !plain {
            return false;
        }
        if reply.starts_with(RESPONSE_MAPPING_PREFIX) {
            return true;
        }
        let under = |identity: &Identity| {
            reply
                .strip_prefix(&self.inbox_prefix(identity))
                .is_some_and(|rest| rest.starts_with('.'))
        };
        let requester = if let Some(client_id) = self.client_token_of(subject) {
            Some(Identity::Client {
                client_id: client_id.to_owned(),
                organizations: Vec::new(),
            })
        } else {
            self.worker_id_of(subject)
                .or_else(|| self.upload_of(subject).map(|(worker_id, _)| worker_id))
                .and_then(|worker_id| worker_id.parse().ok())
                .map(|worker_id| Identity::Worker { worker_id })
        };
        under(&Identity::Operator) || requester.as_ref().is_some_and(under)
    }

    /// What palisade's account offers other accounts: every worker and client subject, each
    /// account importing only its own ([`Subjects::imports`]). The subjects the uploads stream
    /// captures (`<prefix>.v1.uploaded.*.*`) are not among them: a worker's chunks reach the
    /// stream only through ingestion, which serves `<prefix>.v1.upload.*.*`.
    pub fn exports(&self) -> Crossing {
        let mut services: Vec<String> = ClientVerb::ALL
            .into_iter()
            .map(|verb| self.client_wildcard(verb))
            .collect();
        services.extend(
            WorkerVerb::SENT
                .into_iter()
                .map(|verb| self.worker_wildcard(verb)),
        );
        services.push(self.upload_wildcard());
        Crossing {
            services,
            streams: vec![self.worker_wildcard(WorkerVerb::Ack), self.dispatch_ready()],
        }
    }

    /// What the account of `identity` imports from palisade's: exactly its own subjects.
    /// `None` for the services and the operator, which live in palisade's account.
    ///
    /// Panics if a client id is not a subject token, as [`Subjects::permissions`] does.
    pub fn imports(&self, identity: &Identity) -> Option<Crossing> {
        match identity {
            Identity::Service(_) | Identity::Operator => None,
            Identity::Worker { worker_id } => {
                let id = worker_id.to_string();
                let mut services: Vec<String> = WorkerVerb::SENT
                    .into_iter()
                    .map(|verb| self.worker(&id, verb))
                    .collect();
                services.push(self.worker_uploads(&id));
                Some(Crossing {
                    services,
                    streams: vec![self.worker(&id, WorkerVerb::Ack), self.dispatch_ready()],
                })
            }
            Identity::Client {
                client_id,
                organizations,
            } => Some(Crossing {
                services: organizations
                    .iter()
                    .flat_map(|organization| {
                        ClientVerb::ALL.into_iter().map(move |verb| {
                            self.client(organization, client_id, verb)
                                .expect("client ids are tokens")
                        })
                    })
                    .collect(),
                streams: Vec::new(),
            }),
        }
    }

    fn service_permissions(&self, service: Service, inbox: String) -> Permissions {
        let mut publish = self.every_service_publish();
        let mut subscribe = vec![inbox];
        let mut responses = false;
        match service {
            Service::Admission => {
                publish.extend(consumer_api(&self.requests_stream()));
                subscribe.push(self.client_wildcard(ClientVerb::Submit));
                subscribe.push(self.client_wildcard(ClientVerb::Schedules));
                responses = true;
            }
            Service::Dispatch => {
                subscribe.extend(
                    [
                        WorkerVerb::Hello,
                        WorkerVerb::Acquire,
                        WorkerVerb::Renew,
                        WorkerVerb::Release,
                        WorkerVerb::Enroll,
                        WorkerVerb::Credentials,
                    ]
                    .map(|verb| self.worker_wildcard(verb)),
                );
                subscribe.extend([
                    self.client_wildcard(ClientVerb::Cancel),
                    self.event(crate::EventKind::TaskReady),
                    self.dispatch_wakeup(),
                ]);
                publish.push(self.dispatch_ready());
                responses = true;
            }
            Service::Ingestion => {
                publish.extend(consumer_api(&self.results_stream()));
                publish.push(self.worker_wildcard(WorkerVerb::Ack));
                subscribe.push(self.client_wildcard(ClientVerb::Findings));
                subscribe.push(self.client_wildcard(ClientVerb::Scans));
                // A tenant's events, read for it (`events`): a batched direct get, the
                // leader's message get by subject, and each organization's events as they are
                // published, to wake the requests waiting for them.
                subscribe.push(self.client_wildcard(ClientVerb::Events));
                subscribe.push(self.tenant_events_wildcard());
                publish.push(format!("{JS_API}.DIRECT.GET.{}", self.events_stream()));
                publish.push(format!("{JS_API}.STREAM.MSG.GET.{}", self.events_stream()));
                // Upload sessions: receive every worker's chunks (queue group `ingestion`)
                // and store those of an open session on the uploads stream's own subjects;
                // read a session's chunks back (an ordered consumer), keep the verified file
                // in the artifact store, purge what was sent.
                subscribe.push(self.worker_wildcard(WorkerVerb::Artifact));
                subscribe.push(self.upload_wildcard());
                publish.push(self.stored_uploads_wildcard());
                publish.extend(self.artifact_store_access());
                responses = true;
            }
            Service::Enrichment => {
                subscribe.push(self.client_wildcard(ClientVerb::Enrich));
                responses = true;
            }
            Service::Reaper => {
                publish.push(self.dispatch_wakeup());
                // Removes what expired and failed upload sessions left: chunks and objects.
                publish.extend(self.artifact_store_access());
            }
        }
        Permissions {
            publish,
            subscribe,
            responses,
        }
    }

    /// What every service publishes: the streams' administration (each provisions the
    /// streams at start-up and reports them in /readyz) and the events its transactions wrote
    /// (the outbox relay).
    fn every_service_publish(&self) -> Vec<String> {
        let mut publish: Vec<String> = [
            self.requests_stream(),
            self.events_stream(),
            self.results_stream(),
            self.uploads_stream(),
            self.artifacts_stream(),
        ]
        .into_iter()
        .flat_map(|stream| {
            ["INFO", "CREATE", "UPDATE"].map(|verb| format!("{JS_API}.STREAM.{verb}.{stream}"))
        })
        .collect();
        publish.push(format!("{JS_API}.INFO"));
        publish.extend(self.event_publish());
        publish
    }

    /// Reading, writing and removing artifacts and upload chunks: the object store's own
    /// subjects (`$O.<bucket>.…`), its stream's message and purge APIs, the uploads stream's
    /// purge, and consumers that read either back.
    fn artifact_store_access(&self) -> Vec<String> {
        let objects = self.artifacts_stream();
        let uploads = self.uploads_stream();
        let mut access = vec![format!("$O.{}.>", self.artifacts_bucket())];
        for stream in [objects, uploads] {
            access.extend([
                format!("{JS_API}.STREAM.PURGE.{stream}"),
                format!("{JS_API}.STREAM.MSG.GET.{stream}"),
                format!("{JS_API}.DIRECT.GET.{stream}"),
                format!("{JS_API}.DIRECT.GET.{stream}.>"),
                format!("{JS_API}.CONSUMER.CREATE.{stream}"),
                format!("{JS_API}.CONSUMER.CREATE.{stream}.>"),
                format!("{JS_API}.CONSUMER.DELETE.{stream}.>"),
                format!("{JS_API}.CONSUMER.MSG.NEXT.{stream}.*"),
                format!("{JS_API}.CONSUMER.INFO.{stream}.*"),
            ]);
        }
        access
    }

    fn event_publish(&self) -> [String; 2] {
        self.events_wildcards()
    }
}

/// What a service's durable pull consumer on `stream` publishes: creating and reading the
/// consumer, pulling its messages and acknowledging them.
fn consumer_api(stream: &str) -> [String; 5] {
    [
        format!("{JS_API}.CONSUMER.CREATE.{stream}.>"),
        format!("{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.*"),
        format!("{JS_API}.CONSUMER.INFO.{stream}.*"),
        format!("{JS_API}.CONSUMER.MSG.NEXT.{stream}.*"),
        format!("$JS.ACK.{stream}.>"),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn subjects() -> Subjects {
        Subjects::new("p").unwrap()
    }

    #[test]
    fn a_worker_publishes_only_on_its_own_subjects_and_reads_only_its_own_inbox() {
        let worker_id = Uuid::now_v7();
        let permissions = subjects().permissions(&Identity::Worker { worker_id });
        assert!(permissions.publish.iter().all(|subject| {
            subject.starts_with(&format!("p.v1.worker.{worker_id}."))
                || *subject == format!("p.v1.upload.{worker_id}.*")
        }));
        assert!(
            !permissions
                .publish
                .iter()
                .any(|subject| subject.ends_with(".ack") || subject.contains(".uploaded."))
        );
        assert!(
            permissions
                .subscribe
                .contains(&format!("_INBOX_p.worker-{worker_id}.>"))
        );
        assert!(!permissions.subscribe.iter().any(|s| s.contains("_INBOX.")));
        assert!(!permissions.responses);
    }

    #[test]
    fn a_client_acts_only_for_its_organizations_and_holds_no_jetstream_right() {
        let organization = Uuid::now_v7();
        let permissions = subjects().permissions(&Identity::Client {
            client_id: "ci".into(),
            organizations: vec![organization],
        });
        assert_eq!(
            permissions.publish,
            [format!("p.v1.org.{organization}.client.ci.*")]
        );
        assert_eq!(permissions.subscribe, ["_INBOX_p.client-ci.>"]);
    }

    #[test]
    fn an_identity_account_imports_exactly_its_own_subjects_of_what_palisade_exports() {
        let s = subjects();
        let exports = s.exports();
        let exported = |subject: &str, list: &[String]| {
            list.iter().any(|export| {
                let export: Vec<&str> = export.split('.').collect();
                let subject: Vec<&str> = subject.split('.').collect();
                export.len() == subject.len()
                    && export
                        .iter()
                        .zip(&subject)
                        .all(|(e, t)| *e == "*" || e == t)
            })
        };
        let worker_id = Uuid::now_v7();
        let organization = Uuid::now_v7();
        for identity in [
            Identity::Worker { worker_id },
            Identity::Client {
                client_id: "ci".into(),
                organizations: vec![organization],
            },
        ] {
            let imports = s.imports(&identity).expect("its own account");
            for subject in &imports.services {
                assert!(exported(subject, &exports.services), "{subject}");
                assert!(
                    subject.contains(&worker_id.to_string())
                        || subject.contains(&format!("org.{organization}.client.ci.")),
                    "{subject} is not its own"
                );
            }
            for subject in &imports.streams {
                assert!(exported(subject, &exports.streams), "{subject}");
            }
        }
        assert!(s.imports(&Identity::Operator).is_none());
        assert!(
            !exports
                .services
                .iter()
                .any(|subject| subject.starts_with('$')
                    || subject.ends_with(".ack")
                    || subject.contains(".event."))
        );
        // The uploads stream's own subjects cross no account boundary: a worker's chunks reach
        // the stream only through ingestion.
        assert!(exported(
            &s.upload(&worker_id.to_string(), "u"),
            &exports.services
        ));
        assert!(!exported(
            &s.upload_stored(&worker_id.to_string(), "u"),
            &exports.services
        ));
        assert!(!exported(
            &s.upload_stored(&worker_id.to_string(), "u"),
            &exports.streams
        ));
        for subject in exports.services.iter().chain(&exports.streams) {
            assert!(!subject.contains(".v1.uploaded."), "{subject} is exported");
        }
    }

    #[test]
    fn only_ingestion_stores_upload_chunks_and_it_serves_the_workers_upload_subjects() {
        let s = subjects();
        let stored = s.stored_uploads_wildcard();
        for service in Service::ALL {
            let permissions = s.permissions(&Identity::Service(service));
            assert_eq!(
                permissions.publish.contains(&stored),
                service == Service::Ingestion,
                "{service:?}"
            );
            assert!(
                !permissions
                    .publish
                    .iter()
                    .any(|subject| *subject == s.upload_wildcard()),
                "{service:?} publishes on the workers' upload subjects"
            );
            assert_eq!(
                permissions.subscribe.contains(&s.upload_wildcard()),
                service == Service::Ingestion,
                "{service:?}"
            );
        }
        let worker_id = Uuid::now_v7();
        let worker = s.permissions(&Identity::Worker { worker_id });
        assert!(
            worker
                .publish
                .contains(&s.worker_uploads(&worker_id.to_string()))
        );
        let imports = s.imports(&Identity::Worker { worker_id }).unwrap();
        assert!(
            imports
                .services
                .iter()
                .chain(&imports.streams)
                .all(|subject| !subject.contains(".v1.uploaded."))
        );
        // The operator's command publishes no chunk either.
        assert!(
            !s.permissions(&Identity::Operator)
                .publish
                .iter()
                .any(|subject| subject.contains(".uploaded.") || subject.contains(".upload."))
        );
    }

    #[test]
    fn a_service_answers_only_the_requesters_own_inbox_or_a_server_made_response_subject() {
        let s = subjects();
        let worker_id = Uuid::now_v7();
        let acquire = s.worker(&worker_id.to_string(), WorkerVerb::Acquire);
        let submit = format!("p.v1.org.{}.client.ci.submit", Uuid::now_v7());
        let chunk = s.upload(&worker_id.to_string(), &Uuid::new_v4().to_string());
        let long = "c".repeat(65);
        let long_submit = format!("p.v1.org.{}.client.{long}.submit", Uuid::now_v7());
        let odd_submit = format!("p.v1.org.{}.client.c:d.submit", Uuid::now_v7());
        for (subject, reply) in [
            (&acquire, format!("_INBOX_p.worker-{worker_id}.abc.1")),
            (&chunk, format!("_INBOX_p.worker-{worker_id}.abc.1")),
            (&chunk, "_R_.Ab12Cd.x9".to_owned()),
            (&acquire, "_R_.Ab12Cd.x9".to_owned()),
            (&acquire, "_INBOX_p.operator.abc.1".to_owned()),
            (&submit, "_INBOX_p.client-ci.abc.1".to_owned()),
            // Issue 48, item 9: a client id no credential can hold (65 characters, a `:`) is
            // refused `invalid_field`, and the refusal reaches the inbox that id names.
            (&long_submit, format!("_INBOX_p.client-{long}.abc.1")),
            (&odd_submit, "_INBOX_p.client-c:d.abc.1".to_owned()),
        ] {
            assert!(s.may_answer(subject, &reply), "{subject} -> {reply}");
        }
        let other = Uuid::now_v7();
        for (subject, reply) in [
            (&acquire, "$JS.API.STREAM.PURGE.P_REQUESTS".to_owned()),
            (
                &acquire,
                "$JS.API.CONSUMER.DELETE.P_RESULTS.ingestion".to_owned(),
            ),
            (&acquire, format!("_INBOX_p.worker-{other}.abc.1")),
            (&chunk, format!("_INBOX_p.worker-{other}.abc.1")),
            (&chunk, "$JS.API.STREAM.PURGE.P_UPLOADS".to_owned()),
            (&acquire, format!("p.v1.worker.{other}.ack")),
            (&acquire, format!("_INBOX_p.worker-{worker_id}")),
            (&acquire, format!("_INBOX_p.worker-{worker_id}x.abc")),
            (&acquire, format!("_INBOX_p.worker-{worker_id}.>")),
            (&acquire, "_INBOX.abc.1".to_owned()),
            (&submit, "_INBOX_p.client-cix.abc".to_owned()),
            (&long_submit, "_INBOX_p.client-ci.abc.1".to_owned()),
            (&long_submit, format!("_INBOX_p.client-{long}x.abc")),
            (&odd_submit, "_INBOX_p.client-c.abc".to_owned()),
            (&submit, format!("p.v1.org.{other}.event.scan.completed")),
            (&submit, format!("p.v1.org.{other}.client.ci.request")),
            (&submit, String::new()),
        ] {
            assert!(!s.may_answer(subject, &reply), "{subject} -> {reply}");
        }
    }

    #[test]
    fn only_services_answer_requests() {
        let s = subjects();
        assert!(
            s.permissions(&Identity::Service(Service::Dispatch))
                .responses
        );
        assert!(
            s.permissions(&Identity::Service(Service::Admission))
                .responses
        );
        assert!(!s.permissions(&Identity::Operator).responses);
    }
}
