//! W3C trace-context propagation across NATS headers. Every message of a goal carries the
//! `traceparent` of the goal's root span so that a goal can be followed across services; the
//! OpenTelemetry exporter that turns these into spans is wired separately.

use rand::Rng;

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

    /// A new span in the same trace.
    pub fn child(&self) -> Self {
        Self {
            trace_id: self.trace_id.clone(),
            span_id: format!("{:016x}", rand::rng().random::<u64>() | 1),
            sampled: self.sampled,
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
}

/// Reads the trace context from NATS headers.
pub fn extract(headers: Option<&async_nats::HeaderMap>) -> Option<TraceContext> {
    headers?.get(TRACEPARENT).and_then(|v| TraceContext::parse(v.as_str()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_children_share_the_trace() {
        let root = TraceContext::new_root();
        let parsed = TraceContext::parse(&root.to_header()).unwrap();
        assert_eq!(parsed, root);
        let child = root.child();
        assert_eq!(child.trace_id, root.trace_id);
        assert_ne!(child.span_id, root.span_id);
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
