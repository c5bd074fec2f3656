//! W3C trace context over NATS headers: injected on every publish and request, extracted on
//! every consume, so one scan is one trace across services.

use async_nats::HeaderMap;
use messages::Subjects;
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
/// nothing when there is no valid context (a process without `telemetry::init`).
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

/// Writes `span`'s context as `traceparent`/`tracestate` into `headers` (nothing when the
/// span has no OpenTelemetry context: a process without `telemetry::init`).
pub fn inject_span(span: &tracing::Span, headers: &mut HeaderMap) {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return;
    }
    propagator().inject_context(&context, &mut HeaderInjector(headers));
}

/// The W3C `traceparent` of `span`, `None` when it has no OpenTelemetry context. Stored on the scan
/// row so that steps triggered by other messages can join the scan's trace.
pub fn traceparent_of(span: &tracing::Span) -> Option<String> {
    let mut headers = HeaderMap::new();
    inject_span(span, &mut headers);
    headers
        .get("traceparent")
        .map(|value| value.as_str().to_owned())
}

/// `traceparent` (W3C: `00-<trace id>-<span id>-<flags>`) naming the span `span_id` of the
/// same trace instead: the context of a child of that parent whose id is known
/// ([`telemetry::with_span_id`]). `None` when `traceparent` is not one.
pub fn traceparent_with_span(traceparent: &str, span_id: [u8; 8]) -> Option<String> {
    let parts: Vec<&str> = traceparent.split('-').collect();
    let hex =
        |text: &str, len: usize| text.len() == len && text.bytes().all(|b| b.is_ascii_hexdigit());
    match parts[..] {
        [version, trace_id, parent, flags]
            if hex(version, 2) && hex(trace_id, 32) && hex(parent, 16) && hex(flags, 2) =>
        {
            let span: String = span_id.iter().map(|byte| format!("{byte:02x}")).collect();
            Some(format!("{version}-{trace_id}-{span}-{flags}"))
        }
        _ => None,
    }
}

/// The W3C trace id of `span` (32 hex digits), `None` when it has no OpenTelemetry context: what
/// a person pastes into the tracing UI.
pub fn trace_id_of(span: &tracing::Span) -> Option<String> {
    let context = span.context();
    let span_context = context.span().span_context().clone();
    span_context
        .is_valid()
        .then(|| span_context.trace_id().to_string())
}

/// Makes `span` a child of the context in a stored `traceparent` (ignored when empty or
/// malformed).
pub fn set_parent_from_traceparent(span: &tracing::Span, traceparent: &str) {
    if traceparent.is_empty() {
        return;
    }
    let mut headers = HeaderMap::new();
    headers.insert("traceparent", traceparent);
    set_parent_from(span, Some(&headers));
}

/// Links `span` to `other` (a cause that is not its parent), before `span` is first entered.
pub fn link_to(span: &tracing::Span, other: &tracing::Span) {
    let context = other.context();
    let span_context = context.span().span_context().clone();
    if span_context.is_valid() {
        span.add_link(span_context);
    }
}

/// A producer span for one message to `subject` (OpenTelemetry messaging conventions). Its
/// name is the subject's template (`send {prefix}.v1.worker.{worker_id}.acquire`: names of
/// low cardinality); the subject itself is an attribute.
pub fn send_span(
    subjects: &Subjects,
    subject: &str,
    msg_id: Option<&str>,
    kind: &'static str,
) -> tracing::Span {
    let template = subjects.template_of(subject);
    tracing::info_span!(
        "send",
        otel.name = %format!("send {template}"),
        otel.kind = kind,
        messaging.system = "nats",
        messaging.operation.type = "send",
        messaging.destination.name = %subject,
        messaging.destination.template = %template,
        messaging.message.id = msg_id,
    )
}

/// A consumer span for one received message, a child of the context in its headers, named
/// from the subject's template as [`send_span`] is.
pub fn process_span(
    subjects: &Subjects,
    subject: &str,
    msg_id: Option<&str>,
    service: &str,
    kind: &'static str,
    headers: Option<&HeaderMap>,
) -> tracing::Span {
    let template = subjects.template_of(subject);
    let span = tracing::info_span!(
        parent: None,
        "process",
        otel.name = %format!("process {template}"),
        otel.kind = kind,
        messaging.system = "nats",
        messaging.operation.type = "process",
        messaging.destination.name = %subject,
        messaging.destination.template = %template,
        messaging.consumer.group.name = %service,
        messaging.message.id = msg_id,
        palisade.service = %service,
        palisade.scan_id = tracing::field::Empty,
        palisade.task_id = tracing::field::Empty,
    );
    set_parent_from(&span, headers);
    span
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_traceparent_names_another_span_of_its_trace() {
        let parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            traceparent_with_span(parent, [0x80, 1, 2, 3, 4, 5, 6, 0xff]).as_deref(),
            Some("00-4bf92f3577b34da6a3ce929d0e0e4736-80010203040506ff-01")
        );
        for bad in ["", "00-4bf9-00f067aa0ba902b7-01", "garbage", "00-x-y-z-w"] {
            assert_eq!(traceparent_with_span(bad, [1; 8]), None, "{bad:?}");
        }
    }
}
