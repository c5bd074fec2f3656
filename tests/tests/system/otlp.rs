//! An in-process OTLP/gRPC collector: the spans palisade exports, for tests that read them;
//! and the services as processes of their own exporting to it, as production runs them.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use tests::chaos::processes::Process;
use tests::{Component, TestSystem};

/// The `test-service` binary (one service as a process of its own), built by cargo with the
/// tests.
const SERVICE: &str = env!("CARGO_BIN_EXE_test-service");

/// One exported span with its resource's `service.name`.
#[derive(Debug, Clone)]
pub struct Exported {
    pub service_name: String,
    pub span: Span,
}

impl Exported {
    pub fn attribute(&self, key: &str) -> Option<String> {
        attribute(&self.span.attributes, key)
    }
}

pub fn attribute(attributes: &[KeyValue], key: &str) -> Option<String> {
    let value = attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .as_ref()?
        .value
        .as_ref()?;
    Some(match value {
        any_value::Value::StringValue(value) => value.clone(),
        any_value::Value::IntValue(value) => value.to_string(),
        any_value::Value::BoolValue(value) => value.to_string(),
        other => format!("{other:?}"),
    })
}

/// An OTLP/gRPC trace receiver keeping every span it is sent.
#[derive(Debug, Clone, Default)]
pub struct Collector {
    spans: Arc<Mutex<Vec<Exported>>>,
}

impl Collector {
    pub fn spans(&self) -> Vec<Exported> {
        self.spans.lock().unwrap().clone()
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut spans = self.spans.lock().unwrap();
        for resource_spans in request.into_inner().resource_spans {
            let service_name = resource_spans
                .resource
                .as_ref()
                .and_then(|resource| attribute(&resource.attributes, "service.name"))
                .unwrap_or_default();
            for scope_spans in resource_spans.scope_spans {
                for span in scope_spans.spans {
                    spans.push(Exported {
                        service_name: service_name.clone(),
                        span,
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse {
            partial_success: None,
        }))
    }
}

pub async fn start_collector() -> (Collector, std::net::SocketAddr) {
    let collector = Collector::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let service = TraceServiceServer::new(collector.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(service)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    (collector, addr)
}

/// The `service.name` a palisade service's process exports under (`telemetry::init` in its
/// binary; `test-service` and `test-worker` use the same): `palisade-<service>`.
pub fn service_name(service: &str) -> String {
    format!("palisade-{service}")
}

/// The five services of `system`, each as a process of its own exporting its spans to
/// `endpoint` under its own `service.name` ([`service_name`]), as production runs them; the
/// system's in-process services are stopped first.
pub struct ServiceProcesses {
    processes: Vec<Process>,
    _logs: tempfile::TempDir,
}

impl ServiceProcesses {
    /// Starts them with `settings` added to the environment, and waits until each is ready.
    pub async fn start(system: &TestSystem, endpoint: &str, settings: &[(&str, &str)]) -> Self {
        for component in [
            Component::Admission,
            Component::Dispatch,
            Component::Ingestion,
        ] {
            system.stop(component).await;
        }
        let logs = tempfile::tempdir().expect("a log directory");
        let mut processes = Vec::new();
        for service in messages::Service::ALL {
            let mut env: Vec<(String, String)> = [
                ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint),
                ("PALISADE_SUBJECT_PREFIX", system.subjects.prefix()),
                ("DATABASE_URL", system.settings.common.database.url.as_str()),
                ("PALISADE_DB_MAX_CONNECTIONS", "4"),
                ("RUST_LOG", "warn"),
            ]
            .iter()
            .chain(settings)
            .map(|(key, value)| ((*key).to_owned(), (*value).to_owned()))
            .collect();
            env.extend(
                system
                    .nats
                    .child_env(&messages::Identity::Service(service))
                    .await
                    .into_iter()
                    .map(|(key, value)| (key.to_owned(), value)),
            );
            let mut process = Process::new(
                service.name(),
                std::path::Path::new(SERVICE),
                &[service.name()],
                env,
                logs.path(),
            )
            .with_http_port(tests::servers::free_port());
            process.start();
            processes.push(process);
        }
        for process in &processes {
            let url = format!("http://{}/readyz", process.http_addr.expect("an address"));
            system
                .wait_for(&format!("{} ready", process.name), || async {
                    let answer = palisade::probe::probe(&url).await.ok()?;
                    (answer.status == 200).then_some(())
                })
                .await;
        }
        Self {
            processes,
            _logs: logs,
        }
    }

    /// The process of `service`.
    pub fn process(&mut self, service: messages::Service) -> &mut Process {
        self.processes
            .iter_mut()
            .find(|process| process.name == service.name())
            .expect("every service runs")
    }

    /// Stops each as an orchestrator would (SIGTERM): it exports what it still holds.
    pub async fn stop(mut self) {
        for process in &mut self.processes {
            process.stop(Duration::from_secs(20)).await;
        }
    }
}
