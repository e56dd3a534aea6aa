//! `hermes eval <suite.yaml>`: regression suites for plans, agents and costs (docs/evaluation.md).
//!
//! A suite lists cases, each a goal (text or plan) with assertions on its output, its plan, its
//! tool trajectory, its budgets and its terminal status. Every case runs `runs` times, runs in
//! flight together up to `concurrency`, through the stack at `--server`: each run is a real goal,
//! followed over `WatchGoal` to its end. The report gives, per case and in total, the success
//! rate, p50/p95 latency, tokens and cost, corrections and replans; as a table, as JSON
//! (`--json`) and as JUnit XML (`--junit`). `--baseline RUN.json` marks each case whose success
//! rate fell (a regression, which fails the run) or rose. Every run is also stored under
//! `--store` (`.hermes/evals`), which `hermes eval show` lists.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use hermes_proto::event::Kind;
use hermes_proto::{GoalSpec, GoalStatus, SubmitGoalRequest, TaskPlan};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::Semaphore;

use crate::api_client::Client;

/// A suite file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Suite {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// Runs of each case that do not set their own (default 1).
    #[serde(default = "one")]
    pub runs: u32,
    /// Runs in flight at once, across cases (default 4).
    #[serde(default = "four")]
    pub concurrency: usize,
    pub cases: Vec<Case>,
}

fn one() -> u32 {
    1
}

fn four() -> usize {
    4
}

/// One case: a goal and what must hold of each run of it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Case {
    pub name: String,
    /// The goal in plain language (needs a planner), or
    #[serde(default)]
    pub text: String,
    /// a plan (the plan file's shape), or
    #[serde(default)]
    pub plan: Option<hermes_core::plan_file::PlanFile>,
    /// a plan file, relative to the suite's directory.
    #[serde(default)]
    pub plan_file: Option<PathBuf>,
    /// The session the goal runs in; each run gets `<session>-<run>` so runs do not share turns.
    #[serde(default)]
    pub session: String,
    /// Goals run first, in order, in the same session (memory to set up, earlier turns).
    #[serde(default)]
    pub setup: Vec<Setup>,
    #[serde(default)]
    pub runs: Option<u32>,
    /// Whole-goal timeout in seconds (default 120).
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// The goal's token budget (0: none).
    #[serde(default)]
    pub max_tokens: u64,
    /// The least success rate for the case to pass (default 1.0: every run).
    #[serde(default)]
    pub min_success: Option<f64>,
    #[serde(default)]
    pub expect: Expect,
}

/// A goal run before a case, in its session.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Setup {
    #[serde(default)]
    pub text: String,
    #[serde(default)]
    pub plan: Option<hermes_core::plan_file::PlanFile>,
}

/// What each run must show. Every part is optional.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Expect {
    /// The terminal status: `completed` (the default), `failed`, `cancelled`, `needs_input`.
    #[serde(default)]
    pub status: Option<String>,
    #[serde(default)]
    pub output: Vec<OutputCheck>,
    #[serde(default)]
    pub plan: Option<PlanCheck>,
    /// The tool trajectory: the tools called, in this order (from `ToolCalled` events, and each
    /// tool node's task type when the plan ran tools directly).
    #[serde(default)]
    pub tools: Option<Vec<String>>,
    #[serde(default)]
    pub budget: Option<BudgetCheck>,
}

/// A check of the goal's output (its JSON).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutputCheck {
    /// Where in the output: `a.b.0` (keys by name, items by index); empty: the whole output.
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub equals: Option<Value>,
    /// The value, as text, contains this.
    #[serde(default)]
    pub contains: Option<String>,
    /// The value, as text, matches this regular expression.
    #[serde(default)]
    pub regex: Option<String>,
    /// A number within `tolerance` of `value`.
    #[serde(default)]
    pub within: Option<Within>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Within {
    pub value: f64,
    pub tolerance: f64,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PlanCheck {
    /// Task types the plan must use (others may be used too).
    #[serde(default)]
    pub task_types: Vec<String>,
    #[serde(default)]
    pub min_nodes: Option<usize>,
    #[serde(default)]
    pub max_nodes: Option<usize>,
    /// `[a, b]` pairs of task types: some node of type `a` depends directly on a node of type `b`.
    #[serde(default)]
    pub depends: Vec<(String, String)>,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BudgetCheck {
    #[serde(default)]
    pub tokens: Option<u64>,
    #[serde(default)]
    pub cost_usd: Option<f64>,
    #[serde(default)]
    pub wall_ms: Option<u64>,
}

impl Suite {
    /// Reads and checks a suite file: every case has exactly one goal, plan files load, and
    /// each regular expression compiles.
    pub fn load(path: &Path) -> anyhow::Result<(Suite, Vec<GoalSpec>)> {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
        let suite: Suite =
            serde_norway::from_str(&text).with_context(|| format!("{} is not a suite", path.display()))?;
        if suite.cases.is_empty() {
            bail!("{}: the suite has no cases", path.display());
        }
        let dir = path.parent().unwrap_or(Path::new("."));
        let mut specs = Vec::new();
        let mut names = std::collections::HashSet::new();
        for case in &suite.cases {
            if !names.insert(case.name.as_str()) {
                bail!("{}: two cases are named `{}`", path.display(), case.name);
            }
            let plan = match (&case.plan, &case.plan_file) {
                (Some(plan), None) => Some(plan_of(plan.clone(), &case.name)?),
                (None, Some(file)) => Some(crate::plan_file::load_plan(&dir.join(file))?),
                (None, None) => None,
                (Some(_), Some(_)) => bail!("case `{}`: give `plan` or `plan_file`, not both", case.name),
            };
            if plan.is_some() != case.text.is_empty() {
                bail!("case `{}`: give exactly one of `text`, `plan` and `plan_file`", case.name);
            }
            for check in &case.expect.output {
                if let Some(re) = &check.regex {
                    regex::Regex::new(re)
                        .with_context(|| format!("case `{}`: bad regex `{re}`", case.name))?;
                }
            }
            if let Some(status) = &case.expect.status {
                parse_status(status).with_context(|| format!("case `{}`", case.name))?;
            }
            specs.push(GoalSpec {
                text: case.text.clone(),
                plan,
                timeout_ms: case.timeout_secs.unwrap_or(120) * 1000,
                max_tokens: case.max_tokens,
                ..Default::default()
            });
        }
        Ok((suite, specs))
    }
}

fn plan_of(plan: hermes_core::plan_file::PlanFile, case: &str) -> anyhow::Result<TaskPlan> {
    plan.into_plan().map_err(|e| anyhow::anyhow!("case `{case}`: {e}"))
}

fn parse_status(text: &str) -> anyhow::Result<GoalStatus> {
    let wanted = format!("GOAL_STATUS_{}", text.trim().to_ascii_uppercase());
    GoalStatus::from_str_name(&wanted).ok_or_else(|| {
        anyhow::anyhow!("unknown status `{text}`: use completed, failed, cancelled or needs_input")
    })
}

/// What one run of a case showed.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RunResult {
    pub goal_id: String,
    pub passed: bool,
    /// Every assertion that failed, in words.
    pub failures: Vec<String>,
    pub wall_ms: u64,
    pub tokens: u64,
    pub cost_usd: f64,
    /// Planner corrections: repairs of its answers (`PlanCreated`/`PlanPatched` repairs).
    pub corrections: u32,
    pub replans: u32,
}

/// A case's runs and their figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaseReport {
    pub name: String,
    pub runs: Vec<RunResult>,
    pub success_rate: f64,
    pub min_success: f64,
    pub passed: bool,
    pub p50_ms: f64,
    pub p95_ms: f64,
    pub mean_tokens: f64,
    pub mean_cost_usd: f64,
    pub corrections: u32,
    pub replans: u32,
    /// Against `--baseline`: `regression`, `improvement` or empty.
    #[serde(default)]
    pub against_baseline: String,
    #[serde(default)]
    pub baseline_success_rate: Option<f64>,
}

/// A whole run of a suite: what `--json` writes and `--baseline` reads.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EvalReport {
    pub suite: String,
    pub started_unix_ms: u64,
    pub wall_ms: u64,
    pub cases: Vec<CaseReport>,
    pub success_rate: f64,
    pub passed: bool,
    pub regressions: Vec<String>,
}

/// Runs the suite: every case `runs` times, `concurrency` runs at once.
pub async fn run(client: &Client, suite: &Suite, specs: &[GoalSpec]) -> anyhow::Result<EvalReport> {
    let started = Instant::now();
    let started_unix_ms = hermes_core::now_unix_ms();
    let permits = Arc::new(Semaphore::new(suite.concurrency.max(1)));
    let mut handles = Vec::new();
    for (index, (case, spec)) in suite.cases.iter().zip(specs).enumerate() {
        for run in 0..case.runs.unwrap_or(suite.runs).max(1) {
            let (client, case, spec, permits) = (client.clone(), case.clone(), spec.clone(), permits.clone());
            handles.push(tokio::spawn(async move {
                let _permit = permits.acquire_owned().await.expect("semaphore open");
                (index, run_once(client, &case, spec, run).await)
            }));
        }
    }
    let mut by_case: BTreeMap<usize, Vec<RunResult>> = BTreeMap::new();
    for handle in handles {
        let (index, result) = handle.await.context("an eval run panicked")?;
        by_case.entry(index).or_default().push(result?);
    }
    let cases: Vec<CaseReport> = suite
        .cases
        .iter()
        .enumerate()
        .map(|(i, case)| case_report(case, by_case.remove(&i).unwrap_or_default()))
        .collect();
    let (runs, passed_runs) = cases
        .iter()
        .fold((0, 0), |(n, p), c| (n + c.runs.len(), p + c.runs.iter().filter(|r| r.passed).count()));
    Ok(EvalReport {
        suite: suite.name.clone(),
        started_unix_ms,
        wall_ms: started.elapsed().as_millis() as u64,
        success_rate: if runs == 0 { 0.0 } else { passed_runs as f64 / runs as f64 },
        passed: cases.iter().all(|c| c.passed),
        cases,
        regressions: Vec::new(),
    })
}

/// One run: set-up goals, then the case's goal, followed to its end and checked.
async fn run_once(
    mut client: Client,
    case: &Case,
    mut spec: GoalSpec,
    run: u32,
) -> anyhow::Result<RunResult> {
    if !case.session.is_empty() {
        spec.session_id = format!("{}-{run}", case.session);
    }
    for (i, setup) in case.setup.iter().enumerate() {
        let plan = setup.plan.clone().map(|p| plan_of(p, &case.name)).transpose()?;
        let setup_spec = GoalSpec {
            text: setup.text.clone(),
            plan,
            session_id: spec.session_id.clone(),
            ..Default::default()
        };
        let (id, _) = follow(&mut client, setup_spec).await?;
        let goal = crate::api_client::get_goal(&mut client, &id).await?;
        if goal.status != GoalStatus::Completed as i32 {
            return Ok(RunResult {
                goal_id: id,
                passed: false,
                failures: vec![format!(
                    "setup goal {} ended {}",
                    i + 1,
                    crate::api_client::status_word(goal.status)
                )],
                wall_ms: 0,
                tokens: 0,
                cost_usd: 0.0,
                corrections: 0,
                replans: 0,
            });
        }
    }
    let started = Instant::now();
    let (goal_id, events) = follow(&mut client, spec).await?;
    let wall_ms = started.elapsed().as_millis() as u64;
    let goal = crate::api_client::get_goal(&mut client, &goal_id).await?;
    let tokens = goal.tokens.map(|t| t.input_tokens + t.output_tokens).unwrap_or_default();
    let mut corrections = 0;
    let mut replans = 0;
    for event in &events {
        match &event.kind {
            Some(Kind::PlanCreated(p)) => corrections += p.repairs.len() as u32,
            Some(Kind::PlanPatched(p)) => {
                corrections += p.repairs.len() as u32;
                replans += 1;
            }
            _ => {}
        }
    }
    let failures = check(&case.expect, &goal, &events, wall_ms, tokens);
    Ok(RunResult {
        goal_id,
        passed: failures.is_empty(),
        failures,
        wall_ms,
        tokens,
        cost_usd: goal.cost_usd,
        corrections,
        replans,
    })
}

/// Submits and follows the goal to its terminal event; its id and every event.
async fn follow(client: &mut Client, spec: GoalSpec) -> anyhow::Result<(String, Vec<hermes_proto::Event>)> {
    let timeout = Duration::from_millis(spec.timeout_ms.max(1000) + 30_000);
    let submitted = client
        .submit_goal(SubmitGoalRequest { spec: Some(spec) })
        .await
        .map_err(|s| anyhow::anyhow!("submit refused: {}", s.message()))?
        .into_inner();
    let goal_id = submitted.goal_id;
    let events = crate::api_client::follow_to_end(client, &goal_id, timeout).await?;
    Ok((goal_id, events))
}

/// Every assertion of `expect` that the run broke, in words.
pub fn check(
    expect: &Expect,
    goal: &hermes_proto::Goal,
    events: &[hermes_proto::Event],
    wall_ms: u64,
    tokens: u64,
) -> Vec<String> {
    let mut failures = Vec::new();
    let wanted = expect
        .status
        .as_deref()
        .map(parse_status)
        .transpose()
        .ok()
        .flatten()
        .unwrap_or(GoalStatus::Completed);
    if goal.status != wanted as i32 {
        let why = goal.error.as_ref().map(|e| format!(": {} {}", e.code, e.message)).unwrap_or_default();
        failures.push(format!(
            "status: expected {}, got {}{why}",
            crate::api_client::status_word(wanted as i32),
            crate::api_client::status_word(goal.status)
        ));
    }
    let output: Value =
        serde_json::from_str(&goal.output_json).unwrap_or(Value::String(goal.output_json.clone()));
    for c in &expect.output {
        let path: Vec<String> = c.path.split('.').filter(|s| !s.is_empty()).map(str::to_owned).collect();
        let at = if c.path.is_empty() { "output".to_owned() } else { format!("output.{}", c.path) };
        let Some(value) = hermes_core::json_ref::lookup(&output, &path) else {
            failures.push(format!("{at}: not found in {}", short(&output.to_string())));
            continue;
        };
        let text = match value {
            Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        if let Some(equals) = &c.equals
            && !same(value, equals)
        {
            failures.push(format!("{at}: expected {equals}, got {}", short(&value.to_string())));
        }
        if let Some(needle) = &c.contains
            && !text.contains(needle.as_str())
        {
            failures.push(format!("{at}: expected to contain {needle:?}, got {}", short(&text)));
        }
        if let Some(re) = &c.regex
            && !regex::Regex::new(re).is_ok_and(|r| r.is_match(&text))
        {
            failures.push(format!("{at}: expected to match /{re}/, got {}", short(&text)));
        }
        if let Some(w) = &c.within {
            match value.as_f64() {
                Some(n) if (n - w.value).abs() <= w.tolerance => {}
                Some(n) => failures.push(format!("{at}: expected {} ± {}, got {n}", w.value, w.tolerance)),
                None => failures.push(format!("{at}: expected a number, got {}", short(&text))),
            }
        }
    }
    let nodes = goal.plan.as_ref().map(|p| p.nodes.as_slice()).unwrap_or_default();
    if let Some(plan) = &expect.plan {
        for task_type in &plan.task_types {
            if !nodes.iter().any(|n| &n.task_type == task_type) {
                failures.push(format!("plan: no node of task type `{task_type}`"));
            }
        }
        if let Some(min) = plan.min_nodes
            && nodes.len() < min
        {
            failures.push(format!("plan: {} nodes, fewer than {min}", nodes.len()));
        }
        if let Some(max) = plan.max_nodes
            && nodes.len() > max
        {
            failures.push(format!("plan: {} nodes, more than {max}", nodes.len()));
        }
        for (node_type, dependency_type) in &plan.depends {
            let found = nodes.iter().filter(|n| &n.task_type == node_type).any(|n| {
                n.depends_on
                    .iter()
                    .any(|d| nodes.iter().any(|m| &m.id == d && &m.task_type == dependency_type))
            });
            if !found {
                failures.push(format!("plan: no `{node_type}` node depends on a `{dependency_type}` node"));
            }
        }
    }
    if let Some(tools) = &expect.tools {
        let called = trajectory(goal, events);
        if &called != tools {
            failures.push(format!("tools: expected {tools:?}, got {called:?}"));
        }
    }
    if let Some(budget) = &expect.budget {
        if let Some(max) = budget.tokens
            && tokens > max
        {
            failures.push(format!("budget: {tokens} tokens, over {max}"));
        }
        if let Some(max) = budget.cost_usd
            && goal.cost_usd > max
        {
            failures.push(format!("budget: ${:.4}, over ${max}", goal.cost_usd));
        }
        if let Some(max) = budget.wall_ms
            && wall_ms > max
        {
            failures.push(format!("budget: {wall_ms} ms, over {max} ms"));
        }
    }
    failures
}

/// Equal as JSON, numbers by value (`42` equals `42.0`).
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
        }
        _ => a == b,
    }
}

/// The tools the goal called, in order: the tool calls inside `agent.run` nodes (`ToolCalled`),
/// and each other node's task type, in the order the nodes finished.
fn trajectory(goal: &hermes_proto::Goal, events: &[hermes_proto::Event]) -> Vec<String> {
    let agent_nodes: std::collections::HashSet<&str> = goal
        .plan
        .as_ref()
        .map(|p| p.nodes.iter().filter(|n| n.task_type == "agent.run").map(|n| n.id.as_str()).collect())
        .unwrap_or_default();
    let type_of = |node: &str| {
        goal.plan.as_ref().and_then(|p| p.nodes.iter().find(|n| n.id == node)).map(|n| n.task_type.clone())
    };
    let mut out = Vec::new();
    for event in events {
        match &event.kind {
            Some(Kind::ToolCalled(call)) => out.push(call.tool.clone()),
            Some(Kind::TaskSucceeded(done)) if !agent_nodes.contains(done.node_id.as_str()) => {
                out.extend(type_of(&done.node_id));
            }
            _ => {}
        }
    }
    out
}

/// Output quoted in a failure: at most 200 characters.
fn short(text: &str) -> String {
    hermes_core::text::clip(text, 200)
}

fn case_report(case: &Case, runs: Vec<RunResult>) -> CaseReport {
    let n = runs.len().max(1) as f64;
    let passed = runs.iter().filter(|r| r.passed).count() as f64;
    let mut walls: Vec<f64> = runs.iter().map(|r| r.wall_ms as f64).collect();
    walls.sort_by(f64::total_cmp);
    let pick = |p: f64| walls.get(((walls.len() as f64 - 1.0) * p).round() as usize).copied().unwrap_or(0.0);
    let success_rate = passed / n;
    let min_success = case.min_success.unwrap_or(1.0);
    CaseReport {
        name: case.name.clone(),
        success_rate,
        min_success,
        passed: !runs.is_empty() && success_rate + 1e-9 >= min_success,
        p50_ms: pick(0.5),
        p95_ms: pick(0.95),
        mean_tokens: runs.iter().map(|r| r.tokens as f64).sum::<f64>() / n,
        mean_cost_usd: runs.iter().map(|r| r.cost_usd).sum::<f64>() / n,
        corrections: runs.iter().map(|r| r.corrections).sum(),
        replans: runs.iter().map(|r| r.replans).sum(),
        against_baseline: String::new(),
        baseline_success_rate: None,
        runs,
    }
}

impl EvalReport {
    /// Marks each case against an earlier run: a lower success rate is a regression (and fails
    /// the report), a higher one an improvement.
    pub fn compare(&mut self, baseline: &EvalReport) {
        for case in &mut self.cases {
            let Some(before) = baseline.cases.iter().find(|c| c.name == case.name) else { continue };
            case.baseline_success_rate = Some(before.success_rate);
            if case.success_rate + 1e-9 < before.success_rate {
                case.against_baseline = "regression".into();
                self.regressions.push(format!(
                    "{}: success rate {:.0}%, was {:.0}%",
                    case.name,
                    100.0 * case.success_rate,
                    100.0 * before.success_rate
                ));
            } else if case.success_rate > before.success_rate + 1e-9 {
                case.against_baseline = "improvement".into();
            }
        }
        if !self.regressions.is_empty() {
            self.passed = false;
        }
    }

    /// The table printed at the end of a run.
    pub fn table(&self) -> String {
        let mut out = format!(
            "{:<32} {:>5} {:>8} {:>9} {:>9} {:>9} {:>10} {:>5} {:>6}  {}\n",
            "case", "runs", "success", "p50 ms", "p95 ms", "tokens", "cost $", "corr", "replan", "verdict"
        );
        for c in &self.cases {
            let verdict = match (c.passed, c.against_baseline.as_str()) {
                (_, "regression") => "REGRESSION".to_owned(),
                (true, "improvement") => "ok (improved)".to_owned(),
                (true, _) => "ok".to_owned(),
                (false, _) => format!("FAIL (needs {:.0}%)", 100.0 * c.min_success),
            };
            out += &format!(
                "{:<32} {:>5} {:>7.0}% {:>9.0} {:>9.0} {:>9.0} {:>10.4} {:>5} {:>6}  {verdict}\n",
                c.name,
                c.runs.len(),
                100.0 * c.success_rate,
                c.p50_ms,
                c.p95_ms,
                c.mean_tokens,
                c.mean_cost_usd,
                c.corrections,
                c.replans
            );
            for failure in c.runs.iter().flat_map(|r| r.failures.iter().map(move |f| (r, f))).take(5) {
                out += &format!("    {}: {}\n", failure.0.goal_id, failure.1);
            }
        }
        out += &format!(
            "total: {:.0}% of runs passed, {} of {} cases passed, in {} ms\n",
            100.0 * self.success_rate,
            self.cases.iter().filter(|c| c.passed).count(),
            self.cases.len(),
            self.wall_ms
        );
        for r in &self.regressions {
            out += &format!("regression against the baseline: {r}\n");
        }
        out
    }

    /// JUnit XML: one test suite, one test case per case, a `<failure>` naming what broke.
    pub fn junit(&self) -> String {
        let failures = self.cases.iter().filter(|c| !c.passed || c.against_baseline == "regression").count();
        let mut out = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
        out += &format!(
            "<testsuites name=\"hermes eval\" tests=\"{}\" failures=\"{failures}\" time=\"{:.3}\">\n",
            self.cases.len(),
            self.wall_ms as f64 / 1000.0
        );
        out += &format!(
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{failures}\" time=\"{:.3}\">\n",
            xml(&self.suite),
            self.cases.len(),
            self.wall_ms as f64 / 1000.0
        );
        for c in &self.cases {
            let time = c.runs.iter().map(|r| r.wall_ms).max().unwrap_or_default() as f64 / 1000.0;
            out += &format!(
                "    <testcase classname=\"{}\" name=\"{}\" time=\"{time:.3}\">\n",
                xml(&self.suite),
                xml(&c.name)
            );
            let mut reasons: Vec<String> = c
                .runs
                .iter()
                .flat_map(|r| r.failures.iter().map(|f| format!("{}: {f}", r.goal_id)))
                .collect();
            if c.against_baseline == "regression" {
                reasons.insert(
                    0,
                    format!(
                        "regression: success rate {:.0}%, baseline {:.0}%",
                        100.0 * c.success_rate,
                        100.0 * c.baseline_success_rate.unwrap_or_default()
                    ),
                );
            }
            if !c.passed || c.against_baseline == "regression" {
                let message = format!(
                    "success rate {:.0}% (needs {:.0}%)",
                    100.0 * c.success_rate,
                    100.0 * c.min_success
                );
                out += &format!(
                    "      <failure message=\"{}\">{}</failure>\n",
                    xml(&message),
                    xml(&reasons.join("\n"))
                );
            }
            out += &format!(
                "      <system-out>{}</system-out>\n",
                xml(&format!(
                    "runs={} success_rate={:.3} p50_ms={:.0} p95_ms={:.0} mean_tokens={:.1} mean_cost_usd={:.6} corrections={} replans={}",
                    c.runs.len(),
                    c.success_rate,
                    c.p50_ms,
                    c.p95_ms,
                    c.mean_tokens,
                    c.mean_cost_usd,
                    c.corrections,
                    c.replans
                ))
            );
            out += "    </testcase>\n";
        }
        out += "  </testsuite>\n</testsuites>\n";
        out
    }
}

/// Text escaped for XML attributes and content.
fn xml(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            // Characters XML 1.0 cannot hold at all.
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\r' | '\t') => out.push('\u{FFFD}'),
            c => out.push(c),
        }
    }
    out
}

/// Stores the report under `store` as `<suite>-<started>.json`; returns its path.
pub fn store(report: &EvalReport, store: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(store).with_context(|| format!("cannot create {}", store.display()))?;
    let safe: String =
        report.suite.chars().map(|c| if c.is_ascii_alphanumeric() || c == '-' { c } else { '_' }).collect();
    let path = store.join(format!("{safe}-{}.json", report.started_unix_ms));
    std::fs::write(&path, serde_json::to_vec_pretty(report)?)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(path)
}

/// The stored runs, oldest first, as a table (`hermes eval show`).
pub fn show(store: &Path) -> anyhow::Result<String> {
    let mut runs = Vec::new();
    let entries = match std::fs::read_dir(store) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Ok(format!("no eval runs stored in {}\n", store.display()));
        }
        Err(e) => return Err(e).with_context(|| format!("cannot read {}", store.display())),
    };
    for entry in entries {
        let path = entry?.path();
        if path.extension().is_some_and(|e| e == "json")
            && let Ok(report) = std::fs::read(&path)
                .map_err(anyhow::Error::from)
                .and_then(|b| Ok(serde_json::from_slice::<EvalReport>(&b)?))
        {
            runs.push((report, path));
        }
    }
    runs.sort_by_key(|(r, _)| r.started_unix_ms);
    let mut out = format!(
        "{:<24} {:<24} {:>6} {:>8} {:>8}  {}\n",
        "started", "suite", "cases", "success", "verdict", "file"
    );
    for (r, path) in &runs {
        out += &format!(
            "{:<24} {:<24} {:>6} {:>7.0}% {:>8}  {}\n",
            crate::format_time(r.started_unix_ms),
            r.suite,
            r.cases.len(),
            100.0 * r.success_rate,
            if r.passed { "passed" } else { "FAILED" },
            path.display()
        );
    }
    if runs.is_empty() {
        out = format!("no eval runs stored in {}\n", store.display());
    }
    Ok(out)
}
