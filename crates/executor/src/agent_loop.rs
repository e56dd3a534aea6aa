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

use crate::tool::{RetryPolicy, Tool, ToolContext, ToolError, ToolRegistry, parse_args, schema_of};

/// Steps when neither the node nor the agent config says.
pub const DEFAULT_MAX_STEPS: u32 = 8;
/// Tokens when neither the node nor the agent config says.
pub const DEFAULT_MAX_TOKENS: u64 = 50_000;
/// Wall-clock bound of one agent task when the agent config does not say.
pub const DEFAULT_MAX_WALL: Duration = Duration::from_secs(180);
/// Identical calls with identical output that count as no progress.
const NO_PROGRESS_REPEATS: usize = 3;
/// Tool output longer than this reaches the model as a summary.
const MAX_OBSERVATION_CHARS: usize = 2000;
/// Turns kept verbatim when older ones are folded into the summary.
const VERBATIM_TURNS: usize = 2;
/// Turns after which older ones are folded into the rolling summary.
const SUMMARY_EVERY: usize = 5;
/// Share of the model's window a prompt may take before the context is compressed.
const COMPRESS_AT: f64 = 0.6;

/// How an agent's loop runs: its own instructions and its limits. Nodes may lower the step and
/// token budgets for themselves (`max_steps`, `max_tokens` in the node's inputs).
#[derive(Debug, Clone)]
pub struct LoopSettings {
    /// The agent's system prompt, placed before Hermes's rules for the loop.
    pub system_prompt: Option<String>,
    pub max_steps: u32,
    pub max_tokens: u64,
    /// Wall-clock bound of one agent task; past it the task ends `TIMEOUT`.
    pub max_wall: Duration,
    /// Context management: large tool outputs reach the model summarised, older turns fold into
    /// a rolling summary, and a prompt near the window is compressed. Off, every turn carries the
    /// whole transcript verbatim (to measure what management saves, docs/evaluation.md, or for a
    /// model whose window is large enough).
    pub manage_context: bool,
}

impl Default for LoopSettings {
    fn default() -> Self {
        Self {
            system_prompt: None,
            max_steps: DEFAULT_MAX_STEPS,
            max_tokens: DEFAULT_MAX_TOKENS,
            max_wall: DEFAULT_MAX_WALL,
            manage_context: true,
        }
    }
}

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
    /// Most model turns (default: the agent's, 8 unless configured).
    #[serde(default)]
    #[schemars(range(min = 1, max = 50))]
    max_steps: Option<u32>,
    /// Most tokens over all model turns (default: the agent's, 50000 unless configured).
    #[serde(default)]
    max_tokens: Option<u64>,
}

/// The `agent.run` tool.
pub struct AgentRun {
    model: AgentModel,
    tools: ToolRegistry,
    settings: LoopSettings,
}

impl AgentRun {
    /// `tools` are the tools the loop may call (never `agent.run` itself).
    pub fn new(model: AgentModel, tools: ToolRegistry) -> Self {
        Self { model, tools, settings: LoopSettings::default() }
    }

    pub fn with_settings(mut self, settings: LoopSettings) -> Self {
        self.settings = settings;
        self
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
        self.settings.max_wall
    }

    fn calls_model(&self) -> bool {
        true
    }

    /// One try: the loop's tool calls already retry on their own, and a second run of the loop
    /// would repeat its calls under new call indexes. The dispatcher retries the node by policy.
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy { attempts: 1, ..RetryPolicy::default() }
    }

    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args(args)?;
            let budget = Budget {
                max_steps: args.max_steps.unwrap_or(self.settings.max_steps),
                max_tokens: args.max_tokens.unwrap_or(self.settings.max_tokens),
            };
            let model = self.model.0.as_ref();
            run_loop(model, &self.tools, ctx, &self.settings, &args.instruction, &args.tools, budget).await
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

/// Runs the loop and returns `{answer, steps, tokens, context}`.
pub async fn run_loop(
    model: &dyn ChatModel,
    registry: &ToolRegistry,
    ctx: &ToolContext,
    settings: &LoopSettings,
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
    let rules = format!(
        "Use the tools to get facts; never invent results. Call one tool at a time when a result feeds the next.\n\
         When a tool returns an error, fix the arguments it names and call again.\n\
         When you have the answer, reply with the answer only.\n\
         If you cannot call functions, reply with lines `Action: <tool name>` and `Action Input: <JSON>`, or `Final Answer: <answer>`.\n\
         Tools: {}",
        specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", ")
    );
    let system = match settings.system_prompt.as_deref() {
        Some(prompt) if !prompt.trim().is_empty() => format!("{}\n\n{rules}", prompt.trim()),
        _ => format!("You are a Hermes agent.\n{rules}"),
    };
    let tool_tokens = tools
        .iter()
        .map(|t| model.count_tokens(&format!("{} {} {}", t.name, t.description, t.parameters)) + 8)
        .sum();
    let mut context = Context::new(model, system, instruction, tool_tokens, settings.manage_context);
    let mut usage = Usage::default();
    let mut steps: Vec<Value> = Vec::new();
    let mut history: Vec<(String, String, String)> = Vec::new();
    for step in 1..=budget.max_steps {
        // PLANNING
        context.fit();
        let request = ChatRequest {
            messages: context.messages(),
            tools: tools.clone(),
            temperature: Some(0.2),
            ..Default::default()
        };
        let response = crate::record::chat(model, request, ctx, "agent")
            .await
            .map_err(|e| error(e.code(), e.to_string()))?;
        usage += response.usage;
        ctx.charge(response.usage);
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
                Ok(ReactStep::Final { answer, .. }) => return Ok(finished(answer, steps, usage, &context)),
                Err(_) if !content.trim().is_empty() => {
                    return Ok(finished(content.trim().to_owned(), steps, usage, &context));
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
        let mut turn = Turn { messages: vec![assistant], digest: Vec::new() };
        for call in calls {
            // TOOL_RUNNING
            let started = std::time::Instant::now();
            let tool = by_function.get(&call.name).cloned().unwrap_or_else(|| call.name.replace("__", "."));
            let read = if response.finish_reason == "length" {
                Err(ToolError::invalid_argument(format!(
                    "the call of `{tool}` was cut off at the output token limit; call it again with complete arguments"
                )))
            } else {
                repair_json(&call.arguments).map_err(|e| {
                    ToolError::invalid_argument(format!(
                        "the arguments of `{tool}` are not usable: {e}; call it again with one complete JSON object"
                    ))
                })
            };
            let mut cached = None;
            let outcome = match read {
                Err(e) => Err(e),
                Ok(repaired) => {
                    let mut args = repaired.value;
                    let schema = specs
                        .iter()
                        .find(|s| s.name == tool)
                        .map(|spec| serde_json::from_str(&spec.params_schema_json).unwrap_or(Value::Null));
                    if let (Some(map), Some(schema)) = (args.as_object_mut(), &schema) {
                        hermes_llm::params::apply_aliases(map, schema, &HashMap::new());
                    }
                    let unknown = schema.as_ref().and_then(|schema| unknown_arguments(&tool, &args, schema));
                    if let Some(problem) = unknown {
                        Err(ToolError::invalid_argument(problem))
                    } else if by_function.contains_key(&call.name) || specs.iter().any(|s| s.name == tool) {
                        info!(event = "tool_called", tool = %tool, step, "agent tool call");
                        let (result, hit) = registry.call_reporting(&tool, args.clone(), ctx).await;
                        cached = hit;
                        result.map(|out| (args, out))
                    } else {
                        Err(ToolError::invalid_argument(format!("there is no tool `{}`", call.name)))
                    }
                }
            };
            // OBSERVING
            let (observation, record) = match &outcome {
                Ok((args, out)) => {
                    let seen = if settings.manage_context { observe(out) } else { out.to_string() };
                    (seen, json!({"tool": tool, "arguments": args, "ok": true, "output": out}))
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
                let index = steps.len() as u32;
                let call = CallReport { step, index, tool: &tool, arguments: &arguments, cached };
                publish_tool_called(scope, call, outcome.as_ref().err(), started).await;
                let output = outcome.as_ref().map(|(_, out)| out);
                crate::record::tool_call(scope, index, &tool, &arguments, output, started).await;
            }
            steps.push(record);
            turn.digest.push(format!(
                "step {step}: {tool}({}) -> {}",
                clip(&call.arguments, 120),
                clip(&observation, 200)
            ));
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
            turn.messages.push(if react {
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
        // OBSERVING ends the turn; every few turns the older ones fold into the summary.
        context.push(turn);
    }
    Err(error(ErrorCode::BudgetExceeded, format!("no answer within {} steps", budget.max_steps)))
}

/// Announces one tool call on the goal's event stream, so `hermes watch` and the events show
/// each step of an agent node. Best effort: the call's outcome does not depend on it.
/// One tool call of the loop, as its `ToolCalled` event tells it.
struct CallReport<'a> {
    step: u32,
    index: u32,
    tool: &'a str,
    arguments: &'a Value,
    cached: Option<crate::cache::CacheHit>,
}

async fn publish_tool_called(
    scope: &crate::tool::TaskScope,
    call: CallReport<'_>,
    error: Option<&ToolError>,
    started: std::time::Instant,
) {
    let CallReport { step, index, tool, arguments, cached } = call;
    let arguments: String = hermes_core::redact::redact(arguments).to_string().chars().take(500).collect();
    let event = hermes_proto::Event {
        seq: 0,
        session_id: String::new(),
        tenant: String::new(),
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
            cached: cached.is_some(),
            cached_age_ms: cached.map_or(0, |c| c.age.as_millis() as u64),
        })),
    };
    // A dispatcher publishes it for the agent (agents publish no goal events themselves).
    let kind = hermes_proto::agent_report::Kind::Event(event);
    if let Err(e) = crate::approval::report(scope, kind).await {
        tracing::warn!(error = %e.message, "cannot report a tool call event");
    }
}

/// A tool output as the model sees it: whole when short, else a summary of its shape: scalar
/// fields as they are, long strings by length and head, and lists of rows by row count, fields,
/// numeric stats and the first rows.
fn observe(output: &Value) -> String {
    let text = output.to_string();
    if text.chars().count() <= MAX_OBSERVATION_CHARS {
        return text;
    }
    let parts: Vec<String> = match output {
        Value::Object(map) => map.iter().map(|(key, value)| format!("{key}: {}", describe(value))).collect(),
        other => vec![describe(other)],
    };
    clip(
        &format!("(large output, {} characters, summarised) {}", text.len(), parts.join("; ")),
        MAX_OBSERVATION_CHARS,
    )
}

/// A short description of one value for [`observe`].
fn describe(value: &Value) -> String {
    match value {
        Value::String(s) if s.chars().count() > 200 => {
            format!("text of {} characters starting {:?}", s.chars().count(), clip(s, 150))
        }
        Value::Array(rows) => {
            let mut fields: Vec<&str> = Vec::new();
            let mut stats: std::collections::BTreeMap<&str, (f64, f64, f64, usize)> = Default::default();
            for row in rows {
                if let Value::Object(map) = row {
                    for (key, v) in map {
                        if !fields.contains(&key.as_str()) {
                            fields.push(key);
                        }
                        if let Some(x) = v.as_f64().or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                        {
                            let e = stats.entry(key).or_insert((f64::INFINITY, f64::NEG_INFINITY, 0.0, 0));
                            *e = (e.0.min(x), e.1.max(x), e.2 + x, e.3 + 1);
                        }
                    }
                }
            }
            let stats: Vec<String> = stats
                .iter()
                .map(|(k, (min, max, sum, n))| format!("{k} min {min} max {max} mean {:.4}", sum / *n as f64))
                .collect();
            let head: Vec<String> = rows.iter().take(3).map(|r| clip(&r.to_string(), 200)).collect();
            format!(
                "{} rows; fields [{}]; stats [{}]; first rows {}",
                rows.len(),
                fields.join(", "),
                stats.join("; "),
                head.join(", ")
            )
        }
        other => clip(&other.to_string(), 300),
    }
}

use hermes_core::text::clip;

/// One model turn: the model's message and the observations of its calls.
struct Turn {
    messages: Vec<Message>,
    /// One line per call for the rolling summary.
    digest: Vec<String>,
}

/// What the model sees each turn. The system prompt with a one-line brief of the task and the
/// instruction always lead; then a rolling summary of older turns; then recent turns verbatim.
/// Every [`SUMMARY_EVERY`] turns, turns older than the last [`VERBATIM_TURNS`] fold into the
/// summary; and before a request, a prompt over [`COMPRESS_AT`] of the model's window is
/// compressed the same way at once, then by shortening what is left.
struct Context<'m> {
    model: &'m dyn ChatModel,
    head: Vec<Message>,
    summary: Vec<String>,
    turns: Vec<Turn>,
    turns_since_fold: usize,
    /// Tokens the offered tool definitions take.
    tool_tokens: usize,
    folds: u32,
    compressions: u32,
    /// Off: no folding and no compression ([`LoopSettings::manage_context`]).
    managed: bool,
}

impl<'m> Context<'m> {
    fn new(
        model: &'m dyn ChatModel,
        system: String,
        instruction: &str,
        tool_tokens: usize,
        managed: bool,
    ) -> Self {
        let brief = clip(instruction.lines().find(|l| !l.trim().is_empty()).unwrap_or_default().trim(), 160);
        let head = vec![
            Message::system(format!("{system}\nTask brief: {brief}")),
            Message::user(instruction.to_owned()),
        ];
        Self {
            model,
            head,
            summary: Vec::new(),
            turns: Vec::new(),
            turns_since_fold: 0,
            tool_tokens,
            folds: 0,
            compressions: 0,
            managed,
        }
    }

    fn messages(&self) -> Vec<Message> {
        let mut messages = self.head.clone();
        if !self.summary.is_empty() {
            messages.push(Message::user(format!(
                "Summary of your earlier steps in this task (oldest first):\n{}",
                self.summary.join("\n")
            )));
        }
        messages.extend(self.turns.iter().flat_map(|t| t.messages.iter().cloned()));
        messages
    }

    fn push(&mut self, turn: Turn) {
        self.turns.push(turn);
        self.turns_since_fold += 1;
        if self.managed && self.turns_since_fold >= SUMMARY_EVERY {
            self.fold();
        }
    }

    /// Moves every turn but the last few into the summary.
    fn fold(&mut self) {
        let keep = self.turns.len().min(VERBATIM_TURNS);
        let old: Vec<Turn> = self.turns.drain(..self.turns.len() - keep).collect();
        if !old.is_empty() {
            self.summary.extend(old.into_iter().flat_map(|t| t.digest));
            self.folds += 1;
        }
        self.turns_since_fold = 0;
    }

    fn tokens(&self) -> usize {
        self.tool_tokens
            + self
                .messages()
                .iter()
                .map(|m| {
                    4 + self.model.count_tokens(&m.content)
                        + m.tool_calls
                            .iter()
                            .map(|c| self.model.count_tokens(&c.arguments) + 8)
                            .sum::<usize>()
                })
                .sum::<usize>()
    }

    /// Keeps the prompt under [`COMPRESS_AT`] of the window: fold, then keep only the latest
    /// summary lines, then shorten the verbatim observations.
    fn fit(&mut self) {
        let limit = (self.model.context_window() as f64 * COMPRESS_AT) as usize;
        if !self.managed || self.tokens() <= limit {
            return;
        }
        self.compressions += 1;
        self.fold();
        if self.tokens() > limit && self.summary.len() > 10 {
            let dropped = self.summary.len() - 10;
            self.summary.drain(..dropped);
            self.summary.insert(0, format!("({dropped} earlier steps omitted)"));
        }
        if self.tokens() > limit {
            for message in self.turns.iter_mut().flat_map(|t| t.messages.iter_mut()) {
                if message.role == Role::Tool || message.content.starts_with("Observation:") {
                    message.content = clip(&message.content, 400);
                }
            }
        }
    }
}

fn finished(answer: String, steps: Vec<Value>, usage: Usage, context: &Context<'_>) -> Value {
    json!({
        "answer": answer,
        "steps": steps,
        "tokens": {"input": usage.input_tokens, "output": usage.output_tokens},
        "context": {"summaries": context.folds, "compressions": context.compressions},
    })
}

/// Names the arguments a tool's schema does not declare, when it lists its parameters and does
/// not say others are welcome (`additionalProperties` absent or `false`): they go back to the
/// model, never dropped or passed on as guessed.
fn unknown_arguments(tool: &str, args: &Value, schema: &Value) -> Option<String> {
    let (Some(args), Some(properties)) =
        (args.as_object(), schema.get("properties").and_then(Value::as_object))
    else {
        return None;
    };
    if schema.get("additionalProperties").is_some_and(|extra| *extra != Value::Bool(false)) {
        return None;
    }
    let unknown: Vec<String> =
        args.keys().filter(|k| !properties.contains_key(*k)).map(|k| format!("`{k}`")).collect();
    if unknown.is_empty() {
        return None;
    }
    let known: Vec<String> = properties.keys().map(|k| format!("`{k}`")).collect();
    Some(format!(
        "unknown argument {} for `{tool}`; its parameters are {}",
        unknown.join(", "),
        known.join(", ")
    ))
}
