//! Recording what happens inside a task (docs/evaluation.md): each exchange with the agent's
//! model (`agent.run` steps, `text.summarize`) and each tool call of an agent loop is reported to
//! a dispatcher as an `AgentReport`, checked against the attempt's result token, and written by
//! it to the goal's records. `hermes replay` serves them again: the exchanges in place of a model,
//! and with `--tools recorded` the tool outputs in place of tools with side effects. Recording
//! is best effort: a report that fails is logged, and the task goes on.

use std::time::Instant;

use hermes_llm::{ChatModel, ChatRequest, ChatResponse, LlmError};
use hermes_proto::agent_report::Kind;
use serde_json::Value;

use crate::tool::{TaskScope, ToolContext, ToolError};

/// Most characters of a call's arguments kept for a person to read.
const ARGUMENTS_TEXT_LIMIT: usize = 4096;

/// Asks `model` and, within a task, records the exchange under `purpose` (`agent`, `summarize`).
pub(crate) async fn chat(
    model: &dyn ChatModel,
    request: ChatRequest,
    ctx: &ToolContext,
    purpose: &str,
) -> Result<ChatResponse, LlmError> {
    let Some(scope) = &ctx.task else { return model.chat(request).await };
    let started = Instant::now();
    let response = model.chat(request.clone()).await?;
    let mut exchange = hermes_llm::record::exchange(purpose, &request, &response, started.elapsed());
    // Unique within the task, so the dispatcher's deduplication never merges two exchanges.
    exchange.request_id = format!("{purpose}:{}:{}", &exchange.request_digest[..16], exchange.at_unix_ms);
    send(scope, Kind::ModelExchange(exchange), "model exchange").await;
    Ok(response)
}

/// Records one tool call of an agent loop: its arguments (by digest, and redacted for reading)
/// and its outcome, a large output by artifact reference.
pub(crate) async fn tool_call(
    scope: &TaskScope,
    index: u32,
    tool: &str,
    args: &Value,
    outcome: Result<&Value, &ToolError>,
    started: Instant,
) {
    let mut call = hermes_proto::ToolExchange {
        index,
        tool: tool.to_owned(),
        arguments_digest: arguments_digest(args),
        arguments_json: hermes_core::text::clip(
            &hermes_core::redact::redact(args).to_string(),
            ARGUMENTS_TEXT_LIMIT,
        ),
        ok: outcome.is_ok(),
        elapsed_ms: started.elapsed().as_millis() as u64,
        at_unix_ms: hermes_core::now_unix_ms(),
        ..Default::default()
    };
    let artifacts = scope.bus.task_artifacts(&scope.memory_token);
    match outcome {
        Ok(output) => match artifacts.offload_json(output.to_string(), &scope.goal_id, &scope.tenant).await {
            // Over the inline limit the output is an artifact, and the record holds its stub.
            Ok((json, reference)) => {
                call.output_json = json;
                call.output_ref = reference.unwrap_or_default();
            }
            Err(e) => {
                tracing::warn!(tool, error = %e, "cannot store a large tool output for the record");
                return;
            }
        },
        Err(e) => call.error = Some(e.to_proto()),
    }
    send(scope, Kind::ToolExchange(call), "tool call").await;
}

/// The digest a recorded call is matched by: the sha256 of the arguments' JSON (serde_json
/// writes object keys in order, so equal values give equal text).
pub fn arguments_digest(args: &Value) -> String {
    hermes_llm::record::sha256(&args.to_string())
}

async fn send(scope: &TaskScope, kind: Kind, what: &str) {
    if let Err(e) = crate::approval::report(scope, kind).await {
        tracing::warn!(goal_id = %scope.goal_id, node_id = %scope.node_id, error = %e.message, "cannot record a {what}");
    }
}
