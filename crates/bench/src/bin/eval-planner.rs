//! `make eval-planner`: how well a model plans real goals. For each model it plans every goal of
//! a goal set (`examples/eval/planner-goals.json`) through the planner's own loop
//! ([`hermes_planner::plan_with`]: the prompt, the answer reader, the corrections), runs each
//! accepted plan with the built-in tools over a copy of `examples/data`, and checks the goal's
//! expected properties: its task types, its dependencies, and the output node's value. It prints
//! one row per model:
//! - schema-valid: answers accepted (a valid plan, or needs-input) within the corrections;
//! - right: plans that have the expected task types and dependencies and whose output holds the
//!   expected value (or, for goals that cannot be done, a needs-input);
//! - corrections: re-asks needed in all;
//! - p50 plan: the median time to an accepted answer;
//! - tok/s: output tokens per second of planning time, corrections included.
//!
//!
//! Two more tables measure two of the design's claims (docs/evaluation.md):
//! - parse success of the planner's raw answers as they came and with JSON repair (every answer
//!   the model gave, corrections included);
//! - with `--direct`, plan-then-execute against a single direct model answer: each goal is also
//!   asked of the model as a plain question, and its answer checked against the same value.
//!
//! Usage: `eval-planner [--goals FILE] [--data DIR] [--limit N] [--sample N] [--needs-data]
//! [--direct] [--replans N] MODEL...`, where `--limit` keeps the first N goals, `--sample` N
//! evenly spaced ones, `--replans` lets the planner replace a failed node up to N times as the
//! dispatcher does for a text goal (`hermes_dispatcher::engine::MAX_REPLANS`, 2; default 0: the
//! first plan only),
//! `--needs-data` those whose value can only come from `examples/data` (a value to check, and a
//! `table.aggregate` or `fs.read` step), and MODEL is `local:<gguf>` (a build with the `local`
//! feature) or `openai:<base url>#<model name>`, either prefixed with `unconstrained:` to ask
//! without the answer's JSON Schema (no constrained decoding, no structured-output mode).

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hermes_clients::registry::CatalogSnapshot;
use hermes_core::plan::ValidatedPlan;
use hermes_executor::{ToolContext, ToolRegistry};
use hermes_llm::ChatModel;
use hermes_planner::{PlannerConfig, plan_with};
use hermes_proto::plan_result::Outcome;
use hermes_proto::{PlanRequest, TaskPlan};
use serde_json::Value;

/// One goal of the set, with what a right plan must show.
struct Goal {
    id: String,
    text: String,
    task_types: Vec<String>,
    /// `[a, b]`: some node of type `b` depends, directly or not, on a node of type `a`.
    depends: Vec<(String, String)>,
    expect: Expect,
}

enum Expect {
    Number {
        value: f64,
        tolerance: f64,
    },
    Contains(String),
    NeedsInput,
    /// Any output will do (the current time, a sleep).
    Anything,
}

/// What happened to one goal.
struct Outcome1 {
    accepted: bool,
    right: bool,
    corrections: u32,
    latency: Duration,
    input_tokens: u64,
    output_tokens: u64,
    why: String,
    /// The model's raw answers (corrections included), those that parse as a JSON object as
    /// they came, and those that do after JSON repair.
    answers: u32,
    parsed: u32,
    repaired: u32,
    /// With `--direct`: whether the model's plain answer to the question held the value.
    direct: Option<bool>,
    /// Replans after a failed node (`--replans`).
    replans: u32,
    /// The executed plan's output held the expected value, whatever the plan's shape.
    answered: bool,
}

/// A model asked without the answer's JSON Schema: its raw answers show what JSON repair is for.
struct Unconstrained(Arc<dyn ChatModel>);

impl ChatModel for Unconstrained {
    fn provider(&self) -> &str {
        self.0.provider()
    }
    fn model(&self) -> &str {
        self.0.model()
    }
    fn context_window(&self) -> usize {
        self.0.context_window()
    }
    fn count_tokens(&self, text: &str) -> usize {
        self.0.count_tokens(text)
    }
    fn chat<'a>(
        &'a self,
        request: hermes_llm::ChatRequest,
    ) -> futures::future::BoxFuture<'a, Result<hermes_llm::ChatResponse, hermes_llm::LlmError>> {
        self.0.chat(hermes_llm::ChatRequest { response_schema: None, ..request })
    }
}

/// Whether `expect` holds for `output`; `None` when the goal has no value to check.
fn holds(expect: &Expect, output: &Value) -> Option<bool> {
    match expect {
        Expect::Number { value, tolerance } => {
            let mut found = Vec::new();
            numbers(output, &mut found);
            Some(found.iter().any(|n| (n - value).abs() <= *tolerance))
        }
        Expect::Contains(text) => Some(output.to_string().contains(text.as_str())),
        Expect::Anything | Expect::NeedsInput => None,
    }
}

/// The model's plain answer to the goal's question, one call with no tools and no data.
async fn direct_answer(model: &dyn ChatModel, goal: &Goal) -> Option<bool> {
    holds(&goal.expect, &Value::Null)?;
    let request = hermes_llm::ChatRequest {
        messages: vec![
            hermes_llm::Message::system("Answer the user's question. Reply with the answer only."),
            hermes_llm::Message::user(goal.text.clone()),
        ],
        temperature: Some(0.0),
        max_tokens: Some(200),
        ..Default::default()
    };
    let answer = model.chat(request).await.ok()?.content.unwrap_or_default();
    holds(&goal.expect, &Value::String(answer))
}

fn parse_goals(text: &str) -> anyhow::Result<Vec<Goal>> {
    let goals: Vec<Value> = serde_json::from_str(text).context("the goal set is a JSON array")?;
    goals
        .iter()
        .map(|g| {
            let strings = |v: &Value| -> Vec<String> {
                v.as_array().into_iter().flatten().filter_map(Value::as_str).map(str::to_owned).collect()
            };
            let expect = match &g["expect"] {
                Value::Null => Expect::Anything,
                e if e.get("number").is_some() => Expect::Number {
                    value: e["number"].as_f64().context("`number` is a number")?,
                    tolerance: e["tolerance"].as_f64().unwrap_or(0.01),
                },
                e if e.get("contains").is_some() => {
                    Expect::Contains(e["contains"].as_str().context("`contains` is text")?.to_owned())
                }
                e if e.get("needs_input").is_some() => Expect::NeedsInput,
                other => bail!("unknown expectation {other}"),
            };
            Ok(Goal {
                id: g["id"].as_str().context("a goal has an id")?.to_owned(),
                text: g["goal"].as_str().context("a goal has text")?.to_owned(),
                task_types: strings(&g["task_types"]),
                depends: g["depends"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|pair| Some((pair[0].as_str()?.to_owned(), pair[1].as_str()?.to_owned())))
                    .collect(),
                expect,
            })
        })
        .collect()
}

fn model(spec: &str) -> anyhow::Result<Arc<dyn ChatModel>> {
    if let Some(path) = spec.strip_prefix("local:") {
        return local(Path::new(path));
    }
    if let Some(inner) = spec.strip_prefix("unconstrained:") {
        return Ok(Arc::new(Unconstrained(model(inner)?)));
    }
    if let Some(rest) = spec.strip_prefix("openai:") {
        let (url, name) = rest.split_once('#').context("openai:<base url>#<model name>")?;
        let config = hermes_llm::OpenAiConfig::new(url.to_owned(), name.to_owned());
        return Ok(Arc::new(hermes_llm::OpenAiChat::new(config)?));
    }
    bail!("a model is local:<gguf> or openai:<base url>#<model>, not {spec}")
}

#[cfg(feature = "local")]
fn local(path: &Path) -> anyhow::Result<Arc<dyn ChatModel>> {
    let config = hermes_llm::local::LocalConfig::new(path);
    Ok(Arc::new(hermes_llm::local::LocalChat::load(&config)?))
}

#[cfg(not(feature = "local"))]
fn local(_: &Path) -> anyhow::Result<Arc<dyn ChatModel>> {
    bail!("this build has no local model: build with --features hermes-bench/local")
}

/// Every number in `value`, including those written inside text.
fn numbers(value: &Value, out: &mut Vec<f64>) {
    match value {
        Value::Number(n) => out.extend(n.as_f64()),
        Value::String(s) => {
            let cleaned: String = s.chars().filter(|c| *c != ',').collect();
            for word in cleaned.split(|c: char| !(c.is_ascii_digit() || c == '.' || c == '-')) {
                if let Ok(n) = word.trim_matches('.').parse::<f64>() {
                    out.push(n);
                }
            }
        }
        Value::Array(items) => items.iter().for_each(|v| numbers(v, out)),
        Value::Object(map) => map.values().for_each(|v| numbers(v, out)),
        _ => {}
    }
}

/// Where a plan's run stopped: the failed node, its error, and the outputs of the nodes before.
struct Failure {
    node_id: String,
    error: hermes_proto::Error,
    outputs: HashMap<String, Value>,
}

impl Failure {
    fn describe(&self) -> String {
        format!("node {}: {}: {}", self.node_id, self.error.code, self.error.message)
    }
}

/// Runs a validated plan's nodes in dependency order; returns the output node's output.
async fn execute(
    valid: &ValidatedPlan,
    registry: &ToolRegistry,
    ctx: &ToolContext,
) -> Result<Value, Failure> {
    let plan = &valid.plan;
    let mut outputs: HashMap<String, Value> = HashMap::new();
    for group in &valid.groups {
        for id in group {
            let node = valid.plan.nodes.iter().find(|n| &n.id == id).expect("grouped nodes exist");
            let fail = |code: &str, message: String, outputs: &HashMap<String, Value>| Failure {
                node_id: id.clone(),
                error: hermes_core::error::wire_error(
                    hermes_core::ErrorCode::parse(code).unwrap_or(hermes_core::ErrorCode::ToolError),
                    message,
                ),
                outputs: outputs.clone(),
            };
            let inputs: Value = serde_json::from_str(&node.inputs_json)
                .map_err(|e| fail("INVALID_ARGUMENT", e.to_string(), &outputs))?;
            let inputs = hermes_core::json_ref::resolve(&inputs, &|n| outputs.get(n).cloned())
                .map_err(|e| fail("INVALID_ARGUMENT", e.to_string(), &outputs))?;
            let output = registry.call(&node.task_type, inputs, ctx).await.map_err(|e| {
                fail(e.code.as_str(), format!("({}) {}", node.task_type, e.message), &outputs)
            })?;
            outputs.insert(id.clone(), output);
        }
    }
    let last = valid.groups.last().and_then(|g| g.last()).cloned().unwrap_or_default();
    let output_node = if plan.output_node.is_empty() { last } else { plan.output_node.clone() };
    outputs.remove(&output_node).ok_or_else(|| Failure {
        node_id: output_node.clone(),
        error: hermes_core::error::wire_error(
            hermes_core::ErrorCode::PlanInvalid,
            format!("the output node `{output_node}` has no output"),
        ),
        outputs: HashMap::new(),
    })
}

/// The replan request the dispatcher would send after `failure` (`engine::plan::request_replan`).
fn replan_request(
    goal: &Goal,
    plan: &TaskPlan,
    failure: &Failure,
    earlier: &[hermes_proto::Error],
    n: u32,
) -> PlanRequest {
    PlanRequest {
        goal_id: format!("eval-{}", goal.id),
        request_id: format!("eval-{}:replan:{}:{n}", goal.id, failure.node_id),
        goal_text: goal.text.clone(),
        replan: Some(hermes_proto::ReplanContext {
            current_plan: Some(plan.clone()),
            failed_node_id: failure.node_id.clone(),
            error: Some(failure.error.clone()),
            previous_errors: earlier.to_vec(),
            completed: failure
                .outputs
                .iter()
                .map(|(id, output)| hermes_proto::CompletedNode {
                    node_id: id.clone(),
                    task_type: plan
                        .nodes
                        .iter()
                        .find(|n| &n.id == id)
                        .map(|n| n.task_type.clone())
                        .unwrap_or_default(),
                    output_summary: hermes_core::topology::truncate_for_message(&output.to_string()),
                })
                .collect(),
        }),
        ..Default::default()
    }
}

/// Whether some node of type `b` depends (transitively) on a node of type `a`. The validator has
/// added every `$ref` to `depends_on`.
fn depends(plan: &TaskPlan, a: &str, b: &str) -> bool {
    let deps: HashMap<&str, &[String]> =
        plan.nodes.iter().map(|n| (n.id.as_str(), n.depends_on.as_slice())).collect();
    let type_of = |id: &str| plan.nodes.iter().find(|n| n.id == id).map(|n| n.task_type.as_str());
    plan.nodes.iter().filter(|n| n.task_type == b).any(|n| {
        let mut seen = BTreeSet::new();
        let mut stack: Vec<String> = deps[n.id.as_str()].to_vec();
        while let Some(id) = stack.pop() {
            if !seen.insert(id.clone()) {
                continue;
            }
            if type_of(&id) == Some(a) {
                return true;
            }
            stack.extend(deps.get(id.as_str()).into_iter().flat_map(|d| d.iter().cloned()));
        }
        false
    })
}

async fn evaluate(
    goal: &Goal,
    config: &PlannerConfig,
    snapshot: &CatalogSnapshot,
    registry: &ToolRegistry,
    workspace: &Path,
    replans: u32,
) -> Outcome1 {
    let mut request = PlanRequest {
        goal_id: format!("eval-{}", goal.id),
        request_id: format!("eval-{}:plan", goal.id),
        goal_text: goal.text.clone(),
        ..Default::default()
    };
    let mut outcome = Outcome1 {
        accepted: false,
        right: false,
        corrections: 0,
        latency: Duration::ZERO,
        input_tokens: 0,
        output_tokens: 0,
        why: String::new(),
        answers: 0,
        parsed: 0,
        repaired: 0,
        direct: None,
        replans: 0,
        answered: false,
    };
    let mut errors: Vec<hermes_proto::Error> = Vec::new();
    loop {
        let started = Instant::now();
        let result = plan_with(config, snapshot, &request, None).await;
        outcome.latency += started.elapsed();
        let result = match result {
            Ok(r) => r,
            Err(e) => {
                outcome.why = format!("model error: {e}");
                return outcome;
            }
        };
        for exchange in &result.exchanges {
            let object = |v: &Value| v.is_object();
            outcome.answers += 1;
            outcome.parsed +=
                u32::from(serde_json::from_str::<Value>(&exchange.content).is_ok_and(|v| object(&v)));
            outcome.repaired +=
                u32::from(hermes_llm::repair::repair_json(&exchange.content).is_ok_and(|r| object(&r.value)));
        }
        outcome.corrections += result.corrections;
        outcome.input_tokens += result.tokens.map(|t| t.input_tokens).unwrap_or_default();
        outcome.output_tokens += result.tokens.map(|t| t.output_tokens).unwrap_or_default();
        let plan = match (result.outcome, &goal.expect) {
            (Some(Outcome::NeedsInput(why)), expect) => {
                outcome.accepted = true;
                outcome.right = matches!(expect, Expect::NeedsInput);
                outcome.why = format!("needs input: {why}");
                return outcome;
            }
            (Some(Outcome::Plan(plan)), _) => plan,
            (Some(Outcome::Error(e)), _) => {
                outcome.why = format!("{}: {}", e.code, e.message);
                return outcome;
            }
            (None, _) => {
                outcome.why = "no outcome".into();
                return outcome;
            }
        };
        outcome.accepted = true;
        if matches!(goal.expect, Expect::NeedsInput) {
            outcome.why = "planned a goal that cannot be done".into();
            return outcome;
        }
        // The planner validated it already; this adds the `$ref` dependencies and the groups.
        let valid = match hermes_core::plan::validate_plan(&plan, snapshot, config.max_nodes) {
            Ok(valid) => valid,
            Err(e) => {
                outcome.why = format!("invalid plan: {e}");
                return outcome;
            }
        };
        let types: BTreeSet<&str> = valid.plan.nodes.iter().map(|n| n.task_type.as_str()).collect();
        // A plan of another shape is not right, but it runs all the same: its answer may still
        // hold the value (`answered`, the plan-then-execute success of the claims' table).
        let shape = if let Some(missing) = goal.task_types.iter().find(|t| !types.contains(t.as_str())) {
            Some(format!("no {missing} node (plan: {types:?})"))
        } else {
            goal.depends
                .iter()
                .find(|(a, b)| !depends(&valid.plan, a, b))
                .map(|(a, b)| format!("no {b} node depends on a {a} node"))
        };
        if matches!(goal.expect, Expect::Anything) {
            // No value to check (the current time, a fetch this machine cannot make): the plan's
            // task types and dependencies are the whole test.
            outcome.right = shape.is_none();
            outcome.why = shape.unwrap_or_default();
            return outcome;
        }
        let ctx = ToolContext { workspace: workspace.to_path_buf(), task: None };
        match execute(&valid, registry, &ctx).await {
            Ok(output) => {
                outcome.answered = holds(&goal.expect, &output).unwrap_or(true);
                outcome.right = outcome.answered && shape.is_none();
                if let Some(shape) = shape {
                    outcome.why = shape;
                } else if !outcome.right {
                    let text = output.to_string();
                    outcome.why = format!("wrong output: {}", text.chars().take(160).collect::<String>());
                }
                return outcome;
            }
            // As the dispatcher does for a text goal: the planner replaces the failed node.
            Err(failure) if outcome.replans < replans => {
                outcome.replans += 1;
                request = replan_request(goal, &valid.plan, &failure, &errors, outcome.replans);
                errors.push(failure.error);
            }
            Err(failure) => {
                outcome.why = format!("execution failed: {}", failure.describe());
                return outcome;
            }
        }
    }
}

fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        if entry.file_type()?.is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))?;
        }
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let mut goals_path = root.join("examples/eval/planner-goals.json");
    let mut data = root.join("examples/data");
    let mut limit = usize::MAX;
    let mut sample = 0usize;
    let mut only: Option<BTreeSet<String>> = None;
    let (mut needs_data, mut direct, mut replans) = (false, false, 0u32);
    let mut models = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--goals" => goals_path = args.next().context("--goals FILE")?.into(),
            "--data" => data = args.next().context("--data DIR")?.into(),
            "--limit" => limit = args.next().context("--limit N")?.parse().context("--limit N")?,
            "--sample" => sample = args.next().context("--sample N")?.parse().context("--sample N")?,
            "--only" => {
                only = Some(args.next().context("--only ID,ID")?.split(',').map(str::to_owned).collect())
            }
            "--needs-data" => needs_data = true,
            "--direct" => direct = true,
            "--replans" => replans = args.next().context("--replans N")?.parse().context("--replans N")?,
            "-h" | "--help" => {
                println!(
                    "eval-planner [--goals FILE] [--data DIR] [--limit N] [--sample N] [--only ID,ID] [--needs-data] [--direct] [--replans N] [unconstrained:]local:<gguf>|openai:<url>#<model>..."
                );
                return Ok(());
            }
            spec => models.push(spec.to_owned()),
        }
    }
    if models.is_empty() {
        bail!("name at least one model: local:<gguf> or openai:<base url>#<model>");
    }
    let text = std::fs::read_to_string(&goals_path).with_context(|| format!("{}", goals_path.display()))?;
    let mut goals: Vec<Goal> = parse_goals(&text)?.into_iter().take(limit).collect();
    if let Some(only) = &only {
        let unknown: Vec<&String> = only.iter().filter(|id| !goals.iter().any(|g| &g.id == *id)).collect();
        if !unknown.is_empty() {
            bail!("--only names goals not in {}: {unknown:?}", goals_path.display());
        }
        goals.retain(|g| only.contains(&g.id));
    }
    if needs_data {
        let reads_data = |g: &Goal| g.task_types.iter().any(|t| t == "table.aggregate" || t == "fs.read");
        goals.retain(|g| holds(&g.expect, &Value::Null).is_some() && reads_data(g));
    }
    if sample > 0 && sample < goals.len() {
        // Evenly spaced, so every kind of goal in the set is represented.
        let step = goals.len() as f64 / sample as f64;
        let keep: BTreeSet<usize> = (0..sample).map(|i| (i as f64 * step) as usize).collect();
        goals = goals.into_iter().enumerate().filter(|(i, _)| keep.contains(i)).map(|(_, g)| g).collect();
    }
    let registry = hermes_executor::tools::builtin_registry();
    let snapshot = CatalogSnapshot::from_entries(registry.catalog_entries());
    println!("eval-planner: {} goals from {}\n", goals.len(), goals_path.display());
    let mut rows = Vec::new();
    for spec in &models {
        let loading = Instant::now();
        let model = model(spec)?;
        println!("{spec}: loaded in {:.1} s", loading.elapsed().as_secs_f64());
        let name = format!("{}/{}", model.provider(), model.model());
        let config = PlannerConfig::new(model);
        let mut outcomes = Vec::new();
        for goal in &goals {
            // Each goal gets a fresh copy of the data: some goals write files.
            let workspace = tempfile::tempdir()?;
            copy_dir(&data, workspace.path())?;
            let mut outcome = evaluate(goal, &config, &snapshot, &registry, workspace.path(), replans).await;
            if direct {
                outcome.direct = direct_answer(config.model.as_ref(), goal).await;
            }
            println!(
                "  {:<28} {:>6.1} s {:>6} in {:>4} out  {:<5}{}{} [answers {}: {} parse, {} repaired] {}",
                goal.id,
                outcome.latency.as_secs_f64(),
                outcome.input_tokens,
                outcome.output_tokens,
                if outcome.right {
                    "right"
                } else if outcome.answered {
                    "value"
                } else if outcome.accepted {
                    "wrong"
                } else {
                    "FAIL"
                },
                match outcome.direct {
                    Some(true) => " direct: right",
                    Some(false) => " direct: wrong",
                    None => "",
                },
                match outcome.replans {
                    0 => String::new(),
                    n => format!(" ({n} replans)"),
                },
                outcome.answers,
                outcome.parsed,
                outcome.repaired,
                outcome.why
            );
            outcomes.push(outcome);
        }
        rows.push((name, outcomes));
    }
    println!(
        "\n| model | goals | schema-valid | right | corrections | p50 plan | tok/s |\n|---|---|---|---|---|---|---|"
    );
    for (name, outcomes) in &rows {
        let n = outcomes.len().max(1) as f64;
        let share =
            |f: &dyn Fn(&Outcome1) -> bool| outcomes.iter().filter(|o| f(o)).count() as f64 / n * 100.0;
        let mut accepted: Vec<Duration> = outcomes.iter().filter(|o| o.accepted).map(|o| o.latency).collect();
        accepted.sort();
        let p50 = accepted.get(accepted.len() / 2).map_or(f64::NAN, Duration::as_secs_f64);
        let seconds: f64 = outcomes.iter().map(|o| o.latency.as_secs_f64()).sum();
        let tokens: u64 = outcomes.iter().map(|o| o.output_tokens).sum();
        println!(
            "| {name} | {} | {:.0}% | {:.0}% | {} | {p50:.1} s | {:.1} |",
            outcomes.len(),
            share(&|o| o.accepted),
            share(&|o| o.right),
            outcomes.iter().map(|o| o.corrections).sum::<u32>(),
            tokens as f64 / seconds.max(1e-9),
        );
    }
    println!("\n| model | raw answers | parse as they came | parse with JSON repair |\n|---|---|---|---|");
    for (name, outcomes) in &rows {
        let sum = |f: &dyn Fn(&Outcome1) -> u32| outcomes.iter().map(f).sum::<u32>();
        let answers = sum(&|o| o.answers);
        let share = |n: u32| n as f64 / answers.max(1) as f64 * 100.0;
        println!(
            "| {name} | {answers} | {:.0}% | {:.0}% |",
            share(sum(&|o| o.parsed)),
            share(sum(&|o| o.repaired))
        );
    }
    if direct {
        println!(
            "\n| model | goals with a value | plan-then-execute answer right | of them at the first plan | replans | direct answer right |\n|---|---|---|---|---|---|"
        );
        for (name, outcomes) in &rows {
            let checked: Vec<&Outcome1> = outcomes.iter().filter(|o| o.direct.is_some()).collect();
            let n = checked.len().max(1) as f64;
            let share =
                |f: &dyn Fn(&Outcome1) -> bool| checked.iter().filter(|o| f(o)).count() as f64 / n * 100.0;
            println!(
                "| {name} | {} | {:.0}% | {:.0}% | {} | {:.0}% |",
                checked.len(),
                share(&|o| o.answered),
                share(&|o| o.answered && o.replans == 0),
                checked.iter().map(|o| o.replans).sum::<u32>(),
                share(&|o| o.direct == Some(true))
            );
        }
    }
    Ok(())
}
