//! The tool abstraction and the per-agent tool registry. A tool declares a JSON Schema for its
//! parameters (derived from a Rust type with `schemars`); the registry validates arguments against
//! it before the tool runs, bounds every run with the tool's timeout, retries retryable failures
//! with backoff (3 tries, 0.5 s × 2^n), and keeps a circuit breaker per tool and target (the host
//! of `http.fetch`, say): after 5 consecutive dependency faults calls fail fast until a cool-down
//! has passed, then one trial call decides. Only dependency faults count: timeouts and
//! `UNAVAILABLE` (a remote that is down, an MCP server that died). A bad request (invalid
//! arguments, a schema failure, a policy denial, a deterministic tool error on the input) never
//! opens a breaker, so one client's bad goals cannot make a tool unavailable to everyone else.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hermes_core::ErrorCode;
use hermes_core::schema::InputSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

pub use crate::scope::{TaskScope, TokenMeter, ToolContext, ToolError};

/// Default bound on one tool run.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// How a tool is retried and when its breaker opens.
#[derive(Debug, Clone, Copy)]
pub struct RetryPolicy {
    /// Tries in all, the first included.
    pub attempts: u32,
    /// Wait before the second try; doubles each time.
    pub backoff: Duration,
    /// Consecutive failures that open the breaker.
    pub breaker_threshold: u32,
    /// How long an open breaker rejects calls before it lets one through.
    pub breaker_cooldown: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            attempts: 3,
            backoff: Duration::from_millis(500),
            breaker_threshold: 5,
            breaker_cooldown: Duration::from_secs(30),
        }
    }
}

/// A circuit breaker's state, as metrics and tests see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BreakerState {
    Closed,
    Open,
    HalfOpen,
}

#[derive(Debug, Default)]
struct Breaker {
    consecutive_failures: u32,
    opened_at: Option<std::time::Instant>,
}

/// A ledger entry: `{"attempt": n, "pending": true}` while the call runs, then
/// `{"attempt": n, "ok": output}` or `{"attempt": n, "error": {code, message}}`.
fn ledger_entry(attempt: u32, outcome: &Result<Value, ToolError>) -> bytes::Bytes {
    let value = match outcome {
        Ok(output) => serde_json::json!({"attempt": attempt, "ok": output}),
        Err(e) => serde_json::json!({
            "attempt": attempt,
            "error": {"code": e.code.as_str(), "message": e.message},
        }),
    };
    value.to_string().into()
}

/// A deterministic capability an agent offers as a task type.
pub trait Tool: Send + Sync + 'static {
    /// Name with a domain prefix, e.g. `table.aggregate`. It is the task type.
    fn name(&self) -> &str;
    /// What the tool does, written for a model choosing among tools.
    fn description(&self) -> &str;
    /// JSON Schema of the parameters.
    fn params_schema(&self) -> Value;
    fn timeout(&self) -> Duration {
        DEFAULT_TOOL_TIMEOUT
    }
    fn side_effects(&self) -> bool {
        false
    }
    /// The tool reaches other hosts: a replay with `--tools recorded` serves its calls from the
    /// record, as it does those of tools with side effects.
    fn reaches_network(&self) -> bool {
        false
    }
    fn retry_policy(&self) -> RetryPolicy {
        RetryPolicy::default()
    }
    /// Calls wait for a human's approval.
    fn require_confirm(&self) -> bool {
        false
    }
    /// How long a result may be reused, for a tool whose output depends only on its arguments
    /// and that changes nothing (docs/agents.md, "Cached tool results"). `None`: not cacheable.
    /// An agent caches only the tools its config names.
    fn cache_ttl(&self) -> Option<Duration> {
        None
    }
    /// The tool answers from a model (`agent.run`, `text.summarize`): the same arguments do not
    /// give the same output, and an agent loop's own tools may change things, so its results
    /// are never cached.
    fn calls_model(&self) -> bool {
        false
    }
    /// The tool's version, part of its cache key: a new version does not reuse an older one's
    /// results. Empty: the hash of its parameter schema stands for it.
    fn version(&self) -> &str {
        ""
    }
    /// The dependency a call reaches, when the tool reaches several (the host of a URL): each
    /// target has its own circuit breaker, so one sick host does not close the tool for others.
    fn breaker_target(&self, _args: &Value) -> Option<String> {
        None
    }
    /// Runs with arguments already validated against [`Tool::params_schema`].
    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>>;
}

/// Deserializes validated arguments into the tool's parameter type. A whole number written as a
/// float (`1500.0`, as protobuf's `Struct` and many JSON encoders write every number) is an
/// integer, as JSON Schema's `integer` already let it through validation.
pub fn parse_args<T: DeserializeOwned>(mut args: Value) -> Result<T, ToolError> {
    whole_numbers_as_integers(&mut args);
    serde_json::from_value(args).map_err(|e| ToolError::invalid_argument(e.to_string()))
}

/// Rewrites each float with no fractional part (and exactly representable) as an integer.
fn whole_numbers_as_integers(value: &mut Value) {
    match value {
        Value::Number(n) if n.is_f64() => {
            let f = n.as_f64().unwrap_or(f64::NAN);
            // 2^53: beyond it a float no longer names one integer.
            if f.fract() == 0.0 && f.abs() <= 9_007_199_254_740_992.0 {
                *value = if f < 0.0 { Value::from(f as i64) } else { Value::from(f as u64) };
            }
        }
        Value::Array(items) => items.iter_mut().for_each(whole_numbers_as_integers),
        Value::Object(fields) => fields.values_mut().for_each(whole_numbers_as_integers),
        _ => {}
    }
}

/// The JSON Schema of a parameter type.
pub fn schema_of<T: schemars::JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null)
}

struct RegisteredTool {
    tool: Arc<dyn Tool>,
    schema: InputSchema,
    /// Breakers by target; `""` is the tool's own.
    breakers: std::sync::Mutex<BTreeMap<String, Breaker>>,
}

/// Whether a failure says the tool's dependency is unwell (and counts toward its breaker), as
/// opposed to a bad request, which is the caller's problem and says nothing about the tool.
pub fn is_dependency_fault(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::Timeout | ErrorCode::Unavailable)
}

/// The tools one agent serves, by name.
#[derive(Default, Clone)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<RegisteredTool>>,
    /// Tools whose calls wait for a human's approval on this agent.
    confirm: std::collections::BTreeSet<String>,
    /// The agent these tools belong to, for metrics labels.
    agent: String,
    /// Answers the calls of tools with side effects or that reach the network instead of running
    /// them (`hermes replay --tools recorded`).
    pub(crate) playback: Option<Arc<dyn ToolPlayback>>,
    /// Tools whose results are cached, with how long ([`ToolRegistry::enable_cache`]).
    cache: BTreeMap<String, Duration>,
}

/// A source of recorded tool outputs, for a replay that must not repeat side effects
/// (`hermes replay --tools recorded`, docs/evaluation.md). Asked, in place of running the tool,
/// for every call of a tool with side effects or that reaches the network within a task.
pub trait ToolPlayback: Send + Sync + std::fmt::Debug {
    /// The recorded outcome of `tool` called with `args` in node `node_id`. A call with no
    /// record fails (a replay counts it as a divergence); it never runs.
    fn answer(&self, node_id: &str, tool: &str, args: &Value) -> Result<Value, ToolError>;

    /// The task types of the recorded run's plain nodes. An agent that lacks one (a Python
    /// worker's, another pool's, an MCP server's) serves it as a [`RecordedTaskType`], which
    /// only the record answers, so a replay in a fresh stack can run the recorded plan.
    fn task_types(&self) -> Vec<String> {
        Vec::new()
    }
}

/// A task type an agent does not serve, stood in for in a replay with `--tools recorded`: it
/// counts as a tool with side effects, so the [`ToolPlayback`] answers every call and none runs.
/// Its schema takes any object; the recorded run's inputs were checked by the schema then.
pub struct RecordedTaskType {
    name: String,
}

impl RecordedTaskType {
    pub fn new(name: impl Into<String>) -> Self {
        Self { name: name.into() }
    }
}

impl Tool for RecordedTaskType {
    fn name(&self) -> &str {
        &self.name
    }
    fn description(&self) -> &str {
        "Replay only: answered from the recorded run."
    }
    fn params_schema(&self) -> Value {
        serde_json::json!({"type": "object"})
    }
    fn side_effects(&self) -> bool {
        true
    }
    fn run<'a>(&'a self, _args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            Err(ToolError {
                code: ErrorCode::FailedPrecondition,
                message: format!(
                    "`{}` stands in for a recorded task type: only a replay's record answers it",
                    self.name
                ),
            })
        })
    }
}

impl ToolRegistry {
    /// An empty registry of `agent`'s tools (the id labels its metrics).
    pub fn for_agent(agent: impl Into<String>) -> Self {
        Self { agent: agent.into(), ..Default::default() }
    }

    /// Reports every tool's circuit breaker state as `hermes_tool_breaker_state` at each scrape.
    pub fn export_breaker_metrics(&self) {
        let registry = self.clone();
        hermes_core::metrics::global().on_scrape(move || {
            let metrics = hermes_core::metrics::global();
            for name in registry.names() {
                let state = match registry.breaker_state(name) {
                    Some(BreakerState::Closed) | None => 0,
                    Some(BreakerState::Open) => 1,
                    Some(BreakerState::HalfOpen) => 2,
                };
                let labels = hermes_core::metrics::labels(&[("agent", &registry.agent), ("tool", name)]);
                metrics.breaker_state.get_or_create(&labels).set(state);
            }
        });
    }

    /// Adds a tool; fails when its name is not a valid task type or its schema does not compile.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), crate::Error> {
        hermes_core::topology::validate_task_type(tool.name())?;
        let schema = InputSchema::compile(tool.params_schema()).map_err(|e| {
            crate::Error::Config(format!("tool {}: schema does not compile: {e}", tool.name()))
        })?;
        let breakers = std::sync::Mutex::new(BTreeMap::new());
        self.tools.insert(tool.name().to_owned(), Arc::new(RegisteredTool { tool, schema, breakers }));
        Ok(())
    }

    /// Makes calls of these tools wait for a human's approval.
    pub fn require_confirm(&mut self, tools: &[String]) -> Result<(), crate::Error> {
        for tool in tools {
            if !self.tools.contains_key(tool) {
                return Err(crate::Error::Config(format!(
                    "cannot require confirmation for unknown tool `{tool}`"
                )));
            }
            if self.cache.contains_key(tool) {
                return Err(crate::Error::Config(format!(
                    "cannot cache the results of `{tool}`: its calls need confirmation, which a cached result would skip"
                )));
            }
            self.confirm.insert(tool.clone());
        }
        Ok(())
    }

    /// Caches the results of the tools `ttls` names (docs/agents.md): a TTL of 0 takes the one
    /// the tool declares, and `"*"` names every tool that declares one. A tool with side effects
    /// or that needs confirmation is refused, as is one that declares no TTL and is given none.
    pub fn enable_cache(&mut self, ttls: &BTreeMap<String, u64>) -> Result<(), crate::Error> {
        let refuse = |tool: &str, why: String| {
            Err(crate::Error::Config(format!("cannot cache the results of `{tool}`: {why}")))
        };
        for (name, secs) in ttls {
            let names: Vec<String> = if name == "*" {
                self.tools
                    .values()
                    .filter(|t| t.tool.cache_ttl().is_some())
                    .map(|t| t.tool.name().to_owned())
                    .collect()
            } else {
                vec![name.clone()]
            };
            for tool in names {
                let Some(entry) = self.tools.get(&tool) else {
                    return refuse(&tool, "this agent has no such tool".into());
                };
                if entry.tool.side_effects() {
                    return refuse(&tool, "it has side effects, and a cached result would skip them".into());
                }
                if entry.tool.calls_model() {
                    return refuse(&tool, "it answers from a model, not from its arguments alone".into());
                }
                if self.confirm.contains(&tool) || entry.tool.require_confirm() {
                    return refuse(
                        &tool,
                        "its calls need confirmation, which a cached result would skip".into(),
                    );
                }
                let ttl = match (*secs, entry.tool.cache_ttl()) {
                    (0, Some(declared)) => declared,
                    (0, None) => return refuse(&tool, "it declares no TTL; give one in seconds".into()),
                    (secs, _) => Duration::from_secs(secs),
                };
                if ttl > crate::cache::MAX_TTL {
                    return refuse(
                        &tool,
                        format!("{} s is longer than the longest TTL, 7 days", ttl.as_secs()),
                    );
                }
                self.cache.insert(tool, ttl);
            }
        }
        Ok(())
    }

    /// The tools whose results are cached, with their TTLs.
    pub fn cached_tools(&self) -> &BTreeMap<String, Duration> {
        &self.cache
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// The breaker state of a tool (its own breaker, not a target's).
    pub fn breaker_state(&self, name: &str) -> Option<BreakerState> {
        self.breaker_state_for(name, "")
    }

    /// The breaker state of one target of a tool (`""`: the tool's own breaker).
    pub fn breaker_state_for(&self, name: &str, target: &str) -> Option<BreakerState> {
        let entry = self.tools.get(name)?;
        let policy = entry.tool.retry_policy();
        let breakers = entry.breakers.lock().ok()?;
        Some(match breakers.get(target).and_then(|b| b.opened_at) {
            None => BreakerState::Closed,
            Some(at) if at.elapsed() < policy.breaker_cooldown => BreakerState::Open,
            Some(_) => BreakerState::HalfOpen,
        })
    }

    /// Every tool as a catalogue entry served by one live agent: what the registry would list
    /// for an agent with these tools, for planning without a registry (the planning benchmark,
    /// planner tests).
    pub fn catalog_entries(&self) -> Vec<hermes_proto::CatalogEntry> {
        self.specs()
            .into_iter()
            .map(|tool| hermes_proto::CatalogEntry {
                task_type: tool.name.clone(),
                tool: Some(tool),
                live_agents: 1,
            })
            .collect()
    }

    /// The wire description of every tool, for heartbeats and the catalogue.
    pub fn specs(&self) -> Vec<hermes_proto::ToolSpec> {
        self.tools
            .values()
            .map(|t| hermes_proto::ToolSpec {
                name: t.tool.name().to_owned(),
                description: t.tool.description().to_owned(),
                params_schema_json: t.schema.raw().to_string(),
                side_effects: t.tool.side_effects(),
                require_confirm: self.confirm.contains(t.tool.name()) || t.tool.require_confirm(),
            })
            .collect()
    }

    /// Validates `args` and runs the tool under its timeout; counts the outcome in
    /// `hermes_tool_calls`.
    ///
    /// Each call is a span (`execute_tool <name>`) with the tool's name, status and duration, and
    /// its arguments and output redacted and truncated to [`TRACED_CHARS`].
    pub async fn call(&self, name: &str, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        self.call_reporting(name, args, ctx).await.0
    }

    /// [`ToolRegistry::call`], saying whether the result came from the tool-result cache.
    pub async fn call_reporting(
        &self,
        name: &str,
        args: Value,
        ctx: &ToolContext,
    ) -> (Result<Value, ToolError>, Option<crate::cache::CacheHit>) {
        use tracing::Instrument as _;
        use tracing::field::Empty;
        let span = tracing::info_span!(
            "tool_call",
            otel.name = %format_args!("execute_tool {name}"),
            otel.kind = "internal",
            otel.status_code = Empty,
            gen_ai.operation.name = "execute_tool",
            gen_ai.tool.name = name,
            hermes.tool.arguments = %traced(&args),
            hermes.tool.output = Empty,
            hermes.tool.status = Empty,
            hermes.tool.duration_ms = Empty,
            error.type = Empty,
        );
        let started = std::time::Instant::now();
        let (result, hit) = self.call_uncounted(name, args, ctx).instrument(span.clone()).await;
        let outcome = match &result {
            Ok(output) => {
                span.record("hermes.tool.output", tracing::field::display(traced(output)));
                "ok"
            }
            Err(e) => {
                span.record("otel.status_code", "ERROR");
                span.record("error.type", e.code.as_str());
                e.code.as_str()
            }
        };
        span.record("hermes.tool.status", outcome);
        span.record("hermes.tool.duration_ms", started.elapsed().as_millis() as u64);
        let labels =
            hermes_core::metrics::labels(&[("agent", &self.agent), ("tool", name), ("outcome", outcome)]);
        hermes_core::metrics::global().tool_calls.get_or_create(&labels).inc();
        (result, hit)
    }

    async fn call_uncounted(
        &self,
        name: &str,
        args: Value,
        ctx: &ToolContext,
    ) -> (Result<Value, ToolError>, Option<crate::cache::CacheHit>) {
        if let (Some(ttl), Some(scope)) = (self.cache.get(name), &ctx.task)
            && let Some(entry) = self.tools.get(name)
            && entry.schema.check(&args).is_empty()
            && self.playback.is_none()
        {
            let version = match entry.tool.version() {
                "" => hermes_llm::record::sha256(&entry.schema.raw().to_string()),
                named => named.to_owned(),
            };
            let policy = entry.tool.retry_policy();
            let longest = entry.tool.timeout() * policy.attempts.max(1) + Duration::from_secs(5);
            let key = crate::cache::CacheKey::new(&scope.tenant, name, &version, &args, *ttl, longest);
            let run = self.call_with_retries(entry, name, args.clone(), ctx);
            // Boxed, as the approval gate and the ledger below: a path only some calls take stays
            // out of every task's future (`handle_task` in lib.rs says why).
            return Box::pin(crate::cache::call(&scope.bus, &scope.memory_token, &key, run)).await;
        }
        (self.call_uncached(name, args, ctx).await, None)
    }

    async fn call_uncached(&self, name: &str, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let entry = self
            .tools
            .get(name)
            .ok_or_else(|| ToolError::invalid_argument(format!("this agent has no tool `{name}`")))?;
        let violations = entry.schema.check(&args);
        if !violations.is_empty() {
            let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
            return Err(ToolError::invalid_argument(format!(
                "arguments for `{name}` fail its schema: {}",
                list.join("; ")
            )));
        }
        if let (Some(playback), Some(scope)) = (&self.playback, &ctx.task)
            && (entry.tool.side_effects() || entry.tool.reaches_network())
        {
            return playback.answer(&scope.node_id, name, &args);
        }
        let ids = ctx.task.as_ref().map(|scope| (scope, scope.next_call(name, &args)));
        if self.confirm.contains(name) || entry.tool.require_confirm() {
            let Some((scope, ids)) = &ids else {
                return Err(ToolError {
                    code: ErrorCode::Denied,
                    message: format!("`{name}` needs approval, which only a task can ask for"),
                });
            };
            Box::pin(crate::approval::gate(scope, &ids.approval_id, name, &args)).await?;
        }
        let ledger = match (&ids, entry.tool.side_effects()) {
            (Some((scope, ids)), true) => {
                Some((scope.bus.task_ledger(&scope.memory_token), ids.ledger_key.as_str(), scope.attempt))
            }
            _ => None,
        };
        if let Some((store, key, attempt)) = &ledger
            && let Some(recorded) = Box::pin(claim(store, key, *attempt, name)).await?
        {
            return recorded;
        }
        let result = self.call_with_retries(entry, name, args, ctx).await;
        if let Some((store, key, attempt)) = &ledger {
            Box::pin(record(store, key, ledger_entry(*attempt, &result))).await;
        }
        result
    }

    async fn call_with_retries(
        &self,
        entry: &RegisteredTool,
        name: &str,
        args: Value,
        ctx: &ToolContext,
    ) -> Result<Value, ToolError> {
        let policy = entry.tool.retry_policy();
        let target = entry.tool.breaker_target(&args).unwrap_or_default();
        let mut attempt = 0;
        loop {
            entry.admit(name, &target, policy)?;
            let result = entry.run_once(name, args.clone(), ctx).await;
            entry.record(&target, &result, policy);
            match result {
                Err(e) if e.code.retryable() && attempt + 1 < policy.attempts => {
                    tokio::time::sleep(policy.backoff * 2u32.saturating_pow(attempt)).await;
                    attempt += 1;
                }
                other => return other,
            }
        }
    }
}

impl RegisteredTool {
    /// Fails fast while the target's breaker is open; after the cool-down one call goes through.
    fn admit(&self, name: &str, target: &str, policy: RetryPolicy) -> Result<(), ToolError> {
        let breakers = self.breakers.lock().map_err(|_| ToolError::failed("breaker lock poisoned"))?;
        let Some(breaker) = breakers.get(target) else { return Ok(()) };
        match breaker.opened_at {
            Some(at) if at.elapsed() < policy.breaker_cooldown => {
                let what = if target.is_empty() { String::new() } else { format!(" for `{target}`") };
                Err(ToolError {
                    code: ErrorCode::Unavailable,
                    message: format!(
                        "tool `{name}` is unavailable{what}: its circuit breaker opened after {} consecutive timeouts or unavailable dependencies; retry in {} s",
                        breaker.consecutive_failures,
                        (policy.breaker_cooldown - at.elapsed()).as_secs().max(1)
                    ),
                })
            }
            _ => Ok(()),
        }
    }

    /// A success closes the breaker; a dependency fault ([`is_dependency_fault`]) counts toward
    /// opening it. Every other failure is about the request and counts for neither.
    fn record(&self, target: &str, result: &Result<Value, ToolError>, policy: RetryPolicy) {
        let Ok(mut breakers) = self.breakers.lock() else { return };
        match result {
            Ok(_) => {
                breakers.remove(target);
            }
            Err(e) if is_dependency_fault(e.code) => {
                let breaker = breakers.entry(target.to_owned()).or_default();
                breaker.consecutive_failures += 1;
                if breaker.consecutive_failures >= policy.breaker_threshold {
                    breaker.opened_at = Some(std::time::Instant::now());
                }
            }
            Err(_) => {}
        }
    }

    async fn run_once(&self, name: &str, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let timeout = self.tool.timeout();
        match tokio::time::timeout(timeout, self.tool.run(args, ctx)).await {
            Ok(result) => result,
            Err(_) => Err(ToolError {
                code: ErrorCode::Timeout,
                message: format!("tool `{name}` did not finish within {} ms", timeout.as_millis()),
            }),
        }
    }
}

/// How much of a tool's arguments and output a span keeps.
pub const TRACED_CHARS: usize = 512;

/// A value as recorded on a span: secrets redacted, cut to [`TRACED_CHARS`] characters.
fn traced(value: &Value) -> String {
    let text = hermes_core::redact::redact(value).to_string();
    match text.char_indices().nth(TRACED_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    }
}

/// How long a claim keeps trying while the ledger is unreachable (a JetStream cluster electing a
/// new leader for the ledger's stream, a server restarting) before the call fails `UNAVAILABLE`.
const CLAIM_PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// How old another delivery's pending claim must be before it counts as one whose outcome is
/// unknown: younger, that delivery may still be running the call or recording its outcome.
const PENDING_GRACE: std::time::Duration = std::time::Duration::from_secs(45);

/// Claims a side-effecting call in the ledger before it runs. `None`: the call is ours to run.
/// `Some(outcome)`: a previous delivery or attempt already decided it, and that is the result.
///
/// A claim that fails because the ledger is unreachable is tried again for up to
/// [`CLAIM_PATIENCE`]. Each claim carries a random id, so a claim whose write landed but whose
/// acknowledgement was lost (the stream's leader died in between) is recognised as this
/// delivery's own when tried again, and not mistaken for an earlier delivery's unknown outcome.
async fn claim(
    store: &hermes_core::ledger::LedgerStore,
    key: &str,
    attempt: u32,
    name: &str,
) -> Result<Option<Result<Value, ToolError>>, ToolError> {
    let claim_id = uuid::Uuid::new_v4().simple().to_string();
    let deadline = std::time::Instant::now() + CLAIM_PATIENCE;
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        match claim_once(store, key, attempt, name, &claim_id).await {
            Err(Transient(e)) if std::time::Instant::now() < deadline => {
                tracing::warn!(key, tool = name, error = %e.message, "the ledger is unreachable; claiming again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
            Err(Transient(e)) => return Err(e),
            Ok(outcome) => return outcome,
        }
    }
}

/// Records a call's outcome in the ledger, trying again for up to [`CLAIM_PATIENCE`] while it is
/// unreachable: an outcome left unrecorded would make a later delivery refuse the call as one
/// whose outcome is unknown.
async fn record(store: &hermes_core::ledger::LedgerStore, key: &str, entry: bytes::Bytes) {
    let deadline = std::time::Instant::now() + CLAIM_PATIENCE;
    let mut pause = std::time::Duration::from_millis(100);
    loop {
        match store.put(key, entry.clone()).await {
            Ok(()) => return,
            Err(e) if std::time::Instant::now() < deadline => {
                tracing::warn!(key, error = %e, "cannot record a side effect in the ledger yet; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(std::time::Duration::from_secs(2));
            }
            Err(e) => {
                tracing::warn!(key, error = %e, "cannot record a side effect in the ledger");
                return;
            }
        }
    }
}

/// A ledger failure that another try may not have (no answer, no leader, a lost connection).
struct Transient(ToolError);

fn pending_entry(attempt: u32, claim_id: &str) -> bytes::Bytes {
    serde_json::json!({"attempt": attempt, "pending": true, "claim": claim_id}).to_string().into()
}

/// One try of [`claim`]: `Err` when the ledger did not answer, else what the claim decided.
async fn claim_once(
    store: &hermes_core::ledger::LedgerStore,
    key: &str,
    attempt: u32,
    name: &str,
    claim_id: &str,
) -> Result<Result<Option<Result<Value, ToolError>>, ToolError>, Transient> {
    let unavailable = |e: &dyn std::fmt::Display| ToolError {
        code: ErrorCode::Unavailable,
        message: format!("ledger: {e}"),
    };
    match store.create(key, pending_entry(attempt, claim_id)).await {
        Ok(true) => return Ok(Ok(None)),
        Ok(false) => {}
        Err(e) => return Err(Transient(unavailable(&e))),
    }
    let entry = match store.entry(key).await {
        Ok(Some(entry)) => entry,
        Ok(None) => return Err(Transient(unavailable(&"the entry vanished"))),
        Err(e) => return Err(Transient(unavailable(&e))),
    };
    let recorded: Value = serde_json::from_slice(&entry.value).unwrap_or(Value::Null);
    let recorded_attempt = recorded.get("attempt").and_then(Value::as_u64).unwrap_or(0) as u32;
    if let Some(output) = recorded.get("ok") {
        tracing::info!(
            key,
            tool = name,
            event = "ledger_hit",
            "side effect already done; reusing its recorded outcome"
        );
        return Ok(Ok(Some(Ok(output.clone()))));
    }
    if let Some(error) = recorded.get("error") {
        let error = ToolError {
            code: error
                .get("code")
                .and_then(Value::as_str)
                .and_then(ErrorCode::parse)
                .unwrap_or(ErrorCode::ToolError),
            message: error.get("message").and_then(Value::as_str).unwrap_or_default().to_owned(),
        };
        if recorded_attempt >= attempt {
            return Ok(Ok(Some(Err(error))));
        }
        // An earlier attempt failed; this one may try again, if no other delivery claims it first.
        return Ok(match store.replace(key, pending_entry(attempt, claim_id), entry.revision).await {
            Ok(()) => Ok(None),
            Err(e) => Err(unavailable(&format!("another delivery claimed `{name}` first: {e}"))),
        });
    }
    // This delivery's own claim, written by a try whose answer was lost: the call is still ours.
    if recorded.get("claim").and_then(Value::as_str) == Some(claim_id) {
        return Ok(Ok(None));
    }
    // Pending, and young: another delivery may still be running the call, or recording its
    // outcome (a record waits out an unreachable ledger for up to `CLAIM_PATIENCE`). Wait for it,
    // as for an unreachable ledger; a claim older than `PENDING_GRACE` is one whose delivery
    // stopped before recording what happened.
    let claimed_at_ms = entry.written_unix_ms;
    let age_ms = hermes_core::now_unix_ms() as i128 - claimed_at_ms;
    if age_ms < PENDING_GRACE.as_millis() as i128 {
        let waiting = format!(
            "`{name}` is in progress in an earlier delivery (attempt {recorded_attempt}); waiting for its outcome"
        );
        return Err(Transient(ToolError { code: ErrorCode::Unavailable, message: waiting }));
    }
    // Pending: a delivery started the call and stopped before recording what happened.
    Ok(Ok(Some(Err(ToolError {
        code: ErrorCode::ToolError,
        message: format!(
            "`{name}` was started by an earlier delivery (attempt {recorded_attempt}) whose outcome is unknown; not repeating a side effect"
        ),
    }))))
}

#[cfg(test)]
mod parse_args_tests {
    #[test]
    fn whole_floats_are_integers_for_the_tool_and_fractions_stay() {
        #[derive(serde::Deserialize)]
        struct Args {
            ms: u64,
            offset: i64,
            ratio: f64,
            list: Vec<u32>,
        }
        let args: Args = super::parse_args(
            serde_json::json!({"ms": 1500.0, "offset": -2.0, "ratio": 0.5, "list": [1.0, 2]}),
        )
        .unwrap();
        assert_eq!((args.ms, args.offset, args.ratio, args.list), (1500, -2, 0.5, vec![1, 2]));
        let err =
            super::parse_args::<Args>(serde_json::json!({"ms": 1.5, "offset": 0, "ratio": 1, "list": []}));
        assert!(err.is_err());
    }
}
