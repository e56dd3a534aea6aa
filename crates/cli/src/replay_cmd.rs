//! `hermes replay <goal>`: runs a finished goal again in a fresh stack in this process, its own
//! nats-server included, with the goal's recorded model exchanges served in place of a model
//! (`hermes_llm::record::ReplayModel`), so no model or key is needed. Then it compares the new
//! run with the old: the plan, each node's inputs (its `$ref`s resolved) and output, the final
//! output and status. A model request with no matching record (a prompt changed) is the first
//! divergence, named by the message that differs, never answered. Exit 0: the same; 1: a
//! divergence (docs/evaluation.md).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use hermes_llm::record::ReplayModel;
use hermes_proto::{Goal, GoalSpec, ListModelExchangesRequest, SubmitGoalRequest};
use serde_json::Value;
use tokio_util::sync::CancellationToken;

use crate::api_client::Client;
use crate::stack::{Stack, StackConfig};

/// Replays `goal_id` of the stack `original` talks to, with agents working in `workspace`;
/// prints the comparison and returns the exit code.
pub async fn run(original: &mut Client, goal_id: &str, workspace: &Path) -> anyhow::Result<i32> {
    let old = crate::api_client::get_goal(original, goal_id).await?;
    if !hermes_dispatcher::engine::is_terminal(old.status) {
        bail!(
            "goal {goal_id} has not finished ({}): replay a finished goal",
            crate::api_client::status_word(old.status)
        );
    }
    if old.text.is_empty() && old.plan.is_none() {
        bail!("goal {goal_id} has neither text nor a plan to run again");
    }
    let exchanges = original
        .list_model_exchanges(ListModelExchangesRequest { goal_id: goal_id.to_owned() })
        .await
        .map_err(|s| anyhow::anyhow!("cannot read the records of {goal_id}: {}", s.message()))?
        .into_inner()
        .exchanges;
    println!(
        "replaying {goal_id} ({}, {} recorded model exchanges) in a fresh stack",
        if old.text.is_empty() { "a plan" } else { "a text goal" },
        exchanges.len()
    );
    let workspace = workspace.canonicalize().with_context(|| format!("workspace {}", workspace.display()))?;
    // The planner's prompt lists the task types the agents offer, and agents with a model also
    // offer `agent.run` and `text.summarize`. Whether the recorded run's agents had one is not
    // recorded, so a replay whose first plan request differs in its system message (the
    // catalogue) is tried once more with the other kind of agent.
    let mut attempt = replay_once(&old, &exchanges, &workspace, false).await?;
    if attempt.catalogue_differs() {
        let other = replay_once(&old, &exchanges, &workspace, true).await?;
        if !other.catalogue_differs() {
            println!("(the recorded planner saw agents with a model: replayed with agents that have one)");
            attempt = other;
        }
    }
    let Attempt { goal: new, mut divergences, unused } = attempt;
    if divergences.is_empty() && !unused.is_empty() {
        divergences.push(format!(
            "the new run made fewer model calls: {} recorded ({}) were never asked for",
            unused.len(),
            unused.iter().map(|e| e.purpose.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    divergences.extend(compare(&old, &new));
    if divergences.is_empty() {
        let nodes = new.plan.as_ref().map(|p| p.nodes.len()).unwrap_or_default();
        println!(
            "no divergence: the same plan ({nodes} nodes), node inputs and outputs, final output and status; {} model exchanges served from the record (replayed as {})",
            exchanges.len(),
            new.goal_id
        );
        return Ok(0);
    }
    println!("{} divergences; the first: {}", divergences.len(), divergences[0]);
    for d in &divergences[1..] {
        println!("  - {d}");
    }
    Ok(1)
}

/// One replay: the new goal, the model requests no record matched, and the records never used.
struct Attempt {
    goal: Goal,
    divergences: Vec<String>,
    unused: Vec<hermes_proto::ModelExchange>,
}

impl Attempt {
    fn catalogue_differs(&self) -> bool {
        self.divergences
            .first()
            .is_some_and(|d| d.contains("(plan) does not match its record: its message 1 (system)"))
    }
}

/// Runs the goal once in a fresh stack of its own (a nats-server, one agent in `workspace`, with
/// the replay model when `agent_model`, and the replay model as planner and summarizer).
async fn replay_once(
    old: &Goal,
    exchanges: &[hermes_proto::ModelExchange],
    workspace: &Path,
    agent_model: bool,
) -> anyhow::Result<Attempt> {
    let model = Arc::new(ReplayModel::new(exchanges.to_vec()));
    let as_model = || model.clone() as Arc<dyn hermes_llm::ChatModel>;
    let data = tempfile::tempdir().context("a data dir for the replay's nats-server")?;
    let nats = crate::nats::start_local(&data.path().join("nats"), None).await?;
    let mut agent = hermes_executor::AgentConfig::new("replay-1", workspace.to_path_buf());
    agent.max_concurrency = 16;
    if agent_model {
        agent.llm = Some(hermes_executor::agent_loop::AgentModel(as_model()));
    }
    let text_goal = !old.text.is_empty();
    let dispatcher = hermes_dispatcher::DispatcherConfig {
        grpc_listen: "127.0.0.1:0".parse()?,
        planner: text_goal,
        summarizer: exchanges
            .iter()
            .any(|e| e.purpose == "summary")
            .then(|| hermes_dispatcher::Summarizer(as_model())),
        ..Default::default()
    };
    let config = StackConfig {
        nats_url: nats.url.clone(),
        registry: Default::default(),
        agents: vec![agent],
        dispatcher,
        planner: text_goal.then(|| hermes_planner::PlannerConfig::new(as_model())),
        memory: None,
    };
    let shutdown = CancellationToken::new();
    let stack = Stack::start(config, shutdown.clone()).await.context("cannot start the replay's stack")?;
    let outcome = replay_on(&stack, old).await;
    stack.stop().await;
    drop(nats);
    Ok(Attempt { goal: outcome?, divergences: model.divergences(), unused: model.unused() })
}

/// Submits the old goal's spec to the replay's stack and returns the new goal once it ends.
async fn replay_on(stack: &Stack, old: &Goal) -> anyhow::Result<Goal> {
    let channel = tonic::transport::Endpoint::from_shared(stack.grpc_url())?.connect().await?;
    let mut client = crate::api_client::client(channel, Default::default());
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
        .map_err(|s| anyhow::anyhow!("the replay's stack refused the goal: {}", s.message()))?
        .into_inner()
        .goal_id;
    crate::api_client::follow_to_end(&mut client, &goal_id, Duration::from_secs(330)).await?;
    crate::api_client::get_goal(&mut client, &goal_id).await
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
