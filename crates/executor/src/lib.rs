//! The executor agent. It serves the task types it declares (for now, its tools): it pulls tasks
//! from the pool consumer of each task type, validates and runs the tool, publishes the
//! `TaskResult` and only then acks the task, so a crash between the two redelivers the task rather
//! than losing it. It also heartbeats its capabilities to the registry.

pub mod agent_loop;
mod approval;
pub mod cache;
pub mod config;
mod fair;
pub mod isolate;
pub mod lean;
pub mod record;
pub mod scope;
pub mod service;
pub mod supervise;
pub mod tool;
pub mod tools;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hermes_core::bus::{ConsumerSpec, Handled};
use hermes_core::{Bus, Delivery, ErrorCode, now_unix_ms};
use hermes_proto::{AgentHeartbeat, TaskMessage, TaskResult, TaskStatus};
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

pub use tool::{Tool, ToolContext, ToolError, ToolRegistry};

/// How one agent runs.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub agent_id: String,
    pub pool: String,
    /// Tools (task types) this agent serves; empty means every built-in tool.
    pub tools: Vec<String>,
    pub max_concurrency: u32,
    /// The dir file-reading tools are confined to.
    pub workspace: PathBuf,
    pub heartbeat_interval: Duration,
    /// How long the server waits for an ack before redelivering; progress acks extend it.
    pub ack_wait: Duration,
    /// Deliveries of one task before it is given up on.
    pub max_deliver: i64,
    /// Labels routing can prefer (e.g. `gpu`, `eu-west`).
    pub tags: Vec<String>,
    /// The model this agent's LLM steps use, for routing preferences.
    pub model: String,
    /// With a model the agent also serves `agent.run`, the LLM tool loop over its other tools.
    pub llm: Option<agent_loop::AgentModel>,
    /// Hosts `http.fetch` may reach (`*.example.com` for subdomains); empty denies all.
    pub http_allow: Vec<String>,
    /// Tools whose calls wait for a human's approval.
    pub confirm_tools: Vec<String>,
    /// Tools whose results are cached, with their TTLs in seconds (0: the tool's declared one;
    /// `"*"`: every tool that declares one). See [`tool::ToolRegistry::enable_cache`].
    pub cache_tools: std::collections::BTreeMap<String, u64>,
    /// How long a call waits for approval before it counts as denied.
    pub approval_timeout: Duration,
    /// The `agent.run` loop's system prompt and budgets.
    pub loop_settings: agent_loop::LoopSettings,
    /// `code.python`, when enabled (it is off by default).
    pub code_python: Option<tools::CodePythonConfig>,
    /// MCP servers whose tools are mounted.
    pub mcp: Vec<config::McpServerSpec>,
    /// Where the calls of tools with side effects or that reach the network are answered from
    /// instead of run: `hermes replay --tools recorded` sets it; a deployed agent never does.
    pub playback: Option<Arc<dyn tool::ToolPlayback>>,
}

impl AgentConfig {
    pub fn new(agent_id: impl Into<String>, workspace: impl Into<PathBuf>) -> Self {
        Self {
            agent_id: agent_id.into(),
            pool: "default".to_owned(),
            tools: Vec::new(),
            max_concurrency: 16,
            workspace: workspace.into(),
            heartbeat_interval: Duration::from_secs(10),
            ack_wait: Duration::from_secs(30),
            max_deliver: 5,
            tags: Vec::new(),
            model: String::new(),
            llm: None,
            playback: None,
            http_allow: Vec::new(),
            confirm_tools: Vec::new(),
            cache_tools: Default::default(),
            approval_timeout: Duration::from_secs(600),
            loop_settings: agent_loop::LoopSettings::default(),
            code_python: None,
            mcp: Vec::new(),
        }
    }
}

/// Errors that stop an agent from starting.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid agent config: {0}")]
    Config(String),
    #[error(transparent)]
    Core(#[from] hermes_core::Error),
}

impl Error {
    /// The stable code: a bad config is `INVALID_ARGUMENT`; the bus's errors keep theirs.
    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Config(_) => ErrorCode::InvalidArgument,
            Error::Core(e) => e.code(),
        }
    }

    pub fn retryable(&self) -> bool {
        self.code().retryable()
    }
}

impl AgentConfig {
    /// A durable consumer of the task stream with this agent's AckWait and MaxDeliver: its
    /// pools', its tenants' lanes' and its directed one.
    fn task_consumer(
        &self,
        topology: &hermes_core::topology::Topology,
        name: String,
        filter_subject: String,
    ) -> ConsumerSpec {
        ConsumerSpec {
            stream: topology.tasks_stream(),
            name,
            filter_subject,
            ack_wait: self.ack_wait,
            max_deliver: self.max_deliver,
            max_ack_pending: 20_000,
        }
    }
}

/// A built agent, connected and bound to its consumers, ready to [`Agent::run`].
pub struct Agent {
    bus: Bus,
    config: AgentConfig,
    registry: ToolRegistry,
    /// The consumers it binds: one per task type's pool, and its directed one.
    consumers: Vec<ConsumerSpec>,
    /// The tenants' lanes, as they are written (`hermes_core::lanes`).
    lanes: Lanes,
    started_unix_ms: u64,
}

impl Agent {
    /// Validates the config and binds one pool consumer per task type. Fails fast with a clear
    /// message on a bad id, an unknown tool or a missing workspace.
    pub async fn build(bus: Bus, config: AgentConfig) -> Result<Agent, Error> {
        hermes_core::topology::validate_agent_id(&config.agent_id)
            .map_err(|e| Error::Config(e.to_string()))?;
        if config.max_concurrency == 0 {
            return Err(Error::Config("max_concurrency must be at least 1".into()));
        }
        if !config.workspace.is_dir() {
            return Err(Error::Config(format!(
                "workspace {} is not a directory",
                config.workspace.display()
            )));
        }
        let registry = build_registry(&config, Some(&bus)).await?;
        let topology = bus.topology().clone();
        let mut consumers = Vec::new();
        // Each task type's plain pool; the tenants' lanes follow the lanes bucket (`consume`).
        for task_type in registry.names() {
            consumers.push(config.task_consumer(
                &topology,
                topology.pool_consumer(task_type),
                topology.pool_task(task_type),
            ));
        }
        // Work the registry routed to this agent in particular.
        consumers.push(config.task_consumer(
            &topology,
            topology.agent_consumer(&config.agent_id),
            topology.direct_tasks_of(&config.agent_id),
        ));
        // Bind them now, so a problem shows at start rather than in the pull loop.
        let bound =
            futures::future::try_join_all(consumers.iter().map(|spec| bus.durable_consumer(spec.clone())))
                .await?;
        // A pool's consumers keep the settings of the agent that created them first: say when
        // this agent's differ, once.
        let differing: Vec<String> = bound
            .iter()
            .zip(&consumers)
            .filter_map(|(consumer, spec)| {
                let differs = hermes_core::bus::config_differences(&consumer.cached_info().config, spec);
                (!differs.is_empty()).then(|| format!("{}: {}", spec.name, differs.join(", ")))
            })
            .collect();
        if let Some(first) = differing.first() {
            warn!(
                agent = %config.agent_id,
                consumers = differing.len(),
                first = %first,
                "consumers this agent pulls from exist with other settings than its own, and keep them: \
                 change them on the server (`nats consumer edit`), or delete them while nothing is pending"
            );
        }
        let lanes = Box::pin(hermes_core::lanes::follow(&bus).await?);
        Ok(Agent { bus, config, registry, consumers, lanes, started_unix_ms: now_unix_ms() })
    }

    pub fn tool_registry(&self) -> &ToolRegistry {
        &self.registry
    }

    /// Serves tasks until `shutdown` is cancelled, then finishes in-flight tasks and deregisters.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), Error> {
        // The process before this one crashed: the tasks it was running count one crash each,
        // before any of them is delivered again.
        let crashed = supervise::crashed_tasks();
        if !crashed.is_empty() {
            let counted = count_crashes(&self.bus, &crashed).await?;
            warn!(agent = %self.config.agent_id, counted, event = "crashes_counted", "the previous process crashed");
        }
        let shared = Arc::new(Shared {
            bus: self.bus.clone(),
            registry: self.registry.clone(),
            workspace: self.config.workspace.clone(),
            approval_timeout: self.config.approval_timeout,
            agent_id: self.config.agent_id.clone(),
            ack_wait: self.config.ack_wait,
            in_flight: AtomicU32::new(0),
            backlogged: Arc::default(),
            backlog_rose: Arc::default(),
            stats: std::sync::Mutex::new(Stats::default()),
            running: Default::default(),
        });
        let cancels = tokio::spawn(cancel_loop(shared.clone(), shutdown.clone()));
        shared.registry.export_breaker_metrics();
        let metrics_shared = Arc::downgrade(&shared);
        hermes_core::metrics::global().on_scrape(move || {
            if let Some(shared) = metrics_shared.upgrade() {
                let labels = hermes_core::metrics::labels(&[("agent", &shared.agent_id)]);
                let in_flight = shared.in_flight.load(Ordering::Relaxed) as i64;
                hermes_core::metrics::global().tasks_in_flight.get_or_create(&labels).set(in_flight);
            }
        });
        // No span around the long-lived loops: a span lives until it closes, and one that lasts the
        // process would be exported at shutdown as a trace of its own. Each task gets its span.
        let consumer =
            consume(shared.clone(), self.consumers, self.lanes, self.config.clone(), shutdown.clone());
        let consumer = tokio::spawn(consumer);
        let drained = CancellationToken::new();
        let heartbeat = heartbeat_loop(
            shared.clone(),
            self.config.clone(),
            self.started_unix_ms,
            shutdown.clone(),
            drained.clone(),
        );
        let heartbeat = tokio::spawn(heartbeat);
        info!(agent = %self.config.agent_id, tools = ?shared.registry.names().collect::<Vec<_>>(), "agent serving");
        if let Ok(Err(e)) = consumer.await {
            warn!(error = %e, "task consumer stopped");
        }
        // The consumer returns only after their in-flight tasks finished; only then may the agent
        // leave the registry, so its remaining directed work can be handed to others.
        drained.cancel();
        let _ = heartbeat.await;
        cancels.abort();
        Ok(())
    }
}

/// The agent's tools: the built-ins it asks for (all but `code.python` when it names none),
/// with a bus the `memory.*` tools, `code.python` when enabled, the tools of its MCP servers,
/// and with a model `text.summarize` and `agent.run` over all the others.
pub async fn build_registry(config: &AgentConfig, bus: Option<&Bus>) -> Result<ToolRegistry, Error> {
    let wanted = &config.tools;
    let wants = |name: &str| wanted.is_empty() || wanted.iter().any(|w| w == name);
    let mut registry = ToolRegistry::for_agent(config.agent_id.clone());
    registry.playback = config.playback.clone();
    let builtins = tools::builtin_tools_with(config.http_allow.clone());
    for tool in &builtins {
        if wants(tool.name()) {
            registry.register(tool.clone())?;
        }
    }
    if let Some(bus) = bus {
        let memory = hermes_clients::memory::MemoryClient::new(bus);
        let tools: [Arc<dyn Tool>; 3] = [
            Arc::new(tools::MemoryPut(memory.clone())),
            Arc::new(tools::MemoryGet(memory.clone())),
            Arc::new(tools::MemorySearch(memory)),
        ];
        for tool in tools {
            if wants(tool.name()) {
                registry.register(tool)?;
            }
        }
    }
    match &config.code_python {
        Some(python) if wants("code.python") => {
            registry.register(Arc::new(tools::CodePython::new(python.clone())))?;
        }
        None if wanted.iter().any(|w| w == "code.python") => {
            return Err(Error::Config(
                "`code.python` is disabled; enable it with a [agent.code_python] section".into(),
            ));
        }
        _ => {}
    }
    for server in &config.mcp {
        for tool in tools::mcp::mount(server).await? {
            registry.register(tool)?;
        }
    }
    if let Some(model) = config.llm.clone() {
        if wants("text.summarize") {
            registry.register(Arc::new(tools::TextSummarize::new(model.clone())))?;
        }
        // The loop calls the agent's tools as its tasks do: with their confirmations and cache.
        let (loop_confirm, confirm): (Vec<_>, Vec<_>) =
            config.confirm_tools.iter().cloned().partition(|t| t == "agent.run");
        let (loop_cache, cache): (std::collections::BTreeMap<_, _>, std::collections::BTreeMap<_, _>) =
            config.cache_tools.clone().into_iter().partition(|(t, _)| t == "agent.run");
        registry.require_confirm(&confirm)?;
        registry.enable_cache(&cache)?;
        let loop_tools = registry.clone();
        let run = agent_loop::AgentRun::new(model, loop_tools).with_settings(config.loop_settings.clone());
        registry.register(Arc::new(run))?;
        registry.require_confirm(&loop_confirm)?;
        registry.enable_cache(&loop_cache)?;
    } else {
        registry.require_confirm(&config.confirm_tools)?;
        registry.enable_cache(&config.cache_tools)?;
    }
    // A replay with `--tools recorded` runs the recorded plan whatever served it: the task types
    // this agent lacks are answered from the record. Model-driven ones are replayed through the
    // model's record instead, by an agent with the replay's model.
    if let Some(playback) = &config.playback {
        for task_type in playback.task_types() {
            let model_driven = matches!(task_type.as_str(), "agent.run" | "text.summarize");
            if !model_driven && !registry.contains(&task_type) {
                registry.register(Arc::new(tool::RecordedTaskType::new(task_type)))?;
            }
        }
    }
    if let Some(unknown) = wanted.iter().find(|w| !registry.contains(w)) {
        let known: Vec<&str> = builtins.iter().map(|t| t.name()).collect();
        return Err(Error::Config(format!(
            "unknown tool `{unknown}`; available: {} (memory.put/get/search, code.python when enabled, agent.run and text.summarize with a model, and MCP tools as <server>.<tool>)",
            known.join(", ")
        )));
    }
    Ok(registry)
}

struct Shared {
    bus: Bus,
    registry: ToolRegistry,
    workspace: PathBuf,
    approval_timeout: Duration,
    agent_id: String,
    ack_wait: Duration,
    in_flight: AtomicU32,
    /// Whether pooled work waited when the agent last took a task (`fair`), for its heartbeat.
    backlogged: Arc<std::sync::atomic::AtomicBool>,
    /// Told when `backlogged` turns true: the heartbeat loop sends a beat then.
    backlog_rose: Arc<tokio::sync::Notify>,
    stats: std::sync::Mutex<Stats>,
    /// Running tasks' cancellation tokens, by task id, with their goal.
    running: std::sync::Mutex<std::collections::HashMap<String, (String, CancellationToken)>>,
}

/// Rolling success rate and latency, reported in heartbeats.
#[derive(Debug, Clone, Copy)]
struct Stats {
    success_rate: f64,
    latency_ms: f64,
    seen: u64,
}

impl Default for Stats {
    fn default() -> Self {
        Self { success_rate: 1.0, latency_ms: 0.0, seen: 0 }
    }
}

impl Stats {
    /// Exponentially weighted, about the last 20 tasks.
    fn record(&mut self, succeeded: bool, elapsed_ms: u64) {
        const ALPHA: f64 = 0.1;
        let ok = if succeeded { 1.0 } else { 0.0 };
        if self.seen == 0 {
            self.success_rate = ok;
            self.latency_ms = elapsed_ms as f64;
        } else {
            self.success_rate += ALPHA * (ok - self.success_rate);
            self.latency_ms += ALPHA * (elapsed_ms as f64 - self.latency_ms);
        }
        self.seen += 1;
    }
}

/// The lanes bucket's entries as they are written.
type Lanes = std::pin::Pin<Box<dyn futures::Stream<Item = hermes_core::lanes::LaneUpdate> + Send>>;

/// Pulls from every consumer of the agent through one loop that takes a concurrency permit
/// before it waits for the next message, from whichever consumer has one. A permit is therefore
/// never parked on a consumer with no work while another has some. Which consumer a free slot
/// takes from is the fair merge's (`fair`): directed work first, then the plain pool and each
/// tenant's lane by weighted fair queuing; a tenant's lanes are added as the lanes bucket names
/// the tenant.
async fn consume(
    shared: Arc<Shared>,
    consumers: Vec<ConsumerSpec>,
    mut lanes: Lanes,
    config: AgentConfig,
    shutdown: CancellationToken,
) -> Result<(), Error> {
    let max_concurrency = config.max_concurrency;
    use futures::StreamExt as _;
    let bus = shared.bus.clone();
    let topology = bus.topology().clone();
    // Prefetch no more than we can run, so tasks we cannot start stay with other agents. Each
    // stream re-creates its consumer if it is deleted under it (see `Bus::resilient_messages`).
    let batch = max_concurrency as usize;
    let (changes, receiver) = tokio::sync::mpsc::unbounded_channel();
    // A pooled task waits here at most half its AckWait, so a low weight never lets the server
    // deliver it again elsewhere while this agent still holds it.
    let mut messages = fair::FairMerge::new(receiver, shared.backlogged.clone(), shared.backlog_rose.clone())
        .hold_at_most(config.ack_wait / 2);
    let directed = topology.direct_tasks_of(&shared.agent_id);
    for spec in consumers {
        let is_directed = spec.filter_subject == directed;
        let source: fair::Source<_> = Box::pin(bus.resilient_messages(spec, batch));
        match is_directed {
            true => messages.directed(source),
            false => messages.pooled(fair::PLAIN_POOL, 1.0, source),
        }
    }
    let task_types: Vec<String> = shared.registry.names().map(str::to_owned).collect();
    let follow = {
        let bus = bus.clone();
        let shutdown = shutdown.clone();
        async move {
            let mut known = std::collections::HashMap::<String, f64>::new();
            loop {
                let update = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    update = lanes.next() => match update {
                        Some(update) => update,
                        None => {
                            // The watch ended (its server went away for good): watch again, from
                            // the start; the lanes already served are recognised and skipped.
                            warn!(event = "lanes_watch_ended", "the lanes bucket's watch ended; watching it again");
                            tokio::time::sleep(Duration::from_secs(1)).await;
                            match hermes_core::lanes::follow(&bus).await {
                                Ok(again) => lanes = Box::pin(again),
                                Err(e) => warn!(error = %e, "cannot watch the lanes bucket; trying again"),
                            }
                            continue;
                        }
                    },
                };
                let change = match known.insert(update.tenant.clone(), update.weight) {
                    Some(weight) if weight == update.weight => continue,
                    Some(_) => {
                        vec![fair::Change::Weight { flow: update.tenant.clone(), weight: update.weight }]
                    }
                    None => task_types
                        .iter()
                        .map(|task_type| {
                            let spec = config.task_consumer(
                                &topology,
                                topology.lane_consumer(&update.tenant, task_type),
                                topology.lane_task(&update.tenant, task_type),
                            );
                            let source: fair::Source<_> = Box::pin(bus.resilient_messages(spec, batch));
                            fair::Change::Add { flow: update.tenant.clone(), weight: update.weight, source }
                        })
                        .collect(),
                };
                info!(tenant = %update.tenant, weight = update.weight, event = "lane_followed", "serving a tenant's lane");
                for change in change {
                    if changes.send(change).is_err() {
                        return;
                    }
                }
            }
        }
    };
    let follower = tokio::spawn(follow);
    // On shutdown the loop hands back what was pulled but not started, then finishes what runs.
    hermes_core::bus::consume_concurrently(
        &bus,
        "task",
        &mut messages,
        max_concurrency as usize,
        &shutdown,
        |delivery| {
            let shared = shared.clone();
            async move { handle_task(&shared, &delivery).await }
        },
    )
    .await;
    follower.abort();
    Ok(())
}

/// Runs one task and says how to settle its message: done once its result is published
/// (confirmed, so that an agent that deregisters after draining leaves nothing behind that looks
/// unfinished and would be handed to another agent), delivered again when the result cannot be
/// published.
///
/// Every task's future is allocated and moved whole, at the size of its largest state, whether
/// or not that state is reached. So the paths only some tasks take (a crash marker's read, the
/// cache, approvals, the ledger, artifacts in or out) are boxed where they are awaited: the
/// future is about 4.6 KB in a release build instead of 32.5 KB (docs/performance.md, "A task's
/// future"). Box a new rare path the same way.
async fn handle_task(shared: &Shared, delivery: &Delivery<TaskMessage>) -> Handled {
    let task = &delivery.message;
    let span = tracing::info_span!(
        "agent_task",
        otel.name = %format_args!("task {}", task.task_type),
        otel.kind = "consumer",
        goal_id = %task.goal_id,
        node_id = %task.node_id,
        task_id = %task.task_id,
        task_type = %task.task_type,
        attempt = task.attempt,
        agent = %shared.agent_id,
    );
    hermes_core::trace::follow(&span, delivery.trace.as_ref());
    async {
        info!(event = "task_received", task_type = %task.task_type, attempt = task.attempt, "task received");
        // Only a redelivery or a later attempt can find a crash marker: its read is boxed (see
        // above).
        let crashed_before = match first_delivery(delivery) {
            true => false,
            false => match Box::pin(crash_marker(shared, delivery)).await {
                Crashes::Quarantine(deaths) => return Box::pin(quarantine(shared, delivery, deaths)).await,
                Crashes::Counted(marker) => marker.is_some(),
            },
        };
        let running = supervise::running(&supervised_key(task));
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        let result = run_with_progress(shared, delivery).await;
        shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        drop(running);
        if crashed_before {
            clear_crash_marker(shared, task);
        }
        let succeeded = result.status == TaskStatus::Succeeded as i32;
        if let Ok(mut stats) = shared.stats.lock() {
            stats.record(succeeded, result.elapsed_ms);
        }
        let status = if succeeded { "succeeded" } else { "failed" };
        let labels = hermes_core::metrics::labels(&[
            ("agent", &shared.agent_id),
            ("task_type", &task.task_type),
            ("status", status),
        ]);
        let metrics = hermes_core::metrics::global();
        metrics.tasks.get_or_create(&labels).inc();
        metrics
            .task_duration
            .get_or_create(&labels)
            .observe(hermes_core::metrics::seconds(result.elapsed_ms));
        match publish_result_patiently(shared, delivery, &result).await {
            Ok(_) => {
                if result.status == TaskStatus::Succeeded as i32 {
                    info!(event = "task_succeeded", elapsed_ms = result.elapsed_ms, "task succeeded");
                } else {
                    let code = result.error.as_ref().map(|e| e.code.as_str()).unwrap_or("");
                    info!(event = "task_failed", code, elapsed_ms = result.elapsed_ms, "task failed");
                }
                Handled::Done
            }
            Err(e) => {
                warn!(error = %e, "cannot publish result; asking for redelivery");
                Handled::Retry { after: Duration::from_secs(1) }
            }
        }
    }
    .instrument(span)
    .await
}

/// How long a task's result is published again after a failure (a JetStream cluster electing
/// the results stream's leader answers "no stream" for several seconds) before the task is handed
/// back for redelivery. Meanwhile the delivery is kept by progress acks: the work is done, and
/// giving it back at once would run it again and use up its deliveries within the election.
const RESULT_PATIENCE: Duration = Duration::from_secs(30);

/// [`publish_result`], sent again after a failure for up to [`RESULT_PATIENCE`]: the result's
/// `Nats-Msg-Id` is its task's, so a result stored the first time is not stored twice.
async fn publish_result_patiently(
    shared: &Shared,
    delivery: &Delivery<TaskMessage>,
    result: &TaskResult,
) -> hermes_core::Result<hermes_core::PublishOutcome> {
    let deadline = tokio::time::Instant::now() + RESULT_PATIENCE;
    let mut pause = Duration::from_millis(100);
    loop {
        match publish_result(shared, delivery, result).await {
            Ok(outcome) => return Ok(outcome),
            Err(e) if tokio::time::Instant::now() + pause < deadline => {
                warn!(error = %e, "cannot publish the result; sending it again");
                tokio::time::sleep(pause).await;
                let _ = delivery.progress().await;
                pause = (pause * 2).min(Duration::from_secs(2)).min(shared.ack_wait / 2);
            }
            Err(e) => return Err(e),
        }
    }
}

/// Publishes a task's result on its goal's result subject, deduplicated by task id, in the
/// task's trace.
async fn publish_result(
    shared: &Shared,
    delivery: &Delivery<TaskMessage>,
    result: &TaskResult,
) -> hermes_core::Result<hermes_core::PublishOutcome> {
    let task = &delivery.message;
    let subject = shared.bus.topology().result(&task.goal_id);
    let trace = hermes_core::trace::propagate(delivery.trace.as_ref());
    // The attempt's token proves the result comes from a holder of the task's delivery.
    let routed = delivery.subject().starts_with(&shared.bus.topology().direct_task(&shared.agent_id, ""));
    let result = TaskResult {
        result_token: task.result_token.clone(),
        routed,
        task_type: task.task_type.clone(),
        ..result.clone()
    };
    shared.bus.publish(subject, &result, &format!("result:{}", task.task_id), trace.as_ref()).await
}

/// Crashes with one node in flight after which its task is quarantined.
pub const CRASH_QUARANTINE_DEATHS: u32 = 2;

/// What the crash marker of a delivery says.
enum Crashes {
    /// Run the task: its node has no marker, or one counting fewer than
    /// [`CRASH_QUARANTINE_DEATHS`] crashes (cleared once the task has run).
    Counted(Option<u32>),
    /// The node crashed its process this many times: dead-letter it instead of running it.
    Quarantine(u32),
}

/// The crash marker's key: one per node, across attempts, in the ledger bucket.
fn crash_key(task: &TaskMessage) -> String {
    format!("{}{}.{}", hermes_core::ledger::CRASH_MARKER_PREFIX, task.goal_id, task.node_id)
}

/// What the supervisor is told a task is: its crash marker's key, then (for an agent's own
/// identity, which reaches the ledger only with it) the task's token after a space.
fn supervised_key(task: &TaskMessage) -> String {
    match task.memory_token.is_empty() {
        true => crash_key(task),
        false => format!("{} {}", crash_key(task), task.memory_token),
    }
}

/// The crashes counted on a task's node so far. A node's crash marker `{crashes, node}` exists
/// only once a process crashed while running it: the crash supervisor knows what its worker
/// process runs without a write to the bus (see [`supervise`]), and the next process counts one
/// crash on each task it had in flight ([`count_crashes`]). Only a redelivery or a later attempt
/// can find one, so it is read only for those (not for a [`first_delivery`]).
async fn crash_marker(shared: &Shared, delivery: &Delivery<TaskMessage>) -> Crashes {
    let task = &delivery.message;
    match shared.bus.task_ledger(&task.memory_token).get(&crash_key(task)).await {
        Ok(Some(bytes)) => match marker_crashes(&bytes) {
            crashes if crashes >= CRASH_QUARANTINE_DEATHS => Crashes::Quarantine(crashes),
            crashes => Crashes::Counted(Some(crashes)),
        },
        Ok(None) => Crashes::Counted(None),
        Err(e) => {
            warn!(error = %e, "cannot read the crash marker");
            Crashes::Counted(None)
        }
    }
}

/// Whether this is the first delivery of a task's first attempt, which no crash can have marked.
fn first_delivery(delivery: &Delivery<TaskMessage>) -> bool {
    delivery.delivered() == 1 && delivery.message.attempt <= 1
}

/// The crashes a marker counts (a marker any agent wrote: `{"crashes": n, ...}`).
fn marker_crashes(bytes: &[u8]) -> u32 {
    let marker: serde_json::Value = serde_json::from_slice(bytes).unwrap_or_default();
    marker.get("crashes").and_then(serde_json::Value::as_u64).unwrap_or(0) as u32
}

/// Counts one crash on each task in `keys`, the crash markers of the tasks the previous process
/// had in flight when it crashed. Called by the first agent of a process whose supervisor handed
/// it such keys, before it takes any task.
pub async fn count_crashes(bus: &Bus, keys: &[String]) -> Result<usize, Error> {
    let mut counted = 0;
    for told in keys {
        let (key, token) = told.split_once(' ').unwrap_or((told, ""));
        let store = bus.task_ledger(token);
        let Some(node) = key.strip_prefix(hermes_core::ledger::CRASH_MARKER_PREFIX) else {
            warn!(key = %key, "the supervisor handed over a key that is not a crash marker");
            continue;
        };
        let written = match store.entry(key).await {
            Ok(entry) => {
                let live = entry.filter(|e| e.live);
                let crashes = live.as_ref().map_or(0, |e| marker_crashes(&e.value)) + 1;
                let marker = serde_json::json!({"crashes": crashes, "node": node}).to_string().into();
                match live {
                    Some(entry) => store.replace(key, marker, entry.revision).await,
                    None => store.put(key, marker).await,
                }
                .map(|()| crashes)
            }
            Err(e) => Err(e),
        };
        match written {
            Ok(crashes) => {
                counted += 1;
                warn!(key = %key, crashes, event = "crash_counted", "a task was in flight when its process crashed");
            }
            Err(e) => warn!(key = %key, error = %e, "cannot count a crash"),
        }
    }
    Ok(counted)
}

/// Clears the marker once the task ran to an outcome, without waiting: a lost clear costs at
/// most one miscounted death on a later redelivery.
fn clear_crash_marker(shared: &Shared, task: &TaskMessage) {
    let store = shared.bus.task_ledger(&task.memory_token);
    let key = crash_key(task);
    tokio::spawn(async move {
        if let Err(e) = store.remove(&key).await {
            warn!(error = %e, key, "cannot clear the crash marker");
        }
    });
}

/// Moves a task that crashed its consumer to the DLQ and fails its node with `POISON_MESSAGE`, so
/// the agents serving its type stay up for every other goal.
async fn quarantine(shared: &Shared, delivery: &Delivery<TaskMessage>, deaths: u32) -> Handled {
    let task = &delivery.message;
    let reason = format!(
        "crashed its consumer: task {} was in flight when {deaths} agent processes died",
        task.task_id
    );
    warn!(deaths, event = "task_quarantined", "{reason}; moving it to the dlq");
    let mut error = hermes_core::error::wire_error(ErrorCode::PoisonMessage, reason.clone());
    error.node_id = task.node_id.clone();
    let result = TaskResult {
        goal_id: task.goal_id.clone(),
        node_id: task.node_id.clone(),
        task_id: task.task_id.clone(),
        attempt: task.attempt,
        agent_id: shared.agent_id.clone(),
        started_unix_ms: now_unix_ms(),
        status: TaskStatus::Failed as i32,
        error: Some(error),
        ..Default::default()
    };
    if let Err(e) = publish_result_patiently(shared, delivery, &result).await {
        warn!(error = %e, "cannot publish the quarantined task's result; asking for redelivery");
        return Handled::Retry { after: Duration::from_secs(1) };
    }
    let _ = shared.bus.task_ledger(&task.memory_token).remove(&crash_key(task)).await;
    Handled::Reject { reason }
}

/// Cancels the running tasks of goals a dispatcher cancelled.
async fn cancel_loop(shared: Arc<Shared>, shutdown: CancellationToken) {
    let subject = shared.bus.topology().all_cancels();
    let mut cancels = match shared.bus.client().subscribe(subject).await {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot subscribe to cancellations; cancelled goals' tasks will run to the end");
            return;
        }
    };
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => return,
            msg = cancels.next() => match msg { Some(msg) => msg, None => return },
        };
        let Some(goal_id) = msg.subject.rsplit('.').next() else { continue };
        let running = shared.running.lock().unwrap_or_else(|p| p.into_inner());
        for (task_id, (goal, token)) in running.iter() {
            if goal == goal_id {
                info!(goal_id, task_id, event = "task_cancelled", "goal cancelled; abandoning its task");
                token.cancel();
            }
        }
    }
}

/// Runs the task's tool while sending progress acks, so AckWait never expires under a live agent.
async fn run_with_progress(shared: &Shared, delivery: &Delivery<TaskMessage>) -> TaskResult {
    let task = &delivery.message;
    let cancel = CancellationToken::new();
    shared
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(task.task_id.clone(), (task.goal_id.clone(), cancel.clone()));
    let result = run_cancellable(shared, delivery, &cancel).await;
    shared.running.lock().unwrap_or_else(|p| p.into_inner()).remove(&task.task_id);
    result
}

async fn run_cancellable(
    shared: &Shared,
    delivery: &Delivery<TaskMessage>,
    cancel: &CancellationToken,
) -> TaskResult {
    let task = &delivery.message;
    let started = Instant::now();
    let started_unix_ms = now_unix_ms();
    let tokens = Arc::new(tool::TokenMeter::default());
    let outcome = if task.deadline_unix_ms != 0 && started_unix_ms >= task.deadline_unix_ms {
        Err(ToolError {
            code: ErrorCode::Timeout,
            message: "the task's deadline passed before it started".into(),
        })
    } else {
        let work = run_tool(shared, task, cancel.clone(), tokens.clone());
        tokio::pin!(work);
        // Not `interval` with its immediate first tick: that tick waits for the timer wheel
        // (about 1 ms), which would be added to every task.
        let period = shared.ack_wait / 3;
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        loop {
            tokio::select! {
                result = &mut work => break result,
                _ = cancel.cancelled() => break Err(ToolError {
                    code: ErrorCode::Cancelled,
                    message: "the goal was cancelled".into(),
                }),
                _ = ticker.tick() => {
                    if let Err(e) = delivery.progress().await {
                        warn!(error = %e, "progress ack failed");
                    }
                }
            }
        }
    };
    let elapsed_ms = started.elapsed().as_millis() as u64;
    let mut result = TaskResult {
        goal_id: task.goal_id.clone(),
        node_id: task.node_id.clone(),
        task_id: task.task_id.clone(),
        attempt: task.attempt,
        elapsed_ms,
        agent_id: shared.agent_id.clone(),
        started_unix_ms,
        // Failed and cancelled attempts spent their tokens too.
        tokens: tokens.usage(),
        ..Default::default()
    };
    let artifacts = shared.bus.task_artifacts(&task.memory_token);
    match outcome {
        Ok((output, hit)) => {
            match artifacts.offload_json(output.to_string(), &task.goal_id, &task.tenant).await {
                // Over the inline limit the output travels as an artifact and the result carries
                // its stub (reference, size, preview).
                Ok((output_json, reference)) => {
                    result.status = TaskStatus::Succeeded as i32;
                    result.output_json = output_json;
                    result.memory_ref = reference.unwrap_or_default();
                    result.cached = hit.is_some();
                    result.cached_age_ms = hit.map_or(0, |h| h.age.as_millis() as u64);
                }
                Err(e) => {
                    result.status = TaskStatus::Failed as i32;
                    let error = ToolError {
                        code: ErrorCode::Unavailable,
                        message: format!("cannot store the large output: {e}"),
                    };
                    let mut error = error.to_proto();
                    error.node_id = task.node_id.clone();
                    result.error = Some(error);
                }
            }
        }
        Err(e) => {
            result.status = TaskStatus::Failed as i32;
            let mut error = e.to_proto();
            error.node_id = task.node_id.clone();
            result.error = Some(error);
        }
    }
    result
}

async fn run_tool(
    shared: &Shared,
    task: &TaskMessage,
    cancel: CancellationToken,
    tokens: Arc<tool::TokenMeter>,
) -> Result<(serde_json::Value, Option<cache::CacheHit>), ToolError> {
    let args: serde_json::Value = if task.inputs_json.trim().is_empty() {
        serde_json::Value::Object(Default::default())
    } else {
        serde_json::from_str(&task.inputs_json)
            .map_err(|e| ToolError::invalid_argument(format!("inputs are not valid JSON: {e}")))?
    };
    // Inputs that reference artifacts (large outputs of other nodes) get their content here.
    // Only the goal's own artifacts resolve, and the total is bounded before anything is loaded.
    let max = hermes_core::artifacts::MAX_RESOLVED_INPUT_BYTES;
    let args =
        shared.bus.task_artifacts(&task.memory_token).resolve_value(args, &task.goal_id, max).await.map_err(
            |e| ToolError {
                code: match e.code() {
                    code @ (ErrorCode::InvalidArgument | ErrorCode::NotFound | ErrorCode::Denied) => code,
                    _ => ErrorCode::Unavailable,
                },
                message: format!("cannot resolve the inputs' artifacts: {e}"),
            },
        )?;
    info!(event = "tool_called", tool = %task.task_type, "tool called");
    let ctx = ToolContext {
        workspace: shared.workspace.clone(),
        task: Some(tool::TaskScope {
            bus: shared.bus.clone(),
            goal_id: task.goal_id.clone(),
            node_id: task.node_id.clone(),
            attempt: task.attempt,
            task_id: task.task_id.clone(),
            result_token: task.result_token.clone(),
            tenant: task.tenant.clone(),
            memory_token: task.memory_token.clone(),
            agent_id: shared.agent_id.clone(),
            calls: Default::default(),
            approval_timeout: shared.approval_timeout,
            cancel,
            tokens,
        }),
    };
    // The task's model calls wait for the fleet's limits on the goal's tenant's behalf, until
    // the task's deadline, and say so on the goal's events.
    let calls = hermes_llm::governor::CallScope {
        tenant: task.tenant.clone(),
        deadline: (task.deadline_unix_ms != 0).then(|| {
            Instant::now() + Duration::from_millis(task.deadline_unix_ms.saturating_sub(now_unix_ms()))
        }),
        observer: ctx.task.clone().map(|scope| {
            Arc::new(approval::WaitReporter(scope)) as Arc<dyn hermes_llm::governor::WaitObserver>
        }),
    };
    let (result, hit) =
        hermes_llm::governor::scoped(calls, shared.registry.call_reporting(&task.task_type, args, &ctx))
            .await;
    info!(event = "tool_result_received", tool = %task.task_type, ok = result.is_ok(), cached = hit.is_some(), "tool returned");
    result.map(|output| (output, hit))
}

/// Publishes a heartbeat on `subject`; a failure is logged (the next beat tries again).
async fn publish_beat(bus: &Bus, subject: &str, heartbeat: &AgentHeartbeat) {
    if let Err(e) = bus.client().publish(subject.to_owned(), heartbeat.encode_to_vec().into()).await {
        warn!(error = %e, "heartbeat publish failed");
    }
}

async fn heartbeat_loop(
    shared: Arc<Shared>,
    config: AgentConfig,
    started_unix_ms: u64,
    shutdown: CancellationToken,
    drained: CancellationToken,
) {
    let topology = shared.bus.topology().clone();
    let subject = topology.heartbeat(&config.agent_id);
    let beat = |draining: bool, deregister: bool| {
        let stats = shared.stats.lock().map(|s| *s).unwrap_or_default();
        AgentHeartbeat {
            agent_id: config.agent_id.clone(),
            pool: config.pool.clone(),
            task_types: shared.registry.names().map(str::to_owned).collect(),
            tools: shared.registry.specs(),
            tags: config.tags.clone(),
            in_flight: shared.in_flight.load(Ordering::Relaxed),
            max_concurrency: config.max_concurrency,
            model: config.model.clone(),
            version: env!("CARGO_PKG_VERSION").to_owned(),
            started_unix_ms,
            success_rate: stats.success_rate,
            latency_ms: stats.latency_ms,
            sent_unix_ms: now_unix_ms(),
            deregister,
            draining,
            heartbeat_period_ms: config.heartbeat_interval.as_millis() as u64,
            backlogged: shared.backlogged.load(Ordering::Relaxed),
        }
    };
    let mut ticker = tokio::time::interval(config.heartbeat_interval);
    // The KV mirror is written beside the heartbeat, never in its way: a put waits for
    // JetStream's ack (seconds while a restarted server recovers its store), and heartbeats held
    // up behind it made the registry declare a live agent offline, again and again. One mirror
    // write at a time; a beat whose mirror is still being written is not mirrored.
    let mut mirror: Option<tokio::task::JoinHandle<()>> = None;
    let mut early_beat = Instant::now();
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            // Pooled work began to wait here: say so now rather than at the next tick, so routing
            // stops sending this agent directed work that would pass the lanes by. At most one
            // such beat a second.
            _ = shared.backlog_rose.notified(), if early_beat.elapsed() >= Duration::from_secs(1) => {
                early_beat = Instant::now();
                publish_beat(&shared.bus, &subject, &beat(false, false)).await;
            }
            _ = ticker.tick() => {
                let hb = beat(false, false);
                publish_beat(&shared.bus, &subject, &hb).await;
                if mirror.as_ref().is_none_or(|m| m.is_finished()) {
                    let (bus, agent_id) = (shared.bus.clone(), config.agent_id.clone());
                    mirror = Some(tokio::spawn(async move {
                        if let Err(e) = bus.agents().mirror(&agent_id, &hb).await {
                            warn!(error = %e, "heartbeat mirror to kv failed");
                        }
                    }));
                }
            }
        }
    }
    // The last mirror write goes first, so it cannot land after the draining entry.
    if let Some(mut mirror) = mirror
        && tokio::time::timeout(Duration::from_secs(5), &mut mirror).await.is_err()
    {
        mirror.abort();
    }
    // Stop receiving new work at once, finish what is in flight, then leave.
    let draining = beat(true, false);
    let _ = shared.bus.client().publish(subject.clone(), draining.encode_to_vec().into()).await;
    let _ = shared.bus.agents().mirror(&config.agent_id, &draining).await;
    let _ = shared.bus.client().flush().await;
    info!(agent = %config.agent_id, event = "agent_draining", "agent draining");
    drained.cancelled().await;
    let bye = beat(false, true).encode_to_vec();
    let _ = shared.bus.client().publish(subject, bye.into()).await;
    let _ = shared.bus.agents().remove(&config.agent_id).await;
    let _ = shared.bus.client().flush().await;
    info!(agent = %config.agent_id, event = "agent_deregistered", "agent deregistered");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future `f` returns, without calling it.
    fn future_bytes<'a, F>(_: impl FnOnce(&'a Shared, &'a Delivery<TaskMessage>) -> F) -> usize {
        std::mem::size_of::<F>()
    }

    /// Every task's future is allocated and moved at its full size (see [`handle_task`]). With
    /// the rare paths inlined it was 33.8 KB in this (debug) build and 32.5 KB in a release one;
    /// boxed, 5.5 KB and 4.6 KB. Sequential states share their bytes, so one small path inlined
    /// adds only what it has over the others; the bound leaves room for that and a compiler's
    /// drift, and fails when the future grows back toward what it was.
    #[test]
    fn a_tasks_future_stays_small() {
        let bytes = future_bytes(handle_task);
        assert!(
            bytes <= 8 * 1024,
            "an agent task's future is {bytes} bytes: box the await of a path few tasks take (handle_task's rustdoc)"
        );
    }
}
