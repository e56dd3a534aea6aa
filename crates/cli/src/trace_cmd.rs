//! `hermes trace <goal_id>`: a goal's timeline from its events and state, for debugging without
//! a tracing backend. Every step is shown with its offset from the goal's acceptance: planning,
//! dispatches with the routing decision, each tool call of agent nodes, results, retries and the
//! end; then one line per node with its agent, attempts, queue wait, run time and tokens.

use std::time::Duration;

use futures::StreamExt as _;
use hermes_proto::event::Kind;
use hermes_proto::{Event, GetGoalRequest, Goal, GoalStatus, NodeStatus, WatchGoalRequest};

/// How long a running goal's event stream may stay quiet before the timeline is printed as it
/// stands.
const QUIET: Duration = Duration::from_millis(500);

/// Prints the timeline; exits 0 for a completed goal, 1 for one that failed or did not end well,
/// 3 while it is still running.
pub async fn run(client: &mut crate::api_client::Client, goal_id: &str) -> anyhow::Result<i32> {
    let goal = client
        .get_goal(GetGoalRequest { goal_id: goal_id.to_owned() })
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?
        .into_inner();
    let mut stream = client
        .watch_goal(WatchGoalRequest { goal_id: goal_id.to_owned(), after_seq: 0 })
        .await
        .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?
        .into_inner();
    let mut events = Vec::new();
    // WatchGoal replays from the start and ends after the terminal event; for a goal still
    // running, stop once the replay has gone quiet.
    while let Ok(Some(event)) = tokio::time::timeout(QUIET, stream.next()).await {
        events.push(event.map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?);
    }
    print!("{}", render(&goal, &events));
    Ok(match GoalStatus::try_from(goal.status).unwrap_or(GoalStatus::Unspecified) {
        GoalStatus::Completed => 0,
        GoalStatus::Failed | GoalStatus::Cancelled | GoalStatus::NeedsInput => 1,
        _ => 3,
    })
}

fn tokens_text(tokens: &Option<hermes_proto::TokenUsage>) -> String {
    match tokens {
        Some(t) if t.input_tokens + t.output_tokens > 0 => format!("{}/{}", t.input_tokens, t.output_tokens),
        _ => "-".to_owned(),
    }
}

fn ms(ms: u64) -> String {
    if ms >= 10_000 { format!("{:.1} s", ms as f64 / 1000.0) } else { format!("{ms} ms") }
}

/// The timeline as text.
pub fn render(goal: &Goal, events: &[Event]) -> String {
    let mut out = String::new();
    let status = GoalStatus::try_from(goal.status).map(|s| s.as_str_name()).unwrap_or("?");
    let status = status.trim_start_matches("GOAL_STATUS_");
    let took = goal.updated_unix_ms.saturating_sub(goal.created_unix_ms);
    out.push_str(&format!("goal {}  {status}  {}", goal.goal_id, ms(took)));
    out.push_str(&format!("  tokens {} (in/out)", tokens_text(&goal.tokens)));
    if goal.max_tokens > 0 {
        out.push_str(&format!(" of {}", goal.max_tokens));
    }
    if goal.cost_usd > 0.0 || goal.max_cost_usd > 0.0 {
        out.push_str(&format!("  cost ${:.4}", goal.cost_usd));
        if goal.max_cost_usd > 0.0 {
            out.push_str(&format!(" of ${:.4}", goal.max_cost_usd));
        }
    }
    out.push('\n');
    let t0 = events.first().map(|e| e.at_unix_ms).unwrap_or(goal.created_unix_ms);
    for event in events {
        let Some(line) = describe(event) else { continue };
        out.push_str(&format!("{:>10}  {line}\n", format!("+{}", ms(event.at_unix_ms.saturating_sub(t0)))));
    }
    if !goal.nodes.is_empty() {
        let task_type = |id: &str| {
            goal.plan
                .as_ref()
                .and_then(|p| p.nodes.iter().find(|n| n.id == id))
                .map(|n| n.task_type.clone())
                .unwrap_or_default()
        };
        out.push_str(&format!(
            "\n{:<20} {:<18} {:<10} {:>3} {:<14} {:>9} {:>9} {:>11}\n",
            "NODE", "TASK TYPE", "STATUS", "TRY", "AGENT", "WAITED", "RAN", "TOKENS"
        ));
        for node in &goal.nodes {
            let status = NodeStatus::try_from(node.status).map(|s| s.as_str_name()).unwrap_or("?");
            let wall = node.finished_unix_ms.saturating_sub(node.dispatched_unix_ms);
            let waited = if node.finished_unix_ms > 0 && node.dispatched_unix_ms > 0 {
                ms(wall.saturating_sub(node.elapsed_ms))
            } else {
                "-".to_owned()
            };
            let ran = if node.elapsed_ms > 0 { ms(node.elapsed_ms) } else { "-".to_owned() };
            out.push_str(&format!(
                "{:<20} {:<18} {:<10} {:>3} {:<14} {:>9} {:>9} {:>11}\n",
                node.node_id,
                task_type(&node.node_id),
                status.trim_start_matches("NODE_STATUS_"),
                node.attempt,
                if node.agent_id.is_empty() { "-" } else { &node.agent_id },
                waited,
                ran,
                tokens_text(&node.tokens),
            ));
        }
    }
    if let Some(error) = &goal.error {
        let at = if error.node_id.is_empty() { String::new() } else { format!(" at node {}", error.node_id) };
        out.push_str(&format!("\nfailed{at}: {}: {}\n", error.code, error.message));
    }
    out
}

/// One event in words; `None` for events with nothing to show.
fn describe(event: &Event) -> Option<String> {
    Some(match event.kind.as_ref()? {
        Kind::GoalAccepted(_) => "accepted".to_owned(),
        Kind::PlanRequested(p) if p.failed_node_id.is_empty() => "planning".to_owned(),
        Kind::PlanRequested(p) => format!("replanning after {} failed", p.failed_node_id),
        Kind::PlanCreated(p) => {
            let nodes = p.plan.as_ref().map(|p| p.nodes.len()).unwrap_or(0);
            format!("plan: {nodes} node(s) in {} group(s)", p.groups.len())
        }
        Kind::PlanPatched(p) => {
            format!("replanned: removed [{}], added [{}]", p.removed.join(", "), p.added.join(", "))
        }
        Kind::TaskDispatched(d) => {
            let to = if d.agent_id.is_empty() {
                "pool".to_owned()
            } else {
                format!("{} ({:.2})", d.agent_id, d.score)
            };
            format!("{:<14} dispatched  {} attempt {} -> {to}", d.node_id, d.task_type, d.attempt)
        }
        Kind::ToolCalled(c) => {
            let outcome = if c.ok { "ok" } else { c.error_code.as_str() };
            let cached = crate::cached_note(c.cached, c.cached_age_ms);
            format!(
                "{:<14}   tool {} step {}: {outcome} in {}{cached}",
                c.node_id,
                c.tool,
                c.step,
                ms(c.elapsed_ms)
            )
        }
        Kind::ModelWaiting(w) => crate::model_waiting_line(w),
        Kind::TaskSucceeded(s) => {
            let cached = crate::cached_note(s.cached, s.cached_age_ms);
            format!("{:<14} succeeded   on {} in {}{cached}", s.node_id, s.agent_id, ms(s.elapsed_ms))
        }
        Kind::TaskFailed(f) => {
            let e = f.error.clone().unwrap_or_default();
            format!(
                "{:<14} failed      on {} in {}: {}: {}",
                f.node_id,
                f.agent_id,
                ms(f.elapsed_ms),
                e.code,
                e.message
            )
        }
        Kind::TaskRetrying(r) => format!("{:<14} retrying    as attempt {}", r.node_id, r.next_attempt),
        Kind::ApprovalRequired(a) => {
            format!("{:<14} waiting for approval of {} ({})", a.node_id, a.tool, a.call_id)
        }
        Kind::ApprovalDecided(d) => {
            let verdict = match (d.approved, d.timed_out) {
                (true, _) => "approved",
                (false, true) => "approval timed out",
                (false, false) => "denied",
            };
            format!("{verdict}: {}", d.call_id)
        }
        Kind::GoalCompleted(_) => "completed".to_owned(),
        Kind::GoalFailed(f) => {
            let e = f.error.clone().unwrap_or_default();
            format!("failed: {}: {}", e.code, e.message)
        }
        Kind::GoalCancelled(c) => format!("cancelled: {}", c.reason),
        Kind::GoalNeedsInput(n) => format!("needs input: {}", n.explanation),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_proto::{NodeState, TaskDispatched, TaskPlan, TaskSucceeded, TokenUsage, ToolCalled};

    fn event(at: u64, kind: Kind) -> Event {
        Event { goal_id: "g-1".into(), at_unix_ms: at, kind: Some(kind), ..Default::default() }
    }

    #[test]
    fn the_timeline_shows_steps_agents_tools_durations_and_tokens() {
        let goal = Goal {
            goal_id: "g-1".into(),
            status: GoalStatus::Completed as i32,
            created_unix_ms: 1_000,
            updated_unix_ms: 1_450,
            tokens: Some(TokenUsage { input_tokens: 41, output_tokens: 12 }),
            max_tokens: 1000,
            plan: Some(TaskPlan {
                nodes: vec![hermes_proto::TaskNode {
                    id: "notes".into(),
                    task_type: "agent.run".into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            nodes: vec![NodeState {
                node_id: "notes".into(),
                status: NodeStatus::Succeeded as i32,
                attempt: 1,
                agent_id: "obs-1".into(),
                dispatched_unix_ms: 1_010,
                finished_unix_ms: 1_440,
                elapsed_ms: 400,
                tokens: Some(TokenUsage { input_tokens: 41, output_tokens: 12 }),
                ..Default::default()
            }],
            ..Default::default()
        };
        let events = vec![
            event(1_000, Kind::GoalAccepted(Default::default())),
            event(
                1_010,
                Kind::TaskDispatched(TaskDispatched {
                    node_id: "notes".into(),
                    task_type: "agent.run".into(),
                    attempt: 1,
                    agent_id: "obs-1".into(),
                    score: 0.9,
                    ..Default::default()
                }),
            ),
            event(
                1_200,
                Kind::ToolCalled(ToolCalled {
                    node_id: "notes".into(),
                    step: 1,
                    tool: "fs.read".into(),
                    ok: true,
                    elapsed_ms: 3,
                    ..Default::default()
                }),
            ),
            event(
                1_440,
                Kind::TaskSucceeded(TaskSucceeded {
                    node_id: "notes".into(),
                    agent_id: "obs-1".into(),
                    elapsed_ms: 400,
                    ..Default::default()
                }),
            ),
            event(1_450, Kind::GoalCompleted(Default::default())),
        ];
        let text = render(&goal, &events);
        assert!(text.starts_with("goal g-1  COMPLETED  450 ms  tokens 41/12 (in/out) of 1000\n"), "{text}");
        assert!(text.contains("+200 ms  notes            tool fs.read step 1: ok in 3 ms"), "{text}");
        assert!(text.contains("dispatched  agent.run attempt 1 -> obs-1 (0.90)"), "{text}");
        assert!(text.contains("+450 ms  completed"), "{text}");
        let node_line = text.lines().find(|l| l.starts_with("notes ")).unwrap();
        for column in ["agent.run", "SUCCEEDED", "obs-1", "30 ms", "400 ms", "41/12"] {
            assert!(node_line.contains(column), "{column} in {node_line}");
        }
    }
}
