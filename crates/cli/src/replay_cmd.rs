//! `hermes replay <goal>`: runs a finished goal again in a fresh stack in this process, its own
//! nats-server included, with the goal's recorded model exchanges served in place of a model
//! (`hermes_llm::record::ReplayModel`), so no model or key is needed. Then it compares the new
//! run with the old: the plan, each node's inputs (its `$ref`s resolved) and output, the final
//! output and status. A model request with no matching record (a prompt changed) is the first
//! divergence, named by the message that differs, never answered. With `--tools recorded`, the
//! calls of tools with side effects or that reach the network are answered from the record too
//! (`RecordedTools`), so nothing they did happens again. Outputs kept as artifacts are read
//! (`GetGoalArtifact`) and compared, and served, by content: artifact references are new in each
//! run. Exit 0: the same; 1: a divergence
//! (docs/evaluation.md).

use std::collections::{HashMap, VecDeque};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, bail};
use hermes_executor::tool::{ToolError, ToolPlayback};
use hermes_llm::record::{LiveModel, ReplayModel};
use hermes_proto::{Goal, GoalSpec, ListModelExchangesRequest, SubmitGoalRequest, ToolExchange};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::api_client::Client;
use crate::stack::{Stack, StackConfig};

/// Where a replay's tool calls are answered from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Tools {
    /// Every tool runs again.
    Live,
    /// Tools with side effects or that reach the network, and task types the replay's agent
    /// lacks, answer from the record.
    Recorded,
}

/// How a replay runs: where its tools and model answers come from, and in which stack.
pub struct Options {
    /// The replay's agents' workspace (in a fresh stack).
    pub workspace: std::path::PathBuf,
    pub tools: Tools,
    /// `--model live`: this model answers, and each answer is compared with the record.
    pub live_model: Option<Arc<dyn hermes_llm::ChatModel>>,
}

/// Replays `goal_id` of the stack `original` talks to, in a fresh stack, or with `against` in
/// that running stack (whose own model and tools answer); prints the comparison and returns the
/// exit code.
pub async fn run(
    original: &mut Client,
    goal_id: &str,
    options: &Options,
    against: Option<&mut Client>,
) -> anyhow::Result<i32> {
    let mut old = crate::api_client::get_goal(original, goal_id).await?;
    if !hermes_dispatcher::engine::is_terminal(old.status) {
        bail!(
            "goal {goal_id} has not finished ({}): replay a finished goal",
            crate::api_client::status_word(old.status)
        );
    }
    if old.text.is_empty() && old.plan.is_none() {
        bail!("goal {goal_id} has neither text nor a plan to run again");
    }
    if let Some(stack) = against {
        println!("replaying {goal_id} in the named stack, with its own model and tools");
        warn_unread(inline_artifacts(&mut old, &mut [], original).await);
        let mut new = replay_on(stack, &old).await?;
        warn_unread(inline_artifacts(&mut new, &mut [], stack).await);
        return Ok(report(Vec::new(), &old, &new, "the named stack's model and tools answered".into()));
    }
    let records = original
        .list_model_exchanges(ListModelExchangesRequest { goal_id: goal_id.to_owned() })
        .await
        .map_err(|s| anyhow::anyhow!("cannot read the records of {goal_id}: {}", s.message()))?
        .into_inner();
    let exchanges = records.exchanges;
    let mut recorded_tools = records.tool_exchanges;
    warn_unread(inline_artifacts(&mut old, &mut recorded_tools, original).await);
    let recorded = options.tools == Tools::Recorded;
    println!(
        "replaying {goal_id} ({}, {} recorded model exchanges, {} recorded agent tool calls) in a fresh stack; {}{}",
        if old.text.is_empty() { "a plan" } else { "a text goal" },
        exchanges.len(),
        recorded_tools.len(),
        if options.live_model.is_some() {
            "the live model answers"
        } else {
            "the record answers the model's part"
        },
        if recorded { ", and the tools with side effects" } else { "" }
    );
    let playback = || recorded.then(|| Arc::new(RecordedTools::new(&old, &recorded_tools)));
    let answerer = || match &options.live_model {
        Some(live) => Answerer::Live(Arc::new(LiveModel::new(live.clone(), exchanges.clone()))),
        None => Answerer::Record(Arc::new(ReplayModel::new(exchanges.clone()))),
    };
    let workspace = &options.workspace;
    let workspace = workspace.canonicalize().with_context(|| format!("workspace {}", workspace.display()))?;
    // The planner's prompt lists the task types the agents offer, and agents with a model also
    // offer `agent.run` and `text.summarize`. Records of agent loops or model tools say the
    // agents had a model; otherwise it is not recorded, so a replay whose first plan request
    // differs in its system message (the catalogue) is tried once more with the other kind.
    let agent_model = exchanges.iter().any(|e| !e.node_id.is_empty());
    let summarizer = exchanges.iter().any(|e| e.purpose == "summary");
    let once = |agent_model| replay_once(&old, answerer(), &workspace, agent_model, summarizer, playback());
    let mut attempt = once(agent_model).await?;
    if attempt.catalogue_differs() {
        let other = once(!agent_model).await?;
        if !other.catalogue_differs() {
            println!(
                "(the recorded planner saw agents {} a model: replayed with agents like that)",
                if agent_model { "without" } else { "with" }
            );
            attempt = other;
        }
    }
    let Attempt { goal: new, mut divergences, unused, served } = attempt;
    if divergences.is_empty() && !unused.is_empty() {
        divergences.push(format!(
            "the new run made fewer model calls: {} recorded ({}) were never asked for",
            unused.len(),
            unused.iter().map(|e| e.purpose.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    let mut answered = match &options.live_model {
        Some(_) => format!("{} recorded model exchanges compared with the live model's", exchanges.len()),
        None => format!("{} model exchanges served from the record", exchanges.len()),
    };
    if let Some(served) = served {
        answered.push_str(&format!(", {served} tool calls served from the record"));
    }
    Ok(report(divergences, &old, &new, answered))
}

/// Prints what differs (the model's and tools' divergences first, then the runs' comparison)
/// and returns the exit code.
fn report(mut divergences: Vec<String>, old: &Goal, new: &Goal, answered: String) -> i32 {
    divergences.extend(compare(old, new));
    if divergences.is_empty() {
        let nodes = new.plan.as_ref().map(|p| p.nodes.len()).unwrap_or_default();
        println!(
            "no divergence: the same plan ({nodes} nodes), node inputs and outputs, final output and status; {answered} (replayed as {})",
            new.goal_id
        );
        return 0;
    }
    println!("{} divergences; the first: {}", divergences.len(), divergences[0]);
    for d in &divergences[1..] {
        println!("  - {d}");
    }
    1
}

/// What answers a replay's model requests: the record, or a live model compared with it.
enum Answerer {
    Record(Arc<ReplayModel>),
    Live(Arc<LiveModel>),
}

impl Answerer {
    fn model(&self) -> Arc<dyn hermes_llm::ChatModel> {
        match self {
            Answerer::Record(m) => m.clone(),
            Answerer::Live(m) => m.clone(),
        }
    }

    fn divergences(&self) -> Vec<String> {
        match self {
            Answerer::Record(m) => m.divergences(),
            Answerer::Live(m) => m.divergences(),
        }
    }

    fn unused(&self) -> Vec<hermes_proto::ModelExchange> {
        match self {
            Answerer::Record(m) => m.unused(),
            Answerer::Live(m) => m.unused(),
        }
    }
}

/// One replay: the new goal, the model requests and tool calls no record matched, the records
/// never used, and how many tool calls the record answered (with `--tools recorded`).
struct Attempt {
    goal: Goal,
    divergences: Vec<String>,
    unused: Vec<hermes_proto::ModelExchange>,
    served: Option<usize>,
}

impl Attempt {
    fn catalogue_differs(&self) -> bool {
        self.divergences
            .first()
            .is_some_and(|d| d.contains("(plan) does not match its record: its message 1 (system)"))
    }
}

/// Runs the goal once in a fresh stack of its own (a nats-server, one agent in `workspace`, with
/// the answerer's model when `agent_model`, and that model as planner, and as summarizer when the
/// recorded run had one).
async fn replay_once(
    old: &Goal,
    answerer: Answerer,
    workspace: &Path,
    agent_model: bool,
    summarizer: bool,
    playback: Option<Arc<RecordedTools>>,
) -> anyhow::Result<Attempt> {
    let data = tempfile::tempdir().context("a data dir for the replay's nats-server")?;
    let nats = crate::nats::start_local(&data.path().join("nats"), None).await?;
    let mut agent = hermes_executor::AgentConfig::new("replay-1", workspace.to_path_buf());
    agent.max_concurrency = 16;
    if agent_model {
        agent.llm = Some(hermes_executor::agent_loop::AgentModel(answerer.model()));
    }
    agent.playback = playback.clone().map(|p| p as Arc<dyn ToolPlayback>);
    let text_goal = !old.text.is_empty();
    let dispatcher = hermes_dispatcher::DispatcherConfig {
        grpc_listen: "127.0.0.1:0".parse()?,
        planner: text_goal,
        summarizer: summarizer.then(|| hermes_dispatcher::Summarizer(answerer.model())),
        ..Default::default()
    };
    let config = StackConfig {
        nats_url: nats.url.clone(),
        registry: Default::default(),
        agents: vec![agent],
        dispatcher,
        planner: text_goal.then(|| hermes_planner::PlannerConfig::new(answerer.model())),
        memory: None,
        users: None,
    };
    let shutdown = CancellationToken::new();
    let stack = Stack::start(config, shutdown.clone()).await.context("cannot start the replay's stack")?;
    let outcome = async {
        let channel = tonic::transport::Endpoint::from_shared(stack.grpc_url())?
            .connect()
            .await
            .map_err(|e| anyhow::anyhow!("cannot reach the replay's stack: {e}"))?;
        let mut client = crate::api_client::client(channel, Default::default());
        let mut new = replay_on(&mut client, old).await?;
        warn_unread(inline_artifacts(&mut new, &mut [], &mut client).await);
        Ok::<_, anyhow::Error>(new)
    }
    .await;
    stack.stop().await;
    drop(nats);
    let mut divergences = answerer.divergences();
    let mut served = None;
    if let Some(playback) = &playback {
        divergences.extend(playback.divergences());
        served = Some(playback.served());
    }
    Ok(Attempt { goal: outcome?, divergences, unused: answerer.unused(), served })
}

/// The recorded outcomes of a goal's tool calls, served in place of the tools with
/// `--tools recorded`: each plain node's output (from its events) under its task type and
/// resolved inputs, and each agent-loop call (from its `ToolExchange`) under its tool and
/// arguments. A call is served the first unused outcome recorded in the same node for the same
/// tool and arguments; a call with none fails and is reported as a divergence.
#[derive(Debug)]
pub struct RecordedTools {
    outcomes: Mutex<HashMap<(String, String, String), VecDeque<Recorded>>>,
    /// The plain nodes' task types, which the replay's agent serves from the record when it
    /// lacks them.
    task_types: Vec<String>,
    divergences: Mutex<Vec<String>>,
    served: std::sync::atomic::AtomicUsize,
}

#[derive(Debug)]
enum Recorded {
    Output(Value),
    Failed(ToolError),
    /// Kept as an artifact that could not be read (see [`inline_artifacts`]).
    Artifact(String),
}

impl RecordedTools {
    pub fn new(old: &Goal, calls: &[ToolExchange]) -> RecordedTools {
        let digest = hermes_executor::record::arguments_digest;
        let mut outcomes: HashMap<_, VecDeque<Recorded>> = HashMap::new();
        let inputs = resolved_inputs(old);
        let task_types: HashMap<&str, &str> =
            old.plan.iter().flat_map(|p| &p.nodes).map(|n| (n.id.as_str(), n.task_type.as_str())).collect();
        for node in &old.nodes {
            let (Some(args), Some(task_type)) =
                (inputs.get(&node.node_id), task_types.get(node.node_id.as_str()))
            else {
                continue;
            };
            let outcome = if !node.memory_ref.is_empty() {
                Recorded::Artifact(node.memory_ref.clone())
            } else if let Some(error) = &node.error {
                Recorded::Failed(failure(error))
            } else if !node.output_json.is_empty() {
                Recorded::Output(json(&node.output_json))
            } else {
                continue;
            };
            let key = (node.node_id.clone(), (*task_type).to_owned(), digest(args));
            outcomes.entry(key).or_default().push_back(outcome);
        }
        for call in calls {
            let outcome = match (&call.error, call.output_ref.is_empty()) {
                (Some(error), _) => Recorded::Failed(failure(error)),
                (None, false) => Recorded::Artifact(call.output_ref.clone()),
                (None, true) => Recorded::Output(json(&call.output_json)),
            };
            let key = (call.node_id.clone(), call.tool.clone(), call.arguments_digest.clone());
            outcomes.entry(key).or_default().push_back(outcome);
        }
        let mut task_types: Vec<String> = task_types.values().map(|t| (*t).to_owned()).collect();
        task_types.sort();
        task_types.dedup();
        RecordedTools {
            outcomes: Mutex::new(outcomes),
            task_types,
            divergences: Mutex::default(),
            served: Default::default(),
        }
    }

    /// The calls no record answered, in words, in the order they were made.
    pub fn divergences(&self) -> Vec<String> {
        self.divergences.lock().map(|d| d.clone()).unwrap_or_default()
    }

    /// How many calls the record answered.
    pub fn served(&self) -> usize {
        self.served.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn diverged(&self, what: String) -> ToolError {
        if let Ok(mut divergences) = self.divergences.lock() {
            divergences.push(what.clone());
        }
        ToolError { code: hermes_core::ErrorCode::FailedPrecondition, message: format!("replay: {what}") }
    }
}

fn failure(error: &hermes_proto::Error) -> ToolError {
    ToolError {
        code: hermes_core::ErrorCode::parse(&error.code).unwrap_or(hermes_core::ErrorCode::ToolError),
        message: error.message.clone(),
    }
}

impl ToolPlayback for RecordedTools {
    fn answer(&self, node_id: &str, tool: &str, args: &Value) -> Result<Value, ToolError> {
        let key = (node_id.to_owned(), tool.to_owned(), hermes_executor::record::arguments_digest(args));
        let next = self.outcomes.lock().ok().and_then(|mut o| o.get_mut(&key).and_then(VecDeque::pop_front));
        let outcome = match next {
            None => {
                return Err(self.diverged(format!(
                    "tool `{tool}` in node `{node_id}` was called with arguments no record holds: {}",
                    short(args)
                )));
            }
            Some(Recorded::Artifact(reference)) => {
                return Err(self.diverged(format!(
                    "the recorded output of `{tool}` in node `{node_id}` is the artifact {reference}, which could not be read"
                )));
            }
            Some(Recorded::Output(output)) => Ok(output),
            Some(Recorded::Failed(error)) => Err(error),
        };
        self.served.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        outcome
    }

    fn task_types(&self) -> Vec<String> {
        self.task_types.clone()
    }
}

/// Puts the content of the artifacts that `goal`'s outputs and the recorded tool `calls` name in
/// place of their stubs and references, read from the `stack` that ran it. An artifact's
/// reference is new in each run, so only by content do two runs compare, and does the record
/// answer the calls a replay makes (whose arguments hold content: agents resolve stubs before a
/// tool runs). An output whose artifact cannot be read keeps its stub; those artifacts are
/// returned, each with the reason.
async fn inline_artifacts(goal: &mut Goal, calls: &mut [ToolExchange], stack: &mut Client) -> Vec<String> {
    use hermes_core::artifacts::stub_references;
    let mut references: Vec<String> = goal
        .nodes
        .iter()
        .map(|n| n.output_json.as_str())
        .chain([goal.output_json.as_str()])
        .filter(|text| !text.is_empty())
        .flat_map(|text| stub_references(&json(text)))
        .chain(calls.iter().filter(|c| !c.output_ref.is_empty()).map(|c| c.output_ref.clone()))
        .collect();
    references.sort();
    references.dedup();
    let goal_id = goal.goal_id.clone();
    let (loaded, unread) = crate::api_client::load_goal_artifacts(stack, &goal_id, references).await;
    for node in &mut goal.nodes {
        if let Some(text) = inlined(&node.output_json, &loaded) {
            node.output_json = text;
            node.memory_ref.clear();
        }
    }
    if let Some(text) = inlined(&goal.output_json, &loaded) {
        goal.output_json = text;
    }
    for call in calls {
        if let Some(content) = loaded.get(&call.output_ref) {
            call.output_json = content.to_string();
            call.output_ref.clear();
        }
    }
    unread
}

/// `text` with its stubs replaced by the `loaded` content, when it has stubs and each loaded.
fn inlined(text: &str, loaded: &HashMap<String, Value>) -> Option<String> {
    if text.is_empty() {
        return None;
    }
    let value = json(text);
    let references = hermes_core::artifacts::stub_references(&value);
    if references.is_empty() || !references.iter().all(|r| loaded.contains_key(r)) {
        return None;
    }
    hermes_core::artifacts::substitute_stubs(value, loaded).ok().map(|v| v.to_string())
}

/// Says which artifacts could not be read: what they hold compares, and answers, by reference.
fn warn_unread(unread: Vec<String>) {
    if !unread.is_empty() {
        println!(
            "cannot read {} artifact(s), so the outputs they hold compare by reference: {}",
            unread.len(),
            unread.join("; ")
        );
    }
}

/// Submits the old goal's spec to a stack and returns the new goal once it ends.
async fn replay_on(client: &mut Client, old: &Goal) -> anyhow::Result<Goal> {
    let spec = GoalSpec {
        text: old.text.clone(),
        plan: if old.text.is_empty() { old.plan.clone() } else { None },
        max_tokens: old.max_tokens,
        max_cost_usd: old.max_cost_usd,
        timeout_ms: 300_000,
        ..Default::default()
    };
    let goal_id = client
        .submit_goal(SubmitGoalRequest { spec: Some(spec) })
        .await
        .map_err(|s| {
            let hint = if s.message().contains("unknown task type") {
                " (the replay's agent serves the built-in tools: answer the others from the record with `--tools recorded`, or run them with `--against` a stack that serves them)"
            } else {
                ""
            };
            anyhow::anyhow!("the replay's stack refused the goal: {}{hint}", s.message())
        })?
        .into_inner()
        .goal_id;
    crate::api_client::follow_to_end(client, &goal_id, Duration::from_secs(330)).await?;
    crate::api_client::get_goal(client, &goal_id).await
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.to_owned()))
}

/// A value quoted in a divergence: at most 240 characters.
fn short(value: &Value) -> String {
    hermes_core::text::clip(&value.to_string(), 240)
}

/// Each node's inputs with its `$ref`s resolved from the goal's outputs.
fn resolved_inputs(goal: &Goal) -> std::collections::BTreeMap<String, Value> {
    let outputs: std::collections::HashMap<&str, Value> = goal
        .nodes
        .iter()
        .filter(|n| !n.output_json.is_empty())
        .map(|n| (n.node_id.as_str(), json(&n.output_json)))
        .collect();
    goal.plan
        .iter()
        .flat_map(|p| &p.nodes)
        .map(|n| {
            let inputs = json(&n.inputs_json);
            let resolved =
                hermes_core::json_ref::resolve(&inputs, &|id| outputs.get(id).cloned()).unwrap_or(inputs);
            (n.id.clone(), resolved)
        })
        .collect()
}

/// What differs between the old run and the new, in words, plan first.
pub fn compare(old: &Goal, new: &Goal) -> Vec<String> {
    let mut out = Vec::new();
    let nodes = |g: &Goal| -> std::collections::BTreeMap<String, hermes_proto::TaskNode> {
        g.plan.iter().flat_map(|p| &p.nodes).map(|n| (n.id.clone(), n.clone())).collect()
    };
    let (was, now) = (nodes(old), nodes(new));
    for (id, a) in &was {
        match now.get(id) {
            None => out.push(format!("plan: node `{id}` ({}) is gone", a.task_type)),
            Some(b) => {
                if a.task_type != b.task_type {
                    out.push(format!("plan: node `{id}` was {}, is now {}", a.task_type, b.task_type));
                }
                if json(&a.inputs_json) != json(&b.inputs_json) {
                    out.push(format!(
                        "plan: node `{id}` inputs were {}, are now {}",
                        short(&json(&a.inputs_json)),
                        short(&json(&b.inputs_json))
                    ));
                }
                let (mut da, mut db) = (a.depends_on.clone(), b.depends_on.clone());
                da.sort();
                db.sort();
                if da != db {
                    out.push(format!("plan: node `{id}` depended on {da:?}, now on {db:?}"));
                }
            }
        }
    }
    for (id, b) in &now {
        if !was.contains_key(id) {
            out.push(format!("plan: node `{id}` ({}) is new", b.task_type));
        }
    }
    let (inputs_was, inputs_now) = (resolved_inputs(old), resolved_inputs(new));
    for old_node in &old.nodes {
        let id = &old_node.node_id;
        let Some(new_node) = new.nodes.iter().find(|n| &n.node_id == id) else { continue };
        if let (Some(a), Some(b)) = (inputs_was.get(id), inputs_now.get(id))
            && a != b
            && json(&was[id].inputs_json) == json(&now[id].inputs_json)
        {
            out.push(format!("node `{id}` inputs (after $refs) were {}, are now {}", short(a), short(b)));
        }
        if old_node.status != new_node.status {
            let why =
                new_node.error.as_ref().map(|e| format!(" ({} {})", e.code, e.message)).unwrap_or_default();
            out.push(format!(
                "node `{id}` was {}, is now {}{why}",
                node_status(old_node.status),
                node_status(new_node.status)
            ));
        }
        if json(&old_node.output_json) != json(&new_node.output_json) {
            out.push(format!(
                "node `{id}` output was {}, is now {}",
                short(&json(&old_node.output_json)),
                short(&json(&new_node.output_json))
            ));
        }
    }
    if old.status != new.status {
        out.push(format!(
            "the goal was {}, is now {}",
            crate::api_client::status_word(old.status),
            crate::api_client::status_word(new.status)
        ));
    }
    if json(&old.output_json) != json(&new.output_json) {
        out.push(format!(
            "the final output was {}, is now {}",
            short(&json(&old.output_json)),
            short(&json(&new.output_json))
        ));
    }
    out
}

fn node_status(status: i32) -> String {
    hermes_proto::NodeStatus::try_from(status)
        .map(|s| s.as_str_name().trim_start_matches("NODE_STATUS_").to_ascii_lowercase())
        .unwrap_or_else(|_| status.to_string())
}
