//! The planner never runs a plan the model did not write: answers cut short, with unknown or
//! conflicting fields, are asked again naming the problem; answers that are fine but oddly
//! wrapped (tool-call arguments, reasoning blocks, prose with braces, a JSON-encoded string, a
//! placeholder `needs_input`, a replan repeating kept nodes) are taken on the first ask. Each
//! test counts the model requests.

use hermes_proto::event::Kind;
use hermes_proto::{Event, PlanCreated};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use hermes_tests::kind_name;
use serde_json::{Value, json};

use crate::planning::{
    PLANNER, SUMMARIZER, answer, failing_plan, last_user_message, run_multiply_agent, stack, submit_text,
};

/// Two sums in parallel and their difference: the difference must wait for both.
fn plan() -> Value {
    json!({
        "reasoning": "two sums, then their difference",
        "nodes": [
            {"id": "a", "task_type": "math.evaluate", "inputs": {"expression": "40 + 2"}},
            {"id": "b", "task_type": "math.evaluate", "inputs": {"expression": "10 + 5"}},
            {"id": "diff", "task_type": "math.evaluate", "inputs": {"expression": "x - y"}, "depends_on": ["a", "b"]}
        ],
        "output_node": "diff"
    })
}

/// The plan above with `$ref`s, so `diff` computes from the sums: 42 - 15 = 27.
fn plan_with_refs() -> Value {
    let mut plan = plan();
    plan["nodes"][2]["inputs"] =
        json!({"expression": "x - y", "variables": {"x": {"$ref": "a.value"}, "y": {"$ref": "b.value"}}});
    plan
}

/// Runs one text goal against `answers` (planner answers, in order) and a summary; returns the
/// events, the planner requests, and the goal's `PlanCreated`.
async fn run(answers: Vec<ScriptedResponse>) -> (Vec<Event>, Vec<Value>, Option<PlanCreated>) {
    let llm = ScriptedLlm::start().await;
    for a in answers {
        llm.push(PLANNER, a);
    }
    llm.push(SUMMARIZER, answer("The difference is 27.", &["diff"]));
    let mut t = stack(&llm).await;
    let goal_id = submit_text(&mut t, "What is (40 + 2) minus (10 + 5)?").await;
    let events = t.events(&goal_id).await;
    t.stop().await;
    let created = events.iter().find_map(|e| match &e.kind {
        Some(Kind::PlanCreated(p)) => Some(p.clone()),
        _ => None,
    });
    (events, llm.requests_for(PLANNER), created)
}

/// The value the output node computed.
fn output_value(events: &[Event]) -> Value {
    let names: Vec<String> = events.iter().map(kind_name).collect();
    let Some(Kind::GoalCompleted(_)) = &events.last().unwrap().kind else {
        panic!("not completed: {names:?}")
    };
    events
        .iter()
        .rev()
        .find_map(|e| match &e.kind {
            Some(Kind::TaskSucceeded(s)) if s.node_id == "diff" => {
                serde_json::from_str::<Value>(&s.output_json).ok().map(|o| o["value"].clone())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("diff never succeeded: {names:?}"))
}

/// A goal asked twice: the first answer refused with `problem` named in the correction.
async fn asked_again(first: ScriptedResponse, problem: &str) {
    let (events, requests, _) =
        run(vec![first, ScriptedResponse::content(plan_with_refs().to_string())]).await;
    assert_eq!(output_value(&events), json!(27.0));
    assert_eq!(requests.len(), 2, "one refused answer, one accepted");
    let feedback = last_user_message(&requests[1]);
    assert!(feedback.contains(problem), "the correction names `{problem}`: {feedback}");
}

/// A goal planned on the first ask; returns the plan event.
async fn taken_at_once(first: ScriptedResponse) -> PlanCreated {
    let (events, requests, created) = run(vec![first]).await;
    assert_eq!(output_value(&events), json!(27.0));
    assert_eq!(requests.len(), 1, "no correction round trip");
    created.expect("a PlanCreated event")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_cut_at_the_token_limit_is_asked_again_not_closed_up() {
    // Complete-looking JSON, but the server says it stopped at the limit.
    let cut = ScriptedResponse::content(plan().to_string()).with_finish_reason("length");
    asked_again(cut, "cut off at the output token limit").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_answer_cut_between_two_nodes_is_asked_again_not_run_short() {
    let nodes = &plan_with_refs()["nodes"];
    let cut = format!(
        r#"{{"reasoning": "two sums, then their difference", "nodes": [{}, {}, "#,
        nodes[0], nodes[1]
    );
    asked_again(ScriptedResponse::content(cut), "cut off before the JSON was complete").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deps_depends_on_and_output_node_aliases_are_read_and_recorded() {
    let aliased = json!({
        "reasoning": "two sums, then their difference",
        "nodes": [
            {"id": "a", "task_type": "math.evaluate", "inputs": {"expression": "40 + 2"}},
            {"id": "b", "task_type": "math.evaluate", "inputs": {"expression": "10 + 5"}, "dependsOn": ["a"]},
            {"id": "diff", "task_type": "math.evaluate", "deps": ["a", "b"],
             "inputs": {"expression": "x - y", "variables": {"x": {"$ref": "a.value"}, "y": {"$ref": "b.value"}}}}
        ],
        "outputNode": "diff"
    });
    let created = taken_at_once(ScriptedResponse::content(aliased.to_string())).await;
    let plan = created.plan.unwrap();
    assert_eq!(plan.output_node, "diff");
    let b = plan.nodes.iter().find(|n| n.id == "b").unwrap();
    assert_eq!(b.depends_on, ["a"], "the dependency survived");
    let groups: Vec<Vec<String>> = created.groups.into_iter().map(|g| g.node_ids).collect();
    assert_eq!(groups, [vec!["a".to_owned()], vec!["b".to_owned()], vec!["diff".to_owned()]]);
    for alias in ["`dependsOn`", "`deps`", "`outputNode`"] {
        assert!(created.repairs.iter().any(|r| r.contains(alias)), "{alias} recorded: {:?}", created.repairs);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_field_is_asked_again_by_name_not_dropped() {
    let mut with_note = plan_with_refs();
    with_note["nodes"][2]["after"] = json!(["a", "b"]);
    asked_again(ScriptedResponse::content(with_note.to_string()), "unknown field `after` in node `diff`")
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn conflicting_duplicate_keys_are_asked_again_by_name() {
    let text = plan_with_refs().to_string().replacen(
        r#""output_node":"diff""#,
        r#""output_node":"diff","output_node":"a""#,
        1,
    );
    asked_again(ScriptedResponse::content(text), "duplicate key `output_node`").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_in_the_tool_call_arguments_is_taken_beside_empty_content() {
    let call = ScriptedResponse::tool_call_with_content(Some(""), "task_plan", &plan_with_refs().to_string());
    let created = taken_at_once(call).await;
    assert!(created.repairs.iter().any(|r| r.contains("tool call")), "{:?}", created.repairs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_plan_in_the_tool_call_arguments_is_taken_beside_prose_content() {
    let call = ScriptedResponse::tool_call_with_content(
        Some("I will call the planner tool with {the plan}."),
        "task_plan",
        &plan_with_refs().to_string(),
    );
    taken_at_once(call).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn braces_inside_a_think_block_are_ignored() {
    let text = format!(
        "<think>The user wants {{x}} - {{y}}. Maybe {{\"nodes\": []}}? No: two sums first.</think>\n{}",
        plan_with_refs()
    );
    let created = taken_at_once(ScriptedResponse::content(text)).await;
    assert!(created.repairs.iter().any(|r| r == "reasoning_block"), "{:?}", created.repairs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn braces_in_prose_after_the_plan_are_ignored() {
    let text = format!(
        "Here is the plan:\n{}\nEach {{\"$ref\": \"node.field\"}} is filled in from {{node}}'s output.",
        plan_with_refs()
    );
    taken_at_once(ScriptedResponse::content(text)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_double_encoded_plan_is_decoded() {
    let encoded = serde_json::to_string(&plan_with_refs().to_string()).unwrap();
    let created = taken_at_once(ScriptedResponse::content(encoded)).await;
    assert!(created.repairs.iter().any(|r| r == "double_encoded"), "{:?}", created.repairs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_placeholder_needs_input_beside_a_full_plan_gives_way_to_the_plan() {
    let mut with_na = plan_with_refs();
    with_na["needs_input"] = json!("N/A");
    let created = taken_at_once(ScriptedResponse::content(with_na.to_string())).await;
    assert!(created.repairs.iter().any(|r| r.contains("N/A")), "{:?}", created.repairs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replan_that_repeats_the_unaffected_nodes_unchanged_is_accepted() {
    let llm = ScriptedLlm::start().await;
    llm.push(PLANNER, ScriptedResponse::content(failing_plan().to_string()));
    // The whole plan again: `base` (completed) repeated as it was, `bad` fixed.
    let mut whole = failing_plan();
    whole["nodes"][1]["inputs"] = json!({"expression": "b + 1", "variables": {"b": {"$ref": "base.value"}}});
    llm.push(PLANNER, ScriptedResponse::content(whole.to_string()));
    llm.push(SUMMARIZER, answer("202", &["final"]));
    let mut t = stack(&llm).await;
    let goal_id = submit_text(&mut t, "Compute a value from 10 squared").await;
    let events = t.events(&goal_id).await;
    t.stop().await;
    let names: Vec<String> = events.iter().map(kind_name).collect();
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{names:?}");
    assert_eq!(llm.requests_for(PLANNER).len(), 2, "one plan, one replan, no correction");
    assert_eq!(names.iter().filter(|n| *n == "dispatched:base").count(), 1, "{names:?}");
    let patched = events
        .iter()
        .find_map(|e| match &e.kind {
            Some(Kind::PlanPatched(p)) => Some(p.clone()),
            _ => None,
        })
        .expect("a PlanPatched event");
    assert!(patched.repairs.iter().any(|r| r.contains("`base` repeated unchanged")), "{:?}", patched.repairs);
}

/// The agent loop on the same rules: arguments cut short, or with a field the tool does not
/// know, go back to the model naming the problem; the tool runs only on the complete call.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_tool_call_cut_short_or_with_an_unknown_argument_goes_back_to_the_model() {
    const AGENT: &str = "agent-model";
    let llm = ScriptedLlm::start().await;
    llm.push(AGENT, ScriptedResponse::tool_call("math__evaluate", r#"{"expression": "19 * 3", "varia"#));
    llm.push(
        AGENT,
        ScriptedResponse::tool_call("math__evaluate", r#"{"expression": "19 * 3"}"#)
            .with_finish_reason("length"),
    );
    llm.push(
        AGENT,
        ScriptedResponse::tool_call("math__evaluate", r#"{"expression": "19 * 3", "precision": 2}"#),
    );
    llm.push(AGENT, ScriptedResponse::tool_call("math__evaluate", r#"{"expression": "19 * 3"}"#));
    llm.push(AGENT, ScriptedResponse::content("The result is 57."));
    let mut t = stack(&llm).await;
    let (_, events) = run_multiply_agent(&mut t).await;
    t.stop().await;
    let Some(Kind::GoalCompleted(done)) = &events.last().unwrap().kind else {
        panic!("{:?}", events.iter().map(kind_name).collect::<Vec<_>>())
    };
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    assert_eq!(output["answer"], "The result is 57.");
    let requests = llm.requests_for(AGENT);
    assert_eq!(requests.len(), 5, "three refused calls, one run, one answer");
    let tool_message = |i: usize| -> String {
        requests[i]["messages"].as_array().unwrap().iter().rev().find(|m| m["role"] == "tool").unwrap()["content"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    assert!(tool_message(1).contains("cut off before the JSON was complete"), "{}", tool_message(1));
    assert!(tool_message(2).contains("cut off at the output token limit"), "{}", tool_message(2));
    assert!(tool_message(3).contains("unknown argument `precision`"), "{}", tool_message(3));
    let steps = output["steps"].as_array().unwrap();
    let ran: Vec<&Value> = steps.iter().filter(|s| s["ok"] == true).collect();
    assert_eq!(ran.len(), 1, "the tool ran once: {steps:?}");
    assert_eq!(ran[0]["output"]["value"], 57.0);
}
