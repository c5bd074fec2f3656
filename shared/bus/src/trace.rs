//! W3C trace context over NATS headers: injected on every publish and request, extracted on
//! every consume, so one scan is one trace across services.

use async_nats::HeaderMap;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

struct HeaderInjector<'a>(&'a mut HeaderMap);

impl Injector for HeaderInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        self.0.insert(key, value.as_str());
    }
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).map(|value| value.as_str())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.iter().map(|(name, _)| name.as_ref()).collect()
    }
}

fn propagator() -> TraceContextPropagator {
    TraceContextPropagator::new()
}

/// Writes the current span's context as `traceparent`/`tracestate` into `headers`; does
/// nothing when there is no valid context (tracing export off).
pub fn inject_current(headers: &mut HeaderMap) {
    let context = tracing::Span::current().context();
    if !context.span().span_context().is_valid() {
        return;
    }
    propagator().inject_context(&context, &mut HeaderInjector(headers));
}

/// Makes `span` a child of the context carried in `headers`, if any.
pub fn set_parent_from(span: &tracing::Span, headers: Option<&HeaderMap>) {
    let Some(headers) = headers else { return };
    let context = propagator().extract(&HeaderExtractor(headers));
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// The context carried in string headers (outbox rows store them this way).
pub fn headers_of_current() -> std::collections::BTreeMap<String, String> {
    let mut headers = HeaderMap::new();
    inject_current(&mut headers);
    headers
        .iter()
        .filter_map(|(name, values)| {
            values
                .first()
                .map(|value| (name.to_string(), value.as_str().to_owned()))
        })
        .collect()
}
