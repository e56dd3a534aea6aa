//! Telemetry set-up for every Hermes process: logs and, when configured, traces.
//!
//! - **Logs** are JSON lines when stderr is not a terminal (for log shippers) and compact text
//!   when it is. Each line carries the fields of the spans it happened in (`goal_id`, `node_id`,
//!   `task_id`, `agent`, ...) next to its own (`event`, `step`, ...), and the trace id when
//!   tracing is on. Every value goes through [`crate::redact`] first. `RUST_LOG` filters; the
//!   default is `info`.
//! - **Traces** are exported over OTLP/gRPC when `OTEL_EXPORTER_OTLP_ENDPOINT` (or
//!   `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`) is set, and are off otherwise. The standard `OTEL_*`
//!   variables apply (`OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`,
//!   `OTEL_BSP_*`, `OTEL_EXPORTER_OTLP_HEADERS`); `OTEL_SDK_DISABLED=true` or
//!   `OTEL_TRACES_EXPORTER=none` turn tracing off. Span attributes and events are redacted in
//!   the exporter, so nothing recorded on a span can leak a secret.

use std::io::IsTerminal;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry::{KeyValue, Value as OtelValue};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use serde_json::{Map, Value};
use tracing::field::{Field, Visit};
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::time::{FormatTime, SystemTime};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::layer::{Context, SubscriberExt as _};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer};

use crate::redact::{REDACTED, is_secret_key, redact_text};

/// Keeps the trace exporter alive; dropping it flushes the spans not yet sent.
#[must_use = "dropping the guard stops trace export"]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Whether spans are being exported.
    pub fn tracing(&self) -> bool {
        self.provider.is_some()
    }
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        if let Some(provider) = self.provider.take() {
            let _ = provider.force_flush();
            let _ = provider.shutdown();
        }
    }
}

/// Installs logging and, when the environment asks for it, OTLP trace export. `service` is the
/// default `service.name` (`OTEL_SERVICE_NAME` wins). Call once, inside the Tokio runtime (the
/// gRPC exporter needs it); later calls change nothing and return an inert guard.
pub fn init(service: &str) -> Telemetry {
    install(service, tracing_enabled())
}

/// Installs logging without trace export (tools and tests); see [`init`].
pub fn init_logging() {
    drop(install("hermes", false));
}

fn install(service: &str, export: bool) -> Telemetry {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,async_nats=warn,h2=warn,tower=warn,opentelemetry=warn"));
    let lines = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .event_format(Lines { json: !std::io::stderr().is_terminal() });
    let provider = export.then(|| tracer_provider(service)).and_then(|built| match built {
        Ok(provider) => Some(provider),
        Err(e) => {
            eprintln!("hermes: tracing is off: cannot build the OTLP exporter: {e}");
            None
        }
    });
    let otel = provider.as_ref().map(|p| {
        tracing_opentelemetry::layer()
            .with_tracer(p.tracer("hermes"))
            .with_threads(false)
            .with_tracked_inactivity(false)
    });
    let installed =
        tracing_subscriber::registry().with(filter).with(SpanFields).with(lines).with(otel).try_init();
    match (installed, provider) {
        (Ok(()), Some(provider)) => Telemetry { provider: Some(provider) },
        (_, provider) => {
            // Already installed (tests call this freely): this provider is not used.
            if let Some(provider) = provider {
                let _ = provider.shutdown();
            }
            Telemetry { provider: None }
        }
    }
}

fn env_is(name: &str, value: &str) -> bool {
    std::env::var(name).is_ok_and(|v| v.trim().eq_ignore_ascii_case(value))
}

fn tracing_enabled() -> bool {
    let endpoint = ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
        .iter()
        .any(|v| std::env::var(v).is_ok_and(|s| !s.trim().is_empty()));
    endpoint && !env_is("OTEL_SDK_DISABLED", "true") && !env_is("OTEL_TRACES_EXPORTER", "none")
}

fn tracer_provider(service: &str) -> crate::Result<SdkTracerProvider> {
    let protocol = std::env::var("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
        .or_else(|_| std::env::var("OTEL_EXPORTER_OTLP_PROTOCOL"))
        .unwrap_or_default();
    if !protocol.is_empty() && protocol != "grpc" {
        return Err(crate::Error::InvalidArgument {
            field: "OTEL_EXPORTER_OTLP_PROTOCOL".into(),
            reason: format!("`{protocol}`: only `grpc` is built in"),
        });
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_tonic()
        .build()
        .map_err(|e| crate::Error::FailedPrecondition(format!("cannot build the OTLP span exporter: {e}")))?;
    let mut resource = opentelemetry_sdk::Resource::builder();
    if std::env::var("OTEL_SERVICE_NAME").is_err() {
        resource = resource.with_service_name(service.to_owned());
    }
    Ok(SdkTracerProvider::builder()
        .with_batch_exporter(Redacting(exporter))
        .with_resource(resource.build())
        .build())
}

/// Redacts every string attribute of every span and span event before export: log events
/// recorded inside spans become span events, and their fields may hold anything.
#[derive(Debug)]
struct Redacting<E>(E);

fn redact_attributes(attributes: &mut [KeyValue]) {
    for kv in attributes {
        let secret = is_secret_key(kv.key.as_str());
        let replacement = match &kv.value {
            OtelValue::String(_) if secret => Some(REDACTED.to_owned()),
            OtelValue::String(s) => match redact_text(s.as_str()) {
                std::borrow::Cow::Owned(r) => Some(r),
                std::borrow::Cow::Borrowed(_) => None,
            },
            OtelValue::Array(_) if secret => Some(REDACTED.to_owned()),
            _ => None,
        };
        if let Some(r) = replacement {
            kv.value = OtelValue::from(r);
        }
    }
}

impl<E: SpanExporter> SpanExporter for Redacting<E> {
    fn export(&self, mut batch: Vec<SpanData>) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        for span in &mut batch {
            redact_attributes(&mut span.attributes);
            for event in &mut span.events.events {
                redact_attributes(&mut event.attributes);
                if let std::borrow::Cow::Owned(name) = redact_text(&event.name) {
                    event.name = name.into();
                }
            }
            if let opentelemetry::trace::Status::Error { description } = &mut span.status
                && let std::borrow::Cow::Owned(d) = redact_text(description)
            {
                *description = d.into();
            }
        }
        self.0.export(batch)
    }

    fn shutdown_with_timeout(&self, timeout: std::time::Duration) -> OTelSdkResult {
        self.0.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.0.force_flush()
    }

    fn set_resource(&mut self, resource: &opentelemetry_sdk::Resource) {
        self.0.set_resource(resource);
    }
}

/// The fields of a span, kept so that every log line inside it can carry them.
#[derive(Default)]
struct StoredFields(Map<String, Value>);

/// Records span fields into [`StoredFields`]. Dotted fields (`gen_ai.usage.input_tokens`,
/// `hermes.tool.arguments`, `otel.name`) are span attributes for the trace, not log context.
struct SpanFields;

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for SpanFields {
    fn on_new_span(
        &self,
        attrs: &tracing::span::Attributes<'_>,
        id: &tracing::span::Id,
        ctx: Context<'_, S>,
    ) {
        let Some(span) = ctx.span(id) else { return };
        let mut fields = StoredFields::default();
        attrs.record(&mut Collect(&mut fields.0));
        fields.0.retain(|name, _| !name.contains('.'));
        span.extensions_mut().insert(fields);
    }

    fn on_record(&self, id: &tracing::span::Id, values: &tracing::span::Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else { return };
        let mut extensions = span.extensions_mut();
        if let Some(fields) = extensions.get_mut::<StoredFields>() {
            values.record(&mut Collect(&mut fields.0));
            fields.0.retain(|name, _| !name.contains('.'));
        }
    }
}

/// Collects fields as JSON values, redacting secrets; `otel.*` fields are for the exporter.
struct Collect<'a>(&'a mut Map<String, Value>);

impl Collect<'_> {
    fn put(&mut self, field: &Field, value: Value) {
        let name = field.name();
        if name.starts_with("otel.") {
            return;
        }
        let value = match value {
            Value::String(_) if is_secret_key(name) => Value::String(REDACTED.into()),
            Value::String(s) => match redact_text(&s) {
                std::borrow::Cow::Owned(r) => Value::String(r),
                std::borrow::Cow::Borrowed(_) => Value::String(s),
            },
            other => other,
        };
        self.0.insert(name.to_owned(), value);
    }
}

impl Visit for Collect<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.put(field, Value::String(format!("{value:?}")));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::String(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::from(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::from(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::from(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::from(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::String(value.to_string()));
    }
}

/// One log line: timestamp, level, target, the fields of the enclosing spans (outermost first,
/// inner ones win) and the event's own fields, all redacted.
struct Lines {
    json: bool,
}

impl<S, N> FormatEvent<S, N> for Lines
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        let mut fields = Map::new();
        let mut span_name = None;
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                if let Some(stored) = span.extensions().get::<StoredFields>() {
                    fields.extend(stored.0.iter().map(|(k, v)| (k.clone(), v.clone())));
                }
                span_name = Some(span.name());
            }
        }
        event.record(&mut Collect(&mut fields));
        let message = fields.remove("message").unwrap_or(Value::String(String::new()));
        let mut time = String::new();
        let _ = SystemTime.format_time(&mut Writer::new(&mut time));
        let meta = event.metadata();
        let trace_id = current_trace_id();
        if self.json {
            let mut line = Map::new();
            line.insert("timestamp".into(), Value::String(time));
            line.insert("level".into(), Value::String(meta.level().to_string()));
            line.insert("target".into(), Value::String(meta.target().to_owned()));
            if let Some(name) = span_name {
                line.insert("span".into(), Value::String(name.to_owned()));
            }
            if let Some(trace_id) = trace_id {
                line.insert("trace_id".into(), Value::String(trace_id));
            }
            line.extend(fields);
            line.insert("message".into(), message);
            writeln!(writer, "{}", Value::Object(line))
        } else {
            let message = match message {
                Value::String(s) => s,
                other => other.to_string(),
            };
            write!(writer, "{time} {:>5} {}: {message}", meta.level(), meta.target())?;
            for (k, v) in &fields {
                match v {
                    Value::String(s) => write!(writer, " {k}={s}")?,
                    other => write!(writer, " {k}={other}")?,
                }
            }
            if let Some(trace_id) = trace_id {
                write!(writer, " trace_id={trace_id}")?;
            }
            writeln!(writer)
        }
    }
}

/// The trace id of the current span when spans are exported.
fn current_trace_id() -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let current = tracing::Span::current();
    if current.is_none() {
        return None;
    }
    let context = current.context();
    let span_context = context.span().span_context().clone();
    span_context.is_valid().then(|| span_context.trace_id().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buffer(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buffer {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn capture(json: bool, log: impl FnOnce()) -> String {
        let buffer = Buffer::default();
        let writer = buffer.clone();
        let lines =
            tracing_subscriber::fmt::layer().with_writer(move || writer.clone()).event_format(Lines { json });
        let subscriber = tracing_subscriber::registry().with(SpanFields).with(lines);
        tracing::subscriber::with_default(subscriber, log);
        String::from_utf8(buffer.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn json_lines_carry_span_fields_and_redact_secrets() {
        let text = capture(true, || {
            let span = tracing::info_span!("agent_task", goal_id = "g-1", node_id = "n", agent = "a-1");
            let _entered = span.enter();
            tracing::info!(
                event = "tool_called",
                step = 2u32,
                api_key = "k-secret-1",
                note = "password=hunter2",
                input_tokens = 7u64,
                "calling with Bearer abc.def"
            );
        });
        let line: Value = serde_json::from_str(text.trim()).expect(&text);
        assert_eq!(line["goal_id"], "g-1");
        assert_eq!(line["node_id"], "n");
        assert_eq!(line["agent"], "a-1");
        assert_eq!(line["event"], "tool_called");
        assert_eq!(line["step"], 2);
        assert_eq!(line["input_tokens"], 7);
        assert_eq!(line["level"], "INFO");
        assert_eq!(line["span"], "agent_task");
        assert_eq!(line["api_key"], REDACTED);
        for secret in ["k-secret-1", "hunter2", "abc.def"] {
            assert!(!text.contains(secret), "{secret} leaked: {text}");
        }
    }

    #[test]
    fn text_lines_are_redacted_too() {
        let text = capture(false, || tracing::warn!(authorization = "Basic dXNlcjpwYXNz", "token: t-42"));
        assert!(text.contains("WARN") && text.contains(REDACTED), "{text}");
        assert!(!text.contains("dXNlcjpwYXNz") && !text.contains("t-42"), "{text}");
    }
}
