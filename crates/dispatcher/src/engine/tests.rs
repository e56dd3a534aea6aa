//! Table tests of the transitions, one or more per transition.

use super::*;
use hermes_proto::{TaskNode, TaskPlan};
use serde_json::json;

const LIMITS: Limits = Limits {
    node_timeout_ms: 1000,
    planner: false,
    summarizer: false,
    prices: Prices { input_per_mtok: 0.0, output_per_mtok: 0.0 },
};

/// A running goal over `plan`, nothing dispatched yet.
fn running(plan: TaskPlan) -> GoalState {
    GoalState {
        goal_id: "g-1".into(),
        status: GoalStatus::Running as i32,
        nodes: initial_nodes(&plan),
        plan: Some(plan),
        ..Default::default()
    }
}

fn state() -> GoalState {
    let plan = TaskPlan {
        nodes: vec![
            TaskNode {
                id: "a".into(),
                task_type: "t".into(),
                inputs_json: "{}".into(),
                ..Default::default()
            },
            TaskNode {
                id: "b".into(),
                task_type: "t".into(),
                inputs_json: "{}".into(),
                ..Default::default()
            },
            TaskNode {
                id: "c".into(),
                task_type: "t".into(),
                inputs_json: json!({"x": {"$ref": "a.v"}, "y": {"$ref": "b.v"}}).to_string(),
                depends_on: vec!["a".into(), "b".into()],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    running(plan)
}

fn ok(node: &str, attempt: u32, output: Value) -> TaskResult {
    TaskResult {
        goal_id: "g-1".into(),
        node_id: node.into(),
        task_id: format!("g-1.{node}.{attempt}"),
        attempt,
        status: TaskStatus::Succeeded as i32,
        output_json: output.to_string(),
        ..Default::default()
    }
}

fn failed(node: &str, attempt: u32, code: ErrorCode) -> TaskResult {
    TaskResult {
        status: TaskStatus::Failed as i32,
        output_json: String::new(),
        error: Some(wire_error(code, "boom")),
        ..ok(node, attempt, Value::Null)
    }
}

#[test]
fn independent_nodes_dispatch_together_and_refs_resolve() {
    let mut s = state();
    let mut fx = Effects::default();
    dispatch_ready(&mut s, LIMITS, 10, &mut fx);
    let ids: Vec<&str> = fx.tasks.iter().map(|t| t.node_id.as_str()).collect();
    assert_eq!(ids, vec!["a", "b"]);
    assert_eq!(fx.tasks[0].task_id, "g-1.a.1");

    let mut fx = Effects::default();
    assert_eq!(apply_result(&mut s, &ok("a", 1, json!({"v": 2})), LIMITS, 11, &mut fx), Applied::Changed);
    assert!(fx.tasks.is_empty());
    let mut fx = Effects::default();
    apply_result(&mut s, &ok("b", 1, json!({"v": 3})), LIMITS, 12, &mut fx);
    assert_eq!(fx.tasks.len(), 1);
    assert_eq!(serde_json::from_str::<Value>(&fx.tasks[0].inputs_json).unwrap(), json!({"x": 2, "y": 3}));

    let mut fx = Effects::default();
    apply_result(&mut s, &ok("c", 1, json!({"done": true})), LIMITS, 13, &mut fx);
    assert_eq!(s.status, GoalStatus::Completed as i32);
    assert_eq!(s.output_json, json!({"done": true}).to_string());
    assert!(is_terminal_event(fx.events.last().unwrap()));
}

#[test]
fn a_batch_of_results_is_recorded_in_order_and_dispatches_once() {
    let mut s = state();
    dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
    let mut fx = Effects::default();
    let batch = [ok("a", 1, json!({"v": 2})), ok("a", 1, json!({"v": 9})), ok("b", 1, json!({"v": 3}))];
    let applied = apply_results(&mut s, &batch, LIMITS, 11, &mut fx);
    // The second is the first delivered again.
    assert_eq!(applied, vec![Applied::Changed, Applied::Stale, Applied::Changed]);
    // Both successes are recorded before their dependant is dispatched, once, with both outputs.
    let kinds: Vec<&str> = fx
        .events
        .iter()
        .map(|e| match &e.kind {
            Some(Kind::TaskSucceeded(t)) if t.node_id == "a" => "a succeeded",
            Some(Kind::TaskSucceeded(t)) if t.node_id == "b" => "b succeeded",
            Some(Kind::TaskDispatched(t)) if t.node_id == "c" => "c dispatched",
            other => panic!("unexpected event {other:?}"),
        })
        .collect();
    assert_eq!(kinds, ["a succeeded", "b succeeded", "c dispatched"]);
    assert_eq!(fx.tasks.len(), 1);
    assert_eq!(serde_json::from_str::<Value>(&fx.tasks[0].inputs_json).unwrap(), json!({"x": 2, "y": 3}));

    // A batch that ends the goal completes it once, after its last result.
    let mut fx = Effects::default();
    let applied = apply_results(
        &mut s,
        &[ok("c", 1, json!({"done": true})), ok("c", 1, json!({}))],
        LIMITS,
        12,
        &mut fx,
    );
    assert_eq!(applied, vec![Applied::Changed, Applied::Stale]);
    assert_eq!(s.status, GoalStatus::Completed as i32);
    assert_eq!(fx.events.iter().filter(|e| is_terminal_event(e)).count(), 1);
    assert!(is_terminal_event(fx.events.last().unwrap()));
}

#[test]
fn a_batch_whose_later_result_fails_the_goal_dispatches_nothing_after() {
    // a and b feed c; a succeeds and b fails for good in the same batch: the goal fails and c,
    // whose inputs would never be whole, is not dispatched.
    let mut s = state();
    dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
    let mut fx = Effects::default();
    apply_results(
        &mut s,
        &[ok("a", 1, json!({"v": 2})), failed("b", 1, ErrorCode::ToolError)],
        LIMITS,
        11,
        &mut fx,
    );
    assert_eq!(s.status, GoalStatus::Failed as i32);
    assert!(fx.tasks.is_empty(), "{:?}", fx.tasks);
}

#[test]
fn duplicate_and_stale_results_are_ignored() {
    let mut s = state();
    dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
    apply_result(&mut s, &ok("a", 1, json!({"v": 1})), LIMITS, 11, &mut Effects::default());
    let mut fx = Effects::default();
    assert_eq!(apply_result(&mut s, &ok("a", 1, json!({"v": 9})), LIMITS, 12, &mut fx), Applied::Stale);
    assert!(fx.events.is_empty());
    assert_eq!(apply_result(&mut s, &ok("b", 7, json!({})), LIMITS, 12, &mut fx), Applied::Stale);
}

#[test]
fn a_result_without_its_attempts_token_is_forged_and_changes_nothing() {
    let mut s = GoalState { result_key: vec![7; 32], ..state() };
    let mut fx = Effects::default();
    dispatch_ready(&mut s, LIMITS, 10, &mut fx);
    let token = fx.tasks[0].result_token.clone();
    assert_eq!(token.len(), 32, "every task carries its attempt's token");
    assert_ne!(token, fx.tasks[1].result_token, "each attempt has its own");
    assert_eq!(token, result_token(&s.result_key, "g-1.a.1"), "the token is the same when recomputed");

    for forged in ["", "0123456789abcdef0123456789abcdef", fx.tasks[1].result_token.as_str()] {
        let result = TaskResult { result_token: forged.into(), ..ok("a", 1, json!({"v": "forged"})) };
        let mut fx = Effects::default();
        assert_eq!(apply_result(&mut s, &result, LIMITS, 11, &mut fx), Applied::Forged, "{forged:?}");
        assert!(fx.events.is_empty() && fx.tasks.is_empty());
        assert_eq!(s.nodes[0].status, NodeStatus::Dispatched as i32);
    }
    let real = TaskResult { result_token: token, ..ok("a", 1, json!({"v": 1})) };
    assert_eq!(apply_result(&mut s, &real, LIMITS, 12, &mut Effects::default()), Applied::Changed);
    assert_eq!(s.nodes[0].output_json, json!({"v": 1}).to_string());
    // A stale attempt stays stale, token or not.
    assert_eq!(apply_result(&mut s, &real, LIMITS, 13, &mut Effects::default()), Applied::Stale);
}

#[test]
fn retryable_failures_retry_then_fail_the_goal() {
    let mut s = state();
    dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
    let mut fx = Effects::default();
    apply_result(&mut s, &failed("a", 1, ErrorCode::Timeout), LIMITS, 11, &mut fx);
    assert_eq!(fx.tasks[0].task_id, "g-1.a.2");
    apply_result(&mut s, &failed("a", 2, ErrorCode::Timeout), LIMITS, 12, &mut Effects::default());
    let mut fx = Effects::default();
    apply_result(&mut s, &failed("a", 3, ErrorCode::Timeout), LIMITS, 13, &mut fx);
    assert!(fx.tasks.is_empty());
    assert_eq!(s.status, GoalStatus::Failed as i32);
    assert_eq!(s.nodes[2].status, NodeStatus::Skipped as i32);
}

/// An agent's `attempt` is checked against the one the dispatcher issued: a lower number cannot
/// buy extra retries, a higher one cannot exhaust them, and neither changes the goal.
#[test]
fn results_are_matched_to_the_attempt_the_dispatcher_issued() {
    // (claimed attempt, on the task id of the attempt actually issued)
    let cases: [(u32, &str); 4] = [
        (0, "lower than issued"),
        (1, "an earlier attempt's number"),
        (3, "higher"),
        (u32::MAX, "far higher"),
    ];
    for (claimed, why) in cases {
        let mut s = state();
        dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
        apply_result(&mut s, &failed("a", 1, ErrorCode::Timeout), LIMITS, 11, &mut Effects::default());
        assert_eq!(s.nodes[0].attempt, 2);
        // The issued attempt's task id, with another attempt number.
        let lie =
            TaskResult { attempt: claimed, task_id: "g-1.a.2".into(), ..failed("a", 2, ErrorCode::Timeout) };
        let mut fx = Effects::default();
        assert_eq!(
            apply_result(&mut s, &lie, LIMITS, 12, &mut fx),
            Applied::WrongAttempt { issued: 2, claimed },
            "{why}"
        );
        assert!(fx.events.is_empty() && fx.tasks.is_empty(), "{why}: nothing published");
        assert_eq!(s.nodes[0].attempt, 2, "{why}");
        assert_eq!(s.nodes[0].status, NodeStatus::Dispatched as i32, "{why}");
        assert_eq!(s.nodes[0].errors.len(), 1, "{why}: the lie is not recorded");
        // The honest result of the same attempt still counts, and retries go on from the
        // dispatcher's number.
        let mut fx = Effects::default();
        assert_eq!(
            apply_result(&mut s, &failed("a", 2, ErrorCode::Timeout), LIMITS, 13, &mut fx),
            Applied::Changed
        );
        assert_eq!(fx.tasks[0].task_id, "g-1.a.3", "{why}");
        apply_result(&mut s, &failed("a", 3, ErrorCode::Timeout), LIMITS, 14, &mut Effects::default());
        assert_eq!(s.status, GoalStatus::Failed as i32, "{why}: the retry budget is the dispatcher's");
    }
    // A success with a wrong number is ignored the same way.
    let mut s = state();
    dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
    let lie = TaskResult { attempt: 5, ..ok("a", 1, json!({"v": 1})) };
    assert_eq!(
        apply_result(&mut s, &lie, LIMITS, 11, &mut Effects::default()),
        Applied::WrongAttempt { issued: 1, claimed: 5 }
    );
    assert_eq!(s.nodes[0].status, NodeStatus::Dispatched as i32);
}

#[test]
fn tool_errors_are_not_retried() {
    let mut s = state();
    dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
    let mut fx = Effects::default();
    apply_result(&mut s, &failed("b", 1, ErrorCode::ToolError), LIMITS, 11, &mut fx);
    assert!(fx.tasks.is_empty());
    assert_eq!(s.status, GoalStatus::Failed as i32);
    assert_eq!(s.error.as_ref().unwrap().node_id, "b");
}

#[test]
fn events_are_numbered_on_from_the_goal_s_last_seq() {
    let mut s = running(TaskPlan {
        nodes: vec![TaskNode { id: "a".into(), task_type: "t".into(), ..Default::default() }],
        ..Default::default()
    });
    let mut fx = Effects::default();
    dispatch_ready(&mut s, LIMITS, 1, &mut fx);
    fx.number(&mut s);
    let first: Vec<u64> = fx.events.iter().map(|e| e.seq).collect();
    assert_eq!(first, (1..=fx.events.len() as u64).collect::<Vec<_>>());
    let mut fx = Effects::default();
    apply_result(&mut s, &ok("a", 1, json!({})), LIMITS, 2, &mut fx);
    fx.number(&mut s);
    let next = first.len() as u64 + 1;
    assert_eq!(fx.events.first().map(|e| e.seq), Some(next));
    assert_eq!(s.event_seq, first.len() as u64 + fx.events.len() as u64);
}

#[test]
fn cancel_skips_pending_nodes_once() {
    let plan = TaskPlan {
        nodes: vec![
            TaskNode { id: "a".into(), task_type: "t".into(), ..Default::default() },
            TaskNode {
                id: "b".into(),
                task_type: "t".into(),
                depends_on: vec!["a".into()],
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let mut s = running(plan);
    dispatch_ready(&mut s, LIMITS, 1, &mut Effects::default());
    let mut fx = Effects::default();
    assert!(cancel(&mut s, "user asked", 2, &mut fx));
    assert_eq!(s.status, GoalStatus::Cancelled as i32);
    // The running node is cancelled, with a finish time and why; its agent is told.
    assert_eq!(s.nodes[0].status, NodeStatus::Cancelled as i32);
    assert_eq!(s.nodes[0].finished_unix_ms, 2);
    assert_eq!(s.nodes[0].error.as_ref().unwrap().code, "CANCELLED");
    assert!(s.nodes[0].error.as_ref().unwrap().message.contains("user asked"));
    assert!(fx.stop_agents);
    assert_eq!(s.nodes[1].status, NodeStatus::Skipped as i32);
    assert!(is_terminal_event(&fx.events[0]));
    assert!(!cancel(&mut s, "again", 3, &mut Effects::default()));
    // A late result for the running node is ignored.
    let late = ok("a", 1, json!({}));
    assert_eq!(apply_result(&mut s, &late, LIMITS, 4, &mut Effects::default()), Applied::Stale);
}

#[test]
fn reassignment_supersedes_the_attempt_and_late_results_are_stale() {
    let plan = TaskPlan {
        nodes: vec![TaskNode { id: "a".into(), task_type: "t".into(), ..Default::default() }],
        ..Default::default()
    };
    let mut s = running(plan);
    let limits = LIMITS;
    dispatch_ready(&mut s, limits, 1, &mut Effects::default());
    let mut fx = Effects::default();
    assert_eq!(
        reassign(&mut s, "a", "g-1.a.1", "agent x went offline", limits, 2, &mut fx),
        Applied::Changed
    );
    assert_eq!(fx.tasks[0].task_id, "g-1.a.2");
    // The same notice twice does nothing the second time.
    assert_eq!(reassign(&mut s, "a", "g-1.a.1", "again", limits, 3, &mut Effects::default()), Applied::Stale);
    let late = ok("a", 1, json!({}));
    assert_eq!(apply_result(&mut s, &late, limits, 4, &mut Effects::default()), Applied::Stale);
    let err = wire_error(ErrorCode::NoCapableAgent, "none");
    assert_eq!(fail_attempt(&mut s, "a", "g-1.a.1", err.clone(), 5, &mut Effects::default()), Applied::Stale);
    assert_eq!(fail_attempt(&mut s, "a", "g-1.a.2", err, 5, &mut Effects::default()), Applied::Changed);
    assert_eq!(s.status, GoalStatus::Failed as i32);
}

#[test]
fn an_overdue_attempt_times_out_and_is_retried_and_a_goal_past_its_deadline_fails() {
    let mut s = state();
    s.deadline_unix_ms = 100_000;
    let mut fx = Effects::default();
    dispatch_ready(&mut s, LIMITS, 10, &mut fx);
    // Node timeout 1 s (LIMITS) plus the grace: nothing is due before.
    let due = 10 + 1000 + NODE_DEADLINE_GRACE_MS;
    assert_eq!(next_deadline(&s, LIMITS), Some(due));
    let never = |_: &str| false;
    assert_eq!(expire(&mut s, LIMITS, due - 1, &mut Effects::default(), &never), Applied::Stale);
    // "b" waits on a person; "a" is retried as attempt 2 with a TIMEOUT.
    let mut fx = Effects::default();
    assert_eq!(expire(&mut s, LIMITS, due, &mut fx, &|node| node == "b"), Applied::Changed);
    assert_eq!(s.nodes[0].attempt, 2);
    assert_eq!(s.nodes[0].errors[0].code, "TIMEOUT");
    assert_eq!(s.nodes[1].attempt, 1);
    assert_eq!(fx.tasks.len(), 1);
    assert!(fx.events.iter().any(|e| matches!(e.kind, Some(Kind::TaskRetrying(_)))));
    // The late result of attempt 1 is stale now.
    assert_eq!(
        apply_result(&mut s, &ok("a", 1, json!({"v": 1})), LIMITS, due + 1, &mut Effects::default()),
        Applied::Stale
    );
    // Past the goal's deadline everything ends with TIMEOUT.
    let mut fx = Effects::default();
    assert_eq!(expire(&mut s, LIMITS, 100_000, &mut fx, &never), Applied::Changed);
    assert_eq!(s.status, GoalStatus::Failed as i32);
    assert_eq!(s.error.as_ref().unwrap().code, "TIMEOUT");
    assert!(
        s.nodes
            .iter()
            .all(|n| n.status != NodeStatus::Dispatched as i32 && n.status != NodeStatus::Pending as i32)
    );
    assert!(matches!(fx.events.last().unwrap().kind, Some(Kind::GoalFailed(_))));
    assert_eq!(next_deadline(&s, LIMITS), None);
}

// ---- Table tests of each transition: budget, cancel, planning and stale plans, replan,
// summarizing, expiry, takeover. Each starts from a goal state, applies one transition and
// checks the state and the effects.

fn kinds(fx: &Effects) -> Vec<&'static str> {
    fx.events
        .iter()
        .map(|e| match &e.kind {
            Some(Kind::PlanRequested(_)) => "plan_requested",
            Some(Kind::PlanCreated(_)) => "plan_created",
            Some(Kind::TaskDispatched(_)) => "dispatched",
            Some(Kind::TaskSucceeded(_)) => "succeeded",
            Some(Kind::TaskFailed(_)) => "task_failed",
            Some(Kind::TaskRetrying(_)) => "retrying",
            Some(Kind::GoalCompleted(_)) => "completed",
            Some(Kind::GoalFailed(_)) => "goal_failed",
            Some(Kind::GoalCancelled(_)) => "cancelled",
            Some(Kind::GoalNeedsInput(_)) => "needs_input",
            _ => "other",
        })
        .collect()
}

fn node_statuses(s: &GoalState) -> Vec<i32> {
    s.nodes.iter().map(|n| n.status).collect()
}

fn text(mut s: GoalState) -> GoalState {
    s.spec = Some(hermes_proto::GoalSpec { text: "sum the sales".into(), ..Default::default() });
    s
}

fn one_node() -> GoalState {
    running(TaskPlan {
        nodes: vec![TaskNode {
            id: "a".into(),
            task_type: "t".into(),
            inputs_json: "{}".into(),
            ..Default::default()
        }],
        ..Default::default()
    })
}

#[test]
fn budgets_end_the_goal_once_spent_and_not_before() {
    let priced = Limits { prices: Prices { input_per_mtok: 1.0, output_per_mtok: 1.0 }, ..LIMITS };
    // (max tokens, max cost in USD, input tokens, output tokens, the goal fails)
    let cases = [
        (100, 0.0, 60, 30, false),
        (100, 0.0, 60, 50, true),
        (0, 0.0001, 50, 40, false),
        (0, 0.0001, 80, 40, true),
        (0, 0.0, 1_000_000, 1_000_000, false),
    ];
    for (max_tokens, max_cost_usd, input, output, fails) in cases {
        let mut s = state();
        s.spec = Some(hermes_proto::GoalSpec { max_tokens, max_cost_usd, ..Default::default() });
        dispatch_ready(&mut s, priced, 10, &mut Effects::default());
        let mut result = ok("a", 1, json!({"v": 1}));
        result.tokens = Some(TokenUsage { input_tokens: input, output_tokens: output });
        let mut fx = Effects::default();
        apply_result(&mut s, &result, priced, 11, &mut fx);
        let case = format!("{max_tokens} tokens / ${max_cost_usd}, used {input}+{output}");
        assert_eq!(s.status == GoalStatus::Failed as i32, fails, "{case}");
        assert_eq!(
            s.tokens.as_ref().map(|t| t.input_tokens + t.output_tokens),
            Some(input + output),
            "{case}"
        );
        if fails {
            assert_eq!(s.error.as_ref().unwrap().code, ErrorCode::BudgetExceeded.as_str(), "{case}");
            assert_eq!(kinds(&fx).last(), Some(&"goal_failed"), "{case}");
            let expected =
                [NodeStatus::Succeeded, NodeStatus::Cancelled, NodeStatus::Skipped].map(|n| n as i32);
            assert_eq!(node_statuses(&s), expected, "{case}");
        } else {
            assert_eq!(s.status, GoalStatus::Running as i32, "{case}");
        }
    }
}

#[test]
fn cancel_cancels_running_nodes_skips_the_rest_and_happens_once() {
    let mut s = state();
    dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
    apply_result(&mut s, &ok("a", 1, json!({"v": 1})), LIMITS, 11, &mut Effects::default());
    let mut fx = Effects::default();
    assert!(cancel(&mut s, "the user asked", 20, &mut fx));
    assert_eq!(s.status, GoalStatus::Cancelled as i32);
    let expected = [NodeStatus::Succeeded, NodeStatus::Cancelled, NodeStatus::Skipped].map(|n| n as i32);
    assert_eq!(node_statuses(&s), expected);
    assert_eq!(s.nodes[1].finished_unix_ms, 20);
    assert!(fx.stop_agents, "agents running the cancelled node are told to stop");
    assert_eq!(kinds(&fx), ["cancelled"]);
    for _ in 0..2 {
        let mut fx = Effects::default();
        assert!(!cancel(&mut s, "again", 30, &mut fx));
        assert!(fx.events.is_empty() && fx.tasks.is_empty());
    }
    assert_eq!(next_deadline(&s, LIMITS), None);
}

#[test]
fn planning_takes_only_the_answer_to_its_own_request() {
    let mut s =
        text(GoalState { goal_id: "g-1".into(), status: GoalStatus::Running as i32, ..Default::default() });
    let mut fx = Effects::default();
    start_planning(&mut s, 1, &mut fx);
    assert_eq!(s.status, GoalStatus::Planning as i32);
    assert_eq!(kinds(&fx), ["plan_requested"]);
    assert_eq!(fx.plan_requests.len(), 1);
    let request = s.plan_request_id.clone();
    assert!(awaits_plan(&s, &request) && !awaits_plan(&s, "g-1:other"));
    let plan = state().plan.unwrap();
    // Answers to another request change nothing, whatever they say.
    let mut fx = Effects::default();
    let error = wire_error(ErrorCode::PlanInvalid, "no plan");
    let stale = [
        apply_plan(&mut s, "g-1:other", valid(&plan, vec![]), vec![], LIMITS, 2, &mut fx),
        needs_input(&mut s, "g-1:other", "which month?", 2, &mut fx),
        plan_failed(&mut s, "g-1:other", error, 2, &mut fx),
    ];
    assert_eq!(stale, [Applied::Stale, Applied::Stale, Applied::Stale]);
    assert!(fx.events.is_empty() && fx.tasks.is_empty());
    assert_eq!(s.status, GoalStatus::Planning as i32);
    // Its own answer starts the goal.
    let mut fx = Effects::default();
    let groups = vec![vec!["a".to_owned(), "b".to_owned()], vec!["c".to_owned()]];
    assert_eq!(
        apply_plan(&mut s, &request, valid(&plan, groups), vec![], LIMITS, 3, &mut fx),
        Applied::Changed
    );
    assert_eq!(s.status, GoalStatus::Running as i32);
    assert_eq!(kinds(&fx), ["plan_created", "dispatched", "dispatched"]);
    // A second answer to the same request comes too late.
    assert_eq!(
        apply_plan(&mut s, &request, valid(&plan, vec![]), vec![], LIMITS, 4, &mut Effects::default()),
        Applied::Stale
    );
}

#[test]
fn a_planner_ends_a_goal_with_a_question_or_an_error() {
    // (what the planner said, the goal's status after, its terminal event)
    let cases =
        [("question", GoalStatus::NeedsInput, "needs_input"), ("error", GoalStatus::Failed, "goal_failed")];
    for (said, status, event) in cases {
        let mut s = text(GoalState {
            goal_id: "g-1".into(),
            status: GoalStatus::Running as i32,
            ..Default::default()
        });
        start_planning(&mut s, 1, &mut Effects::default());
        let request = s.plan_request_id.clone();
        let mut fx = Effects::default();
        let applied = match said {
            "question" => needs_input(&mut s, &request, "which month?", 5, &mut fx),
            _ => {
                plan_failed(&mut s, &request, wire_error(ErrorCode::PlanInvalid, "no valid plan"), 5, &mut fx)
            }
        };
        assert_eq!(applied, Applied::Changed, "{said}");
        assert_eq!(s.status, status as i32, "{said}");
        assert_eq!(kinds(&fx).last(), Some(&event), "{said}");
        assert!(is_terminal(s.status) && next_deadline(&s, LIMITS).is_none(), "{said}");
    }
}

#[test]
fn a_failed_node_is_replanned_only_for_text_goals_with_a_planner_and_only_so_often() {
    let planner = Limits { planner: true, ..LIMITS };
    // (given as text, a planner serves, replans already spent, the goal's status after)
    let cases = [
        (true, true, 0, GoalStatus::Replanning),
        (true, true, MAX_REPLANS, GoalStatus::Failed),
        (false, true, 0, GoalStatus::Failed),
        (true, false, 0, GoalStatus::Failed),
    ];
    for (is_text, serves, replans, after) in cases {
        let limits = if serves { planner } else { LIMITS };
        let mut s = if is_text { text(state()) } else { state() };
        dispatch_ready(&mut s, limits, 10, &mut Effects::default());
        s.nodes[0].replans = replans;
        let mut fx = Effects::default();
        apply_result(&mut s, &failed("a", 1, ErrorCode::ToolError), limits, 11, &mut fx);
        let case = format!("text {is_text}, planner {serves}, replans {replans}");
        assert_eq!(s.status, after as i32, "{case}");
        assert_eq!(fx.plan_requests.len(), usize::from(after == GoalStatus::Replanning), "{case}");
        if after == GoalStatus::Failed {
            assert_eq!(s.error.as_ref().unwrap().node_id, "a", "{case}");
            assert_eq!(kinds(&fx).last(), Some(&"goal_failed"), "{case}");
        }
    }
}

#[test]
fn a_text_goal_with_a_summarizer_completes_with_its_answer() {
    let summarizer = Limits { summarizer: true, ..LIMITS };
    // (given as text, a summarizer serves, summarizing before it completes)
    for (is_text, serves, summarizes) in [(true, true, true), (false, true, false), (true, false, false)] {
        let limits = if serves { summarizer } else { LIMITS };
        let mut s = if is_text { text(one_node()) } else { one_node() };
        dispatch_ready(&mut s, limits, 10, &mut Effects::default());
        let mut fx = Effects::default();
        apply_result(&mut s, &ok("a", 1, json!({"total": 7})), limits, 11, &mut fx);
        let case = format!("text {is_text}, summarizer {serves}");
        assert_eq!(fx.summarize, summarizes, "{case}");
        if summarizes {
            assert_eq!(s.status, GoalStatus::Summarizing as i32, "{case}");
            assert!(!kinds(&fx).contains(&"completed"), "{case}");
            let mut fx = Effects::default();
            let answer = json!("The total is 7.").to_string();
            assert_eq!(finish_summary(&mut s, answer.clone(), 12, &mut fx), Applied::Changed);
            assert_eq!((s.status, s.output_json.as_str()), (GoalStatus::Completed as i32, answer.as_str()));
            assert_eq!(kinds(&fx), ["completed"]);
        } else {
            assert_eq!(s.status, GoalStatus::Completed as i32, "{case}");
        }
        // An answer for a goal that is not summarizing is stale.
        assert_eq!(
            finish_summary(&mut s, "late".into(), 13, &mut Effects::default()),
            Applied::Stale,
            "{case}"
        );
    }
}

#[test]
fn deadlines_time_out_attempts_then_the_goal() {
    let fresh = || {
        let mut s = state();
        s.deadline_unix_ms = 20_000;
        dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
        s
    };
    let node_due = 10 + LIMITS.node_timeout_ms + NODE_DEADLINE_GRACE_MS;
    assert_eq!(next_deadline(&fresh(), LIMITS), Some(node_due));
    // (now, nodes waiting on a human, the goal's status after, attempts of a and b after)
    let cases: [(u64, &[&str], GoalStatus, [u32; 2]); 4] = [
        (node_due - 1, &[], GoalStatus::Running, [1, 1]),
        (node_due, &[], GoalStatus::Running, [2, 2]),
        (node_due, &["a"], GoalStatus::Running, [1, 2]),
        (20_000, &[], GoalStatus::Failed, [1, 1]),
    ];
    for (now, human, status, attempts) in cases {
        let mut s = fresh();
        let mut fx = Effects::default();
        let applied = expire(&mut s, LIMITS, now, &mut fx, &|node| human.contains(&node));
        let case = format!("at {now}, waiting on a human: {human:?}");
        assert_eq!(s.status, status as i32, "{case}");
        assert_eq!([s.nodes[0].attempt, s.nodes[1].attempt], attempts, "{case}");
        assert_eq!(applied == Applied::Changed, now >= node_due, "{case}");
        if status == GoalStatus::Failed {
            assert_eq!(s.error.as_ref().unwrap().code, ErrorCode::Timeout.as_str(), "{case}");
            assert_eq!(s.nodes[0].status, NodeStatus::Failed as i32, "{case}");
            assert_eq!(s.nodes[2].status, NodeStatus::Skipped as i32, "{case}");
            assert_eq!(expire(&mut s, LIMITS, now + 1, &mut Effects::default(), &|_| false), Applied::Stale);
        }
    }
}

#[test]
fn reassignment_moves_the_current_attempt_only() {
    let mut s = state();
    dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
    // (node, task id, applied)
    let cases = [
        ("a", "g-1.a.9", Applied::Stale),
        ("zz", "g-1.zz.1", Applied::Stale),
        ("a", "g-1.a.1", Applied::Changed),
    ];
    for (node, task, expected) in cases {
        let mut fx = Effects::default();
        assert_eq!(
            reassign(&mut s, node, task, "agent x went offline", LIMITS, 11, &mut fx),
            expected,
            "{task}"
        );
        if expected == Applied::Changed {
            assert_eq!(kinds(&fx)[0], "retrying");
            assert_eq!(fx.tasks.iter().map(|t| t.task_id.as_str()).collect::<Vec<_>>(), ["g-1.a.2"]);
        } else {
            assert!(fx.events.is_empty() && fx.tasks.is_empty(), "{task}");
        }
    }
    // The moved attempt's late result and a second move of it are stale.
    assert_eq!(
        apply_result(&mut s, &ok("a", 1, json!({"v": 1})), LIMITS, 12, &mut Effects::default()),
        Applied::Stale
    );
    assert_eq!(
        reassign(&mut s, "a", "g-1.a.1", "again", LIMITS, 12, &mut Effects::default()),
        Applied::Stale
    );
    assert_eq!(s.status, GoalStatus::Running as i32);
}

#[test]
fn failing_an_attempt_fails_the_goal_only_for_the_current_attempt() {
    for (task, fails) in [("g-1.b.2", false), ("g-1.b.1", true)] {
        let mut s = state();
        dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
        let mut fx = Effects::default();
        let error = wire_error(ErrorCode::PoisonMessage, "delivered 5 times");
        let applied = fail_attempt(&mut s, "b", task, error, 11, &mut fx);
        assert_eq!(applied == Applied::Changed, fails, "{task}");
        assert_eq!(s.status == GoalStatus::Failed as i32, fails, "{task}");
        if fails {
            assert_eq!(s.error.as_ref().unwrap().node_id, "b");
            let expected = [NodeStatus::Cancelled, NodeStatus::Failed, NodeStatus::Skipped].map(|n| n as i32);
            assert_eq!(node_statuses(&s), expected);
        }
    }
}

fn valid(plan: &TaskPlan, groups: Vec<Vec<String>>) -> hermes_core::plan::ValidatedPlan {
    hermes_core::plan::ValidatedPlan { plan: plan.clone(), groups }
}
