//! W3C trace-context propagation across NATS headers and gRPC metadata, so that one goal is one
//! trace across services: `SubmitGoal → plan → dispatch node → agent task → tool / LLM call →
//! result applied`.
//!
//! A service that handles a message makes a span, sets its parent with [`follow`] from the
//! message's `traceparent`, and publishes what it sends with [`propagate`], the context of the
//! span it is in. When traces are not exported (no `OTEL_EXPORTER_OTLP_ENDPOINT`), spans have no
//! ids; messages then carry the goal's root context instead, so a goal's messages still share
//! its trace id.

use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt as _, TraceFlags, TraceId, TraceState};
use rand::Rng;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// The header name defined by the W3C Trace Context specification.
pub const TRACEPARENT: &str = "traceparent";

/// A parsed `traceparent`: version 00, trace id, parent span id and flags.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceContext {
    pub trace_id: String,
    pub span_id: String,
    pub sampled: bool,
}

impl TraceContext {
    /// Starts a new trace.
    pub fn new_root() -> Self {
        let mut rng = rand::rng();
        Self {
            trace_id: format!("{:032x}", rng.random::<u128>() | 1),
            span_id: format!("{:016x}", rng.random::<u64>() | 1),
            sampled: true,
        }
    }

    /// Parses a `traceparent` header value; `None` when it is not a valid version-00 value.
    pub fn parse(value: &str) -> Option<Self> {
        let mut parts = value.trim().split('-');
        let (version, trace_id, span_id, flags) =
            (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
        let hex = |s: &str, len: usize| s.len() == len && s.chars().all(|c| c.is_ascii_hexdigit());
        if version != "00" || !hex(trace_id, 32) || !hex(span_id, 16) || !hex(flags, 2) {
            return None;
        }
        if trace_id.chars().all(|c| c == '0') || span_id.chars().all(|c| c == '0') {
            return None;
        }
        let flags = u8::from_str_radix(flags, 16).ok()?;
        Some(Self {
            trace_id: trace_id.to_ascii_lowercase(),
            span_id: span_id.to_ascii_lowercase(),
            sampled: flags & 1 == 1,
        })
    }

    pub fn to_header(&self) -> String {
        format!("00-{}-{}-{:02x}", self.trace_id, self.span_id, u8::from(self.sampled))
    }

    /// The context of `span` when spans are exported; `None` otherwise.
    pub fn of(span: &tracing::Span) -> Option<Self> {
        if span.is_none() {
            return None;
        }
        let context = span.context();
        let span_context = context.span().span_context().clone();
        span_context.is_valid().then(|| Self {
            trace_id: span_context.trace_id().to_string(),
            span_id: span_context.span_id().to_string(),
            sampled: span_context.is_sampled(),
        })
    }

    /// The context of the span this code runs in, when spans are exported.
    pub fn current() -> Option<Self> {
        Self::of(&tracing::Span::current())
    }

    fn to_otel(&self) -> Option<opentelemetry::Context> {
        let trace_id = TraceId::from_hex(&self.trace_id).ok()?;
        let span_id = SpanId::from_hex(&self.span_id).ok()?;
        let flags = if self.sampled { TraceFlags::SAMPLED } else { TraceFlags::default() };
        let remote = SpanContext::new(trace_id, span_id, flags, true, TraceState::default());
        Some(opentelemetry::Context::new().with_remote_span_context(remote))
    }
}

/// Makes `parent` the parent of `span`, which must not have been entered yet. Does nothing when
/// spans are not exported or there is no parent.
pub fn follow(span: &tracing::Span, parent: Option<&TraceContext>) {
    if let Some(context) = parent.and_then(TraceContext::to_otel) {
        let _ = span.set_parent(context);
    }
}

/// Adds a link from `span` to `other`'s span (work `span` does on behalf of several traces).
pub fn link(span: &tracing::Span, other: Option<&TraceContext>) {
    if let Some(context) = other.and_then(TraceContext::to_otel) {
        span.add_link(context.span().span_context().clone());
    }
}

/// The context to send on: the current span's when spans are exported, else `fallback` (the
/// goal's root context, or the context a message arrived with).
pub fn propagate(fallback: Option<&TraceContext>) -> Option<TraceContext> {
    TraceContext::current().or_else(|| fallback.cloned())
}

/// Reads the trace context from gRPC metadata (`traceparent`).
pub fn from_metadata(metadata: &tonic::metadata::MetadataMap) -> Option<TraceContext> {
    metadata.get(TRACEPARENT).and_then(|v| v.to_str().ok()).and_then(TraceContext::parse)
}

/// Reads the trace context from NATS headers.
pub fn extract(headers: Option<&async_nats::HeaderMap>) -> Option<TraceContext> {
    headers?.get(TRACEPARENT).and_then(|v| TraceContext::parse(v.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_falls_back_without_an_exporter() {
        let root = TraceContext::new_root();
        let parsed = TraceContext::parse(&root.to_header()).unwrap();
        assert_eq!(parsed, root);
        assert_eq!(root.to_header().len(), 55);
        // Without an exporter spans have no context: the goal's root context is sent instead.
        assert_eq!(propagate(Some(&root)), Some(root.clone()));
    }

    #[test]
    fn rejects_malformed_values() {
        for bad in [
            "",
            "01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
            "00-00000000000000000000000000000000-b7ad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-zzad6b7169203331-01",
            "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331",
        ] {
            assert!(TraceContext::parse(bad).is_none(), "{bad}");
        }
    }
}
