//! Telemetry of model calls, shared by every provider: one span per call with the OpenTelemetry
//! GenAI attributes (`gen_ai.provider.name`, `gen_ai.request.model`, `gen_ai.usage.*`,
//! `gen_ai.response.finish_reasons`), and the `hermes_llm_*` metrics. Prompts and answers are
//! not recorded.

use std::future::Future;
use std::time::Instant;

use hermes_core::metrics;
use tracing::Instrument as _;
use tracing::field::Empty;

use crate::{ChatResponse, LlmError};

/// Runs one model call inside its span and records its outcome.
pub(crate) async fn observed<F>(provider: &str, model: &str, call: F) -> Result<ChatResponse, LlmError>
where
    F: Future<Output = Result<ChatResponse, LlmError>>,
{
    let span = tracing::info_span!(
        "llm_call",
        otel.name = %format_args!("chat {model}"),
        otel.kind = "client",
        otel.status_code = Empty,
        gen_ai.operation.name = "chat",
        gen_ai.provider.name = provider,
        gen_ai.request.model = model,
        gen_ai.response.model = Empty,
        gen_ai.usage.input_tokens = Empty,
        gen_ai.usage.output_tokens = Empty,
        gen_ai.response.finish_reasons = Empty,
        error.type = Empty,
    );
    let started = Instant::now();
    let result = call.instrument(span.clone()).await;
    let m = metrics::global();
    let outcome = match &result {
        Ok(response) => {
            span.record("gen_ai.usage.input_tokens", response.usage.input_tokens);
            span.record("gen_ai.usage.output_tokens", response.usage.output_tokens);
            span.record("gen_ai.response.finish_reasons", response.finish_reason.as_str());
            if !response.model.is_empty() {
                span.record("gen_ai.response.model", response.model.as_str());
            }
            for (direction, count) in
                [("input", response.usage.input_tokens), ("output", response.usage.output_tokens)]
            {
                let labels =
                    metrics::labels(&[("provider", provider), ("model", model), ("direction", direction)]);
                m.llm_tokens.get_or_create(&labels).inc_by(count);
            }
            "ok"
        }
        Err(e) => {
            span.record("otel.status_code", "ERROR");
            span.record("error.type", e.code().as_str());
            e.code().as_str()
        }
    };
    let labels = metrics::labels(&[("provider", provider), ("model", model), ("outcome", outcome)]);
    m.llm_calls.get_or_create(&labels).inc();
    let labels = metrics::labels(&[("provider", provider), ("model", model)]);
    m.llm_duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    result
}
