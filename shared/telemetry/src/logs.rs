//! What a log line carries besides its event: the OpenTelemetry ids of the span it was logged
//! in, so that a line leads to its trace, and an error's whole cause chain.

use std::error::Error;
use std::fmt::{self, Write as _};

use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// Displays `error` and then each of its sources, `a: b: c`, where `%error` shows `a` alone.
///
/// A cause whose text already appears on the line is not repeated: most errors here embed
/// their source's message in their own. For an `anyhow::Error`, pass `&*error`.
///
/// ```
/// #[derive(Debug, thiserror::Error)]
/// #[error("cannot publish")]
/// struct PublishError(#[source] std::io::Error);
///
/// let error = PublishError(std::io::Error::other("connection refused"));
/// assert_eq!(telemetry::chain(&error).to_string(), "cannot publish: connection refused");
/// tracing::warn!(error = %telemetry::chain(&error), "outbox publish failed");
/// ```
pub fn chain<E: Error + ?Sized>(error: &E) -> ErrorChain<'_, E> {
    ErrorChain { error }
}

/// See [`chain`].
#[derive(Debug, Clone, Copy)]
pub struct ErrorChain<'a, E: ?Sized> {
    error: &'a E,
}

/// Causes followed at most; a longer chain ends with `…` (a source cycle would loop forever).
pub const CHAIN_LINKS_MAX: usize = 16;

impl<E: Error + ?Sized> fmt::Display for ErrorChain<'_, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut line = self.error.to_string();
        let mut cause = self.error.source();
        let mut links = 0;
        while let Some(error) = cause {
            if links == CHAIN_LINKS_MAX {
                line.push_str(": …");
                break;
            }
            let message = error.to_string();
            if !line.contains(&message) {
                write!(line, ": {message}")?;
            }
            cause = error.source();
            links += 1;
        }
        f.write_str(&line)
    }
}

/// How the wrapped format lays out a line, which decides where the ids go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Layout {
    /// One JSON object per line: `trace_id` and `span_id` become top-level fields.
    Json,
    /// Human-readable text: ` trace_id=…` ends the line (the line names its spans already).
    Text,
}

/// An event format adding the W3C ids of the OpenTelemetry span an event is logged in to what
/// `inner` writes; lines logged outside every span are written as `inner` writes them.
#[derive(Debug)]
pub(crate) struct WithTraceIds<F> {
    inner: F,
    layout: Layout,
}

impl<F> WithTraceIds<F> {
    pub(crate) fn new(inner: F, layout: Layout) -> Self {
        Self { inner, layout }
    }
}

impl<S, N, F> FormatEvent<S, N> for WithTraceIds<F>
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
    F: FormatEvent<S, N>,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace_id, span_id)) = span_ids(event) else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        // Both formats end a line with a newline, JSON's object with `}`: the ids go before
        // them. A line of another shape is written unchanged rather than broken.
        match self.layout {
            Layout::Json => match line.strip_suffix("}\n") {
                Some(open) => {
                    let separator = if open.ends_with('{') { "" } else { "," };
                    writeln!(
                        writer,
                        r#"{open}{separator}"trace_id":"{trace_id}","span_id":"{span_id}"}}"#
                    )
                }
                None => writer.write_str(&line),
            },
            Layout::Text => match line.strip_suffix('\n') {
                Some(text) => writeln!(writer, "{text} trace_id={trace_id}"),
                None => writer.write_str(&line),
            },
        }
    }
}

/// The ids of the OpenTelemetry span `event` is logged in, `None` outside every span.
///
/// `tracing-opentelemetry` attaches a span's OpenTelemetry context while the span is entered
/// (its context activation, on by default), so the current context is that of the innermost
/// entered span it records: the event's own span, or its nearest ancestor at a level the
/// OpenTelemetry layer records. This holds whatever the log level: a span the log filter hides
/// still gives its ids. An event with an explicit parent (or none) gets no ids rather than
/// those of the entered span, which may be another.
fn span_ids(event: &Event<'_>) -> Option<(TraceId, SpanId)> {
    if !event.is_contextual() {
        return None;
    }
    let context = opentelemetry::Context::current();
    let span = context.span();
    let span_context = span.span_context();
    span_context
        .is_valid()
        .then(|| (span_context.trace_id(), span_context.span_id()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Link {
        message: &'static str,
        source: Option<Box<Link>>,
    }

    impl fmt::Display for Link {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(self.message)
        }
    }

    impl Error for Link {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            self.source
                .as_deref()
                .map(|source| source as &(dyn Error + 'static))
        }
    }

    fn links(messages: &[&'static str]) -> Link {
        let (first, rest) = messages.split_first().expect("at least one message");
        Link {
            message: first,
            source: (!rest.is_empty()).then(|| Box::new(links(rest))),
        }
    }

    #[test]
    fn chain_shows_every_cause_in_order() {
        let error = links(&["failed to relay", "database error", "connection refused"]);
        assert_eq!(
            chain(&error).to_string(),
            "failed to relay: database error: connection refused"
        );
        assert_eq!(chain(&links(&["alone"])).to_string(), "alone");
    }

    #[test]
    fn chain_does_not_repeat_a_cause_already_in_the_message() {
        let error = links(&[
            "database error: error communicating with database: connection refused",
            "error communicating with database: connection refused",
            "connection refused",
        ]);
        assert_eq!(
            chain(&error).to_string(),
            "database error: error communicating with database: connection refused"
        );
        let error = links(&[
            "cannot connect to PostgreSQL: timed out; start PostgreSQL",
            "timed out",
            "no route to host",
        ]);
        assert_eq!(
            chain(&error).to_string(),
            "cannot connect to PostgreSQL: timed out; start PostgreSQL: no route to host"
        );
    }

    #[test]
    fn chain_of_an_anyhow_like_trait_object_and_a_long_chain_ends() {
        let error: Box<dyn Error + Send + Sync> = Box::new(links(&["outer", "inner"]));
        assert_eq!(chain(&*error).to_string(), "outer: inner");
        let messages: Vec<&'static str> = (0..CHAIN_LINKS_MAX + 5)
            .map(|index| &*Box::leak(format!("cause {index}").into_boxed_str()))
            .collect();
        let shown = chain(&links(&messages)).to_string();
        assert!(
            shown.ends_with(&format!("cause {CHAIN_LINKS_MAX}: …")),
            "{shown}"
        );
    }
}
