//! An in-process OTLP/gRPC collector: the spans palisade exports, for tests that read them.

use std::sync::{Arc, Mutex};

use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::{KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;

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
