//! Goals given as text: planned by the planner model (the scripted OpenAI-compatible server, so
//! the real client runs), validated, corrected, executed, replanned on failure and answered.

use hermes_proto::event::Kind;
use hermes_proto::{GoalSpec, GoalState, GoalStatus};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use hermes_tests::{Sandbox, kind_name};
use prost::Message as _;
use serde_json::{Value, json};

pub(crate) const PLANNER: &str = "planner-model";
pub(crate) const SUMMARIZER: &str = "summarizer-model";

pub(crate) async fn stack(llm: &ScriptedLlm) -> Sandbox {
    Sandbox::builder().llm(llm.base_url()).start().await
}

pub(crate) async fn submit_text(t: &mut Sandbox, text: &str) -> String {
    let spec = GoalSpec { text: text.into(), ..Default::default() };
    t.submit_spec(spec).await.expect("text goal accepted").0
}

pub(crate) fn answer(text: &str, cited: &[&str]) -> ScriptedResponse {
    ScriptedResponse::content(json!({"answer": text, "cited_nodes": cited, "conflicts": []}).to_string())
        .with_usage(50, 20)
}

/// The last user message of a recorded request.
pub(crate) fn last_user_message(request: &Value) -> String {
    request["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "user").unwrap()["content"]
        .as_str()
        .unwrap()
        .to_owned()
}

async fn stored(t: &Sandbox, goal_id: &str) -> GoalState {
    GoalState::decode(t.bus.goals().get(goal_id).await.unwrap().unwrap()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_english_goal_is_planned_executed_and_answered() {
    let llm = ScriptedLlm::start().await;
    let plan = json!({
        "reasoning": "two independent sums, then their ratio",
        "nodes": [
            {"id": "q1", "task_type": "math.evaluate", "inputs": {"expression": "120 + 80"}},
            {"id": "q2", "task_type": "math.evaluate", "inputs": {"expression": "90 + 60"}},
            {"id": "ratio", "task_type": "math.evaluate", "inputs": {"expression": "a / b", "variables": {"a": {"$ref": "q1.value"}, "b": {"$ref": "q2.value"}}}}
        ],
        "output_node": "ratio"
    });
    llm.push(PLANNER, ScriptedResponse::content(plan.to_string()).with_usage(400, 120));
    llm.push(SUMMARIZER, answer("Q1 sales (200) were 1.33 times Q2 (150).", &["q1", "q2", "ratio", "ghost"]));
    let mut t = stack(&llm).await;
    let goal_id =
        submit_text(&mut t, "How much larger were Q1 sales (120 and 80) than Q2 sales (90 and 60)?").await;
    let events = t.events(&goal_id).await;
    let names: Vec<String> = events.iter().map(kind_name).collect();
    let Some(Kind::GoalCompleted(done)) = &events.last().unwrap().kind else { panic!("{names:?}") };
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output["answer"], "Q1 sales (200) were 1.33 times Q2 (150).");
    // Citations are kept only for nodes that exist.
    assert_eq!(output["cited_nodes"], json!(["q1", "q2", "ratio"]));
    assert!(
        names.iter().position(|n| n == "dispatched:q1").unwrap()
            < names.iter().position(|n| n == "succeeded:q1").unwrap()
    );

    // The planner saw the goal and the live catalogue; the summarizer saw the node outputs.
    let planner_request = &llm.requests_for(PLANNER)[0];
    let prompt = last_user_message(planner_request);
    assert!(prompt.contains("How much larger were Q1 sales"), "{prompt}");
    assert_eq!(planner_request["response_format"]["type"], "json_schema");
    let system = planner_request["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("# Catalogue")
            && system.contains("math.evaluate")
            && system.contains("table.aggregate")
    );
    for section in ["# Role", "# Decomposition rules", "# Tool rules", "# Output format"] {
        assert!(system.contains(section), "missing {section}");
    }
    let summary_prompt = last_user_message(&llm.requests_for(SUMMARIZER)[0]);
    assert!(summary_prompt.contains("node `ratio`") && summary_prompt.contains("1.333"), "{summary_prompt}");

    // Tokens of both model calls are recorded on the goal.
    let state = stored(&t, &goal_id).await;
    let tokens = state.tokens.unwrap();
    assert_eq!((tokens.input_tokens, tokens.output_tokens), (450, 140));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_chinese_goal_with_a_fenced_full_width_plan_is_repaired_and_run() {
    let llm = ScriptedLlm::start().await;
    let messy = "好的，计划如下：\n```json\n｛“reasoning”：“先算总数”，“nodes”：［｛“id”：“total”，“task_type”：“math.evaluate”，“inputs”：｛“expression”：“3 * 7”，｝，｝，］，“output_node”：“total”，｝\n```";
    llm.push(PLANNER, ScriptedResponse::content(messy));
    llm.push(SUMMARIZER, answer("总数是 21。", &["total"]));
    let mut t = stack(&llm).await;
    let goal_id = submit_text(&mut t, "计算三乘以七的结果").await;
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalCompleted(done)) = &events.last().unwrap().kind else {
        panic!("goal did not complete")
    };
    assert_eq!(serde_json::from_str::<Value>(&done.output_json).unwrap()["answer"], "总数是 21。");
    // Accepted on the first answer: no correction round trip.
    assert_eq!(llm.requests_for(PLANNER).len(), 1);
    let plan_event = events.iter().find_map(|e| match &e.kind {
        Some(Kind::TaskSucceeded(s)) => Some(s.output_json.clone()),
        _ => None,
    });
    assert_eq!(plan_event.unwrap(), json!({"value": 21.0}).to_string());
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_hallucinated_task_type_is_corrected_on_the_second_ask() {
    let llm = ScriptedLlm::start().await;
    let invented = json!({"nodes": [{"id": "s", "task_type": "web.search", "inputs": {"q": "weather"}}]});
    let fixed = json!({"nodes": [{"id": "s", "task_type": "time.now", "inputs": {}}], "output_node": "s"});
    llm.push(PLANNER, ScriptedResponse::content(invented.to_string()));
    llm.push(PLANNER, ScriptedResponse::content(fixed.to_string()));
    llm.push(SUMMARIZER, answer("It is now.", &["s"]));
    let mut t = stack(&llm).await;
    let goal_id = submit_text(&mut t, "What time is it?").await;
    let events = t.events(&goal_id).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))));
    let requests = llm.requests_for(PLANNER);
    assert_eq!(requests.len(), 2);
    let feedback = last_user_message(&requests[1]);
    assert!(feedback.contains("unknown task type `web.search`"), "{feedback}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cyclic_plan_is_rejected_and_corrected() {
    let llm = ScriptedLlm::start().await;
    let cyclic = json!({"nodes": [
        {"id": "a", "task_type": "math.evaluate", "inputs": {"expression": "1"}, "depends_on": ["b"]},
        {"id": "b", "task_type": "math.evaluate", "inputs": {"expression": "2"}, "depends_on": ["a"]}
    ]});
    let fixed = json!({"nodes": [
        {"id": "a", "task_type": "math.evaluate", "inputs": {"expression": "1"}},
        {"id": "b", "task_type": "math.evaluate", "inputs": {"expression": "2"}, "depends_on": ["a"]}
    ], "output_node": "b"});
    llm.push(PLANNER, ScriptedResponse::content(cyclic.to_string()));
    llm.push(PLANNER, ScriptedResponse::content(fixed.to_string()));
    llm.push(SUMMARIZER, answer("2", &["b"]));
    let mut t = stack(&llm).await;
    let goal_id = submit_text(&mut t, "Compute one, then two").await;
    let events = t.events(&goal_id).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))));
    let feedback = last_user_message(&llm.requests_for(PLANNER)[1]);
    assert!(feedback.contains("cycle"), "{feedback}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn plans_still_invalid_after_two_corrections_fail_with_plan_invalid() {
    let llm = ScriptedLlm::start().await;
    for _ in 0..3 {
        let bad = json!({"nodes": [{"id": "x", "task_type": "email.send", "inputs": {}}]});
        llm.push(PLANNER, ScriptedResponse::content(bad.to_string()));
    }
    let mut t = stack(&llm).await;
    let goal_id = submit_text(&mut t, "Email the report").await;
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().kind else { panic!("goal should fail") };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.code, "PLAN_INVALID");
    assert!(
        error.message.contains("after 2 corrections") && error.message.contains("email.send"),
        "{}",
        error.message
    );
    assert_eq!(llm.requests_for(PLANNER).len(), 3);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_impossible_goal_ends_in_needs_input() {
    let llm = ScriptedLlm::start().await;
    llm.push(PLANNER, ScriptedResponse::content(r#"{"needs_input": "No available task type can send email. Which tool should deliver the report?"}"#));
    let mut t = stack(&llm).await;
    let goal_id = submit_text(&mut t, "Email the April report to the board").await;
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalNeedsInput(needs)) = &events.last().unwrap().kind else {
        panic!("{:?}", events.iter().map(kind_name).collect::<Vec<_>>())
    };
    assert!(needs.explanation.contains("send email"));
    let state = stored(&t, &goal_id).await;
    assert_eq!(state.status, GoalStatus::NeedsInput as i32);
    assert!(state.nodes.is_empty(), "no tool was invented or run");
    t.stop().await;
}

pub(crate) fn failing_plan() -> Value {
    json!({"nodes": [
        {"id": "base", "task_type": "math.evaluate", "inputs": {"expression": "10 * 10"}},
        {"id": "bad", "task_type": "math.evaluate", "inputs": {"expression": "missing_var + 1"}, "depends_on": ["base"]},
        {"id": "final", "task_type": "math.evaluate", "inputs": {"expression": "x * 2", "variables": {"x": {"$ref": "bad.value"}}}}
    ], "output_node": "final"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_node_is_replanned_and_only_its_subgraph_runs_again() {
    let llm = ScriptedLlm::start().await;
    llm.push(PLANNER, ScriptedResponse::content(failing_plan().to_string()));
    let patch = json!({"reasoning": "give the variable explicitly", "nodes": [
        {"id": "bad", "task_type": "math.evaluate", "inputs": {"expression": "b + 1", "variables": {"b": {"$ref": "base.value"}}}},
        {"id": "final", "task_type": "math.evaluate", "inputs": {"expression": "x * 2", "variables": {"x": {"$ref": "bad.value"}}}}
    ], "output_node": "final"});
    llm.push(PLANNER, ScriptedResponse::content(patch.to_string()));
    llm.push(SUMMARIZER, answer("202", &["final"]));
    let mut t = stack(&llm).await;
    let goal_id = submit_text(&mut t, "Compute a value from 10 squared").await;
    let events = t.events(&goal_id).await;
    let names: Vec<String> = events.iter().map(kind_name).collect();
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{names:?}");
    let count = |name: &str| names.iter().filter(|n| *n == name).count();
    // The completed node ran once; the failed node twice (original and replacement); its
    // dependent only after the replan.
    assert_eq!(count("dispatched:base"), 1, "{names:?}");
    assert_eq!(count("dispatched:bad"), 2, "{names:?}");
    assert_eq!(count("dispatched:final"), 1, "{names:?}");
    let patched = events.iter().find_map(|e| match &e.kind {
        Some(Kind::PlanPatched(p)) => Some(p.clone()),
        _ => None,
    });
    let patched = patched.expect("a PlanPatched event");
    assert_eq!(patched.failed_node_id, "bad");
    // The replan request carried the failure and the completed node's output.
    let replan_prompt = last_user_message(&llm.requests_for(PLANNER)[1]);
    assert!(
        replan_prompt.contains("Node `bad` failed") && replan_prompt.contains("missing_var"),
        "{replan_prompt}"
    );
    assert!(
        replan_prompt.contains("base (math.evaluate)") && replan_prompt.contains("100"),
        "{replan_prompt}"
    );
    let state = stored(&t, &goal_id).await;
    let final_node = state.nodes.iter().find(|n| n.node_id == "final").unwrap();
    assert_eq!(final_node.output_json, json!({"value": 202.0}).to_string());
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_third_failure_of_the_same_node_ends_the_goal_with_the_chain_of_errors() {
    let llm = ScriptedLlm::start().await;
    llm.push(PLANNER, ScriptedResponse::content(failing_plan().to_string()));
    for n in 0..2 {
        let patch = json!({"nodes": [
            {"id": "bad", "task_type": "math.evaluate", "inputs": {"expression": format!("still_missing_{n} + 1")}},
            {"id": "final", "task_type": "math.evaluate", "inputs": {"expression": "x * 2", "variables": {"x": {"$ref": "bad.value"}}}}
        ]});
        llm.push(PLANNER, ScriptedResponse::content(patch.to_string()));
    }
    let mut t = stack(&llm).await;
    let goal_id = submit_text(&mut t, "Compute something that cannot work").await;
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().kind else { panic!("goal should fail") };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.node_id, "bad");
    assert!(error.message.contains("failed 3 times and was replanned 2 times"), "{}", error.message);
    for var in ["missing_var", "still_missing_0", "still_missing_1"] {
        assert!(error.message.contains(var), "{var} missing from {}", error.message);
    }
    assert_eq!(llm.requests_for(PLANNER).len(), 3, "one plan and two replans, no third");
    t.stop().await;
}

/// Submits one `agent.run` node told to multiply 19 by 3 with `math.evaluate`, and waits for
/// its end; returns the goal id and its events.
pub(crate) async fn run_multiply_agent(t: &mut Sandbox) -> (String, Vec<hermes_proto::Event>) {
    let plan = hermes_proto::TaskPlan {
        nodes: vec![hermes_tests::node(
            "think",
            "agent.run",
            json!({"instruction": "Multiply 19 by 3", "tools": ["math.evaluate"]}),
            &[],
        )],
        ..Default::default()
    };
    let goal_id = t.submit(plan).await.expect("agent.run is a known task type");
    let events = t.events(&goal_id).await;
    (goal_id, events)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_node_runs_its_tool_loop_through_the_stack() {
    let llm = ScriptedLlm::start().await;
    llm.push("agent-model", ScriptedResponse::tool_call("math__evaluate", r#"{"expression": "19 * 3"}"#));
    llm.push("agent-model", ScriptedResponse::content("The result is 57."));
    let mut t = stack(&llm).await;
    let (_, events) = run_multiply_agent(&mut t).await;
    let Some(Kind::GoalCompleted(done)) = &events.last().unwrap().kind else {
        panic!("{:?}", events.iter().map(kind_name).collect::<Vec<_>>())
    };
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output["answer"], "The result is 57.");
    assert_eq!(output["steps"][0]["tool"], "math.evaluate");
    assert_eq!(output["steps"][0]["output"]["value"], 57.0);
    // The call also appeared on the goal's event stream while it happened.
    let called: Vec<_> = events
        .iter()
        .filter_map(|e| match &e.kind {
            Some(Kind::ToolCalled(c)) => Some(c.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(called.len(), 1, "{:?}", events.iter().map(kind_name).collect::<Vec<_>>());
    assert_eq!(
        (called[0].node_id.as_str(), called[0].tool.as_str(), called[0].ok),
        ("think", "math.evaluate", true)
    );
    assert!(called[0].arguments_json.contains("19 * 3"));
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_goal_over_its_token_budget_fails_and_records_what_it_spent() {
    let llm = ScriptedLlm::start().await;
    llm.push(
        "agent-model",
        ScriptedResponse::tool_call("math__evaluate", r#"{"expression": "19 * 3"}"#).with_usage(600, 50),
    );
    llm.push("agent-model", ScriptedResponse::content("The result is 57.").with_usage(700, 20));
    let prices = hermes_dispatcher::engine::Prices { input_per_mtok: 3.0, output_per_mtok: 15.0 };
    let mut t = Sandbox::builder().llm(llm.base_url()).prices(prices).start().await;
    let plan = hermes_proto::TaskPlan {
        nodes: vec![
            hermes_tests::node("think", "agent.run", json!({"instruction": "Multiply 19 by 3"}), &[]),
            hermes_tests::node("after", "math.evaluate", json!({"expression": "1 + 1"}), &["think"]),
        ],
        ..Default::default()
    };
    // A cost budget that cannot be a number of dollars is refused at submit.
    let bad = GoalSpec { plan: Some(plan.clone()), max_cost_usd: -1.0, ..Default::default() };
    let refused = t.submit_spec(bad).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("max_cost_usd"), "{}", refused.message());

    let spec = GoalSpec { plan: Some(plan), max_tokens: 1000, max_cost_usd: 1.0, ..Default::default() };
    let (goal_id, _) = t.submit_spec(spec).await.unwrap();
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().kind else {
        panic!("{:?}", events.iter().map(kind_name).collect::<Vec<_>>())
    };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.code, "BUDGET_EXCEEDED");
    assert_eq!(error.message, "the goal used 1370 tokens, over its budget of 1000");
    let state = stored(&t, &goal_id).await;
    let tokens = state.tokens.unwrap();
    assert_eq!((tokens.input_tokens, tokens.output_tokens), (1300, 70));
    assert!((state.cost_usd - (1300.0 * 3.0 + 70.0 * 15.0) / 1e6).abs() < 1e-12, "{}", state.cost_usd);
    let think = state.nodes.iter().find(|n| n.node_id == "think").unwrap();
    assert_eq!(think.tokens.unwrap().input_tokens, 1300);
    let after = state.nodes.iter().find(|n| n.node_id == "after").unwrap();
    assert_eq!(after.status, hermes_proto::NodeStatus::Skipped as i32, "nothing runs past the budget");
    // The client sees the spend and the budget.
    let goal = t.client.get_goal(hermes_proto::GetGoalRequest { goal_id }).await.unwrap().into_inner();
    assert_eq!((goal.max_tokens, goal.max_cost_usd), (1000, 1.0));
    assert_eq!(goal.tokens.unwrap().output_tokens, 70);
    t.stop().await;
}
