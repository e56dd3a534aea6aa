//! Agent nodes: the `agent.run` task type runs an LLM tool loop over the agent's tools. The model
//! only chooses the next action; deterministic code validates and runs every call, with the same
//! schema checks and timeouts as tool nodes, and feeds structured errors back to the model.
//!
//! The loop is a small state machine: PLANNING (ask the model) → TOOL_CALLING (read its calls,
//! through function calling or the ReAct text fallback) → TOOL_RUNNING → OBSERVING (append the
//! results) → back to PLANNING, until FINISHED (an answer) or FAILED (`BUDGET_EXCEEDED` after the
//! step or token budget, `NO_PROGRESS` after three identical calls with identical output,
//! `LLM_PARSE_ERROR` when the model's answer cannot be used).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hermes_core::ErrorCode;
use hermes_llm::react::{ReactStep, parse_react};
use hermes_llm::repair::repair_json;
use hermes_llm::{ChatModel, ChatRequest, Message, Role, ToolCall, ToolDef, Usage};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};
use tracing::info;

use crate::tool::{Tool, ToolContext, ToolError, ToolRegistry, parse_args, schema_of};

/// Steps when the node does not say.
pub const DEFAULT_MAX_STEPS: u32 = 8;
/// Tokens when the node does not say.
pub const DEFAULT_MAX_TOKENS: u64 = 50_000;
/// Identical calls with identical output that count as no progress.
const NO_PROGRESS_REPEATS: usize = 3;
/// Tool output longer than this reaches the model as a summary.
const MAX_OBSERVATION_CHARS: usize = 2000;

/// The model an agent's `agent.run` uses.
#[derive(Clone)]
pub struct AgentModel(pub Arc<dyn ChatModel>);

impl std::fmt::Debug for AgentModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AgentModel({}/{})", self.0.provider(), self.0.model())
    }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// What to do, in plain language.
    instruction: String,
    /// Tools the loop may use; empty means every tool of the agent.
    #[serde(default)]
    tools: Vec<String>,
    /// Most model turns (default 8).
    #[serde(default)]
    #[schemars(range(min = 1, max = 50))]
    max_steps: Option<u32>,
    /// Most tokens over all model turns (default 50000).
    #[serde(default)]
    max_tokens: Option<u64>,
}

/// The `agent.run` tool.
pub struct AgentRun {
    model: AgentModel,
    tools: ToolRegistry,
}

impl AgentRun {
    /// `tools` are the tools the loop may call (never `agent.run` itself).
    pub fn new(model: AgentModel, tools: ToolRegistry) -> Self {
        Self { model, tools }
    }
}

impl Tool for AgentRun {
    fn name(&self) -> &'static str {
        "agent.run"
    }

    fn description(&self) -> &'static str {
        "Runs an LLM agent that follows an instruction using the agent's tools, step by step; returns {answer, steps}."
    }

    fn params_schema(&self) -> Value {
        schema_of::<Args>()
    }

    fn timeout(&self) -> Duration {
        Duration::from_secs(180)
    }

    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args(args)?;
            let budget = Budget {
                max_steps: args.max_steps.unwrap_or(DEFAULT_MAX_STEPS),
                max_tokens: args.max_tokens.unwrap_or(DEFAULT_MAX_TOKENS),
            };
            run_loop(self.model.0.as_ref(), &self.tools, ctx, &args.instruction, &args.tools, budget).await
        })
    }
}

/// Limits of one loop.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub max_steps: u32,
    pub max_tokens: u64,
}

/// Function names may not contain `.`; `table.aggregate` is offered as `table__aggregate`.
fn function_name(tool: &str) -> String {
    tool.replace('.', "__")
}

fn error(code: ErrorCode, message: impl Into<String>) -> ToolError {
    ToolError { code, message: message.into() }
}

/// Runs the loop and returns `{answer, steps, tokens}`.
pub async fn run_loop(
    model: &dyn ChatModel,
    registry: &ToolRegistry,
    ctx: &ToolContext,
    instruction: &str,
    subset: &[String],
    budget: Budget,
) -> Result<Value, ToolError> {
    let specs: Vec<_> = registry
        .specs()
        .into_iter()
        .filter(|s| s.name != "agent.run" && (subset.is_empty() || subset.contains(&s.name)))
        .collect();
    if let Some(unknown) = subset.iter().find(|t| !specs.iter().any(|s| &s.name == *t)) {
        return Err(ToolError::invalid_argument(format!("this agent has no tool `{unknown}`")));
    }
    let by_function: HashMap<String, String> =
        specs.iter().map(|s| (function_name(&s.name), s.name.clone())).collect();
    let tools: Vec<ToolDef> = specs
        .iter()
        .map(|s| ToolDef {
            name: function_name(&s.name),
            description: s.description.clone(),
            parameters: serde_json::from_str(&s.params_schema_json).unwrap_or(json!({"type": "object"})),
        })
        .collect();
    let system = format!(
        "You are a Hermes agent. Task: {instruction}\n\
         Use the tools to get facts; never invent results. Call one tool at a time when a result feeds the next.\n\
         When a tool returns an error, fix the arguments it names and call again.\n\
         When you have the answer, reply with the answer only.\n\
         If you cannot call functions, reply with lines `Action: <tool name>` and `Action Input: <JSON>`, or `Final Answer: <answer>`.\n\
         Tools: {}",
        specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
    );
    let mut messages = vec![Message::system(system), Message::user(instruction.to_owned())];
    let mut usage = Usage::default();
    let mut steps: Vec<Value> = Vec::new();
    let mut history: Vec<(String, String, String)> = Vec::new();
    for step in 1..=budget.max_steps {
        // PLANNING
        let response = model
            .chat(ChatRequest {
                messages: messages.clone(),
                tools: tools.clone(),
                temperature: Some(0.2),
                ..Default::default()
            })
            .await
            .map_err(|e| error(e.code(), e.to_string()))?;
        usage += response.usage;
        if usage.input_tokens + usage.output_tokens > budget.max_tokens {
            return Err(error(
                ErrorCode::BudgetExceeded,
                format!(
                    "used {} tokens, over the budget of {}",
                    usage.input_tokens + usage.output_tokens,
                    budget.max_tokens
                ),
            ));
        }
        // TOOL_CALLING: function calls first, then the ReAct text protocol, else an answer.
        let content = response.content.clone().unwrap_or_default();
        let mut calls = response.tool_calls.clone();
        let mut react = false;
        if calls.is_empty() {
            match parse_react(&content) {
                Ok(ReactStep::Action { tool, input, .. }) => {
                    react = true;
                    calls.push(ToolCall {
                        id: format!("react-{step}"),
                        name: function_name(&tool),
                        arguments: input.to_string(),
                    });
                }
                Ok(ReactStep::Final { answer, .. }) => return Ok(finished(answer, steps, usage)),
                Err(_) if !content.trim().is_empty() => {
                    return Ok(finished(content.trim().to_owned(), steps, usage));
                }
                Err(_) => {
                    return Err(error(
                        ErrorCode::LlmParseError,
                        "the model answered with neither a tool call nor text",
                    ));
                }
            }
        }
        let mut assistant = Message::assistant(if react { content.clone() } else { String::new() });
        if !react {
            assistant.tool_calls = calls.clone();
        }
        messages.push(assistant);
        for call in calls {
            // TOOL_RUNNING
            let started = std::time::Instant::now();
            let tool = by_function.get(&call.name).cloned().unwrap_or_else(|| call.name.replace("__", "."));
            let outcome = match repair_json(&call.arguments) {
                Err(e) => Err(ToolError::invalid_argument(format!("the arguments are not JSON: {e}"))),
                Ok(repaired) => {
                    let mut args = repaired.value;
                    if let (Some(map), Some(spec)) =
                        (args.as_object_mut(), specs.iter().find(|s| s.name == tool))
                    {
                        let schema = serde_json::from_str(&spec.params_schema_json).unwrap_or(Value::Null);
                        hermes_llm::params::apply_aliases(map, &schema, &HashMap::new());
                    }
                    if by_function.contains_key(&call.name) || specs.iter().any(|s| s.name == tool) {
                        info!(event = "tool_called", tool = %tool, step, "agent tool call");
                        registry.call(&tool, args.clone(), ctx).await.map(|out| (args, out))
                    } else {
                        Err(ToolError::invalid_argument(format!("there is no tool `{}`", call.name)))
                    }
                }
            };
            // OBSERVING
            let (observation, record) = match &outcome {
                Ok((args, out)) => {
                    (observe(out), json!({"tool": tool, "arguments": args, "ok": true, "output": out}))
                }
                Err(e) => (
                    format!("error: {}: {}", e.code, e.message),
                    json!({"tool": tool, "arguments": call.arguments, "ok": false, "error": format!("{}: {}", e.code, e.message)}),
                ),
            };
            info!(event = "tool_result_received", tool = %tool, step, ok = outcome.is_ok(), "agent tool result");
            if let Some(scope) = &ctx.task {
                let arguments = match &outcome {
                    Ok((args, _)) => args.clone(),
                    Err(_) => {
                        serde_json::from_str(&call.arguments).unwrap_or(Value::String(call.arguments.clone()))
                    }
                };
                publish_tool_called(
                    scope,
                    step,
                    steps.len() as u32,
                    &tool,
                    &arguments,
                    outcome.as_ref().err(),
                    started,
                )
                .await;
            }
            steps.push(record);
            history.push((tool.clone(), call.arguments.clone(), observation.clone()));
            if history.len() >= NO_PROGRESS_REPEATS
                && history[history.len() - NO_PROGRESS_REPEATS..].windows(2).all(|w| w[0] == w[1])
            {
                return Err(error(
                    ErrorCode::NoProgress,
                    format!(
                        "`{tool}` was called {NO_PROGRESS_REPEATS} times with the same arguments and the same result"
                    ),
                ));
            }
            messages.push(if react {
                Message::user(format!("Observation: {observation}"))
            } else {
                Message {
                    role: Role::Tool,
                    content: observation,
                    tool_calls: Vec::new(),
                    tool_call_id: Some(call.id.clone()),
                }
            });
        }
    }
    Err(error(ErrorCode::BudgetExceeded, format!("no answer within {} steps", budget.max_steps)))
}

/// Announces one tool call on the goal's event stream, so `hermes watch` and the events show
/// each step of an agent node. Best effort: the call's outcome does not depend on it.
async fn publish_tool_called(
    scope: &crate::tool::TaskScope,
    step: u32,
    index: u32,
    tool: &str,
    arguments: &Value,
    error: Option<&ToolError>,
    started: std::time::Instant,
) {
    let arguments: String = hermes_core::redact::redact(arguments).to_string().chars().take(500).collect();
    let event = hermes_proto::Event {
        goal_id: scope.goal_id.clone(),
        at_unix_ms: hermes_core::now_unix_ms(),
        kind: Some(hermes_proto::event::Kind::ToolCalled(hermes_proto::ToolCalled {
            node_id: scope.node_id.clone(),
            attempt: scope.attempt,
            step,
            index,
            tool: tool.to_owned(),
            arguments_json: arguments,
            ok: error.is_none(),
            error_code: error.map(|e| e.code.as_str().to_owned()).unwrap_or_default(),
            elapsed_ms: started.elapsed().as_millis() as u64,
        })),
    };
    let msg_id = format!("{}:tool:{}:{}:{step}:{index}", scope.goal_id, scope.node_id, scope.attempt);
    let subject = scope.bus.topology().event(&scope.goal_id);
    if let Err(e) = scope.bus.publish(subject, &event, &msg_id, None).await {
        tracing::warn!(error = %e, "cannot publish a tool call event");
    }
}

/// A tool output as the model sees it: whole when short, else its shape and first part.
fn observe(output: &Value) -> String {
    let text = output.to_string();
    if text.chars().count() <= MAX_OBSERVATION_CHARS {
        return text;
    }
    let fields: Vec<&str> =
        output.as_object().map(|m| m.keys().map(String::as_str).collect()).unwrap_or_default();
    let head: String = text.chars().take(MAX_OBSERVATION_CHARS / 2).collect();
    format!("(large output: {} characters, fields: {}) {head}...", text.len(), fields.join(", "))
}

fn finished(answer: String, steps: Vec<Value>, usage: Usage) -> Value {
    json!({
        "answer": answer,
        "steps": steps,
        "tokens": {"input": usage.input_tokens, "output": usage.output_tokens},
    })
}
