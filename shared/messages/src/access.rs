//! Who may do what on the bus: every identity (service, operator, worker, client) and the
//! subjects it may publish and subscribe to, written once. The NATS server enforces these
//! lists (they are issued into each identity's credentials), so a credential confines its
//! holder whatever it sends; the services still check that a message's fields agree with its
//! subject's tokens (`validate`).
//!
//! The JetStream API is a set of subjects too (`$JS.API.…`): only the services may create or
//! change streams and consumers, a client may only create consumers filtered on its own
//! organizations' events, and a worker has no JetStream API at all (its results are plain
//! publishes that the results stream captures; their PubAcks come to its own inbox).

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

/// The JetStream API prefix.
const JS_API: &str = "$JS.API";

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
                    publish: [
                        WorkerVerb::Hello,
                        WorkerVerb::Acquire,
                        WorkerVerb::Renew,
                        WorkerVerb::Release,
                        WorkerVerb::Result,
                        WorkerVerb::Complete,
                        WorkerVerb::Fail,
                        WorkerVerb::Artifact,
                    ]
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
                let events = self.events_stream();
                let mut publish = Vec::new();
                for organization in organizations {
                    publish.push(format!(
                        "{prefix}.v1.org.{organization}.client.{client_id}.*"
                    ));
                    // Consumers of its own organization's events only: the server checks that
                    // the filter in the subject is the consumer's filter.
                    publish.push(format!(
                        "{JS_API}.CONSUMER.CREATE.{events}.*.{}",
                        self.tenant_events(organization)
                    ));
                }
                // Pulls and their state, from consumers whose (random) names it chose.
                publish.push(format!("{JS_API}.CONSUMER.MSG.NEXT.{events}.*"));
                publish.push(format!("{JS_API}.CONSUMER.INFO.{events}.*"));
                Permissions {
                    publish,
                    subscribe: vec![inbox],
                    responses: false,
                }
            }
        }
    }

    fn service_permissions(&self, service: Service, inbox: String) -> Permissions {
        // Every service provisions the streams at start-up and reports them in /readyz, and
        // publishes the events its transactions wrote (the outbox relay).
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
        let mut subscribe = vec![inbox];
        let mut responses = false;
        let consumer_of = |stream: String, publish: &mut Vec<String>| {
            publish.extend([
                format!("{JS_API}.CONSUMER.CREATE.{stream}.>"),
                format!("{JS_API}.CONSUMER.DURABLE.CREATE.{stream}.*"),
                format!("{JS_API}.CONSUMER.INFO.{stream}.*"),
                format!("{JS_API}.CONSUMER.MSG.NEXT.{stream}.*"),
                format!("$JS.ACK.{stream}.>"),
            ]);
        };
        match service {
            Service::Admission => {
                consumer_of(self.requests_stream(), &mut publish);
                subscribe.push(self.client_wildcard(ClientVerb::Submit));
                responses = true;
            }
            Service::Dispatch => {
                subscribe.extend(
                    [
                        WorkerVerb::Hello,
                        WorkerVerb::Acquire,
                        WorkerVerb::Renew,
                        WorkerVerb::Release,
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
                consumer_of(self.results_stream(), &mut publish);
                publish.push(self.worker_wildcard(WorkerVerb::Ack));
                subscribe.push(self.client_wildcard(ClientVerb::Findings));
                // Upload sessions: read a session's chunks back (an ordered consumer), keep
                // the verified file in the artifact store, purge what was sent.
                subscribe.push(self.worker_wildcard(WorkerVerb::Artifact));
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
                .any(|subject| subject.ends_with(".ack"))
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
    fn a_client_acts_only_for_its_organizations_and_reads_only_their_events() {
        let organization = Uuid::now_v7();
        let permissions = subjects().permissions(&Identity::Client {
            client_id: "ci".into(),
            organizations: vec![organization],
        });
        assert!(
            permissions
                .publish
                .contains(&format!("p.v1.org.{organization}.client.ci.*"))
        );
        assert!(permissions.publish.contains(&format!(
            "$JS.API.CONSUMER.CREATE.P_EVENTS.*.p.v1.org.{organization}.event.>"
        )));
        assert!(!permissions.publish.iter().any(|s| s.contains("STREAM")
            || s.contains("DELETE")
            || s.contains(".event.>") && !s.starts_with("$JS.API.CONSUMER.CREATE")));
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
