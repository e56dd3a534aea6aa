//! A goal travels from a gRPC client through the dispatcher to executor agents and back.

use std::collections::BTreeMap;

use hermes_proto::event::Kind;
use hermes_proto::{GetGoalRequest, GoalSpec, GoalState, GoalStatus, ListGoalsRequest, NodeStatus};
use hermes_tests::{Sandbox, kind_name, node, repo_root};
use prost::Message as _;
use serde_json::{Value, json};

/// April and March totals and April's top three categories, computed straight from the CSV.
fn expected_sales() -> (f64, f64, Vec<(String, f64)>) {
    let mut reader = csv::Reader::from_path(repo_root().join("examples/data/sales.csv")).unwrap();
    let (mut april, mut march) = (0.0, 0.0);
    let mut by_category: BTreeMap<String, f64> = BTreeMap::new();
    for record in reader.records() {
        let record = record.unwrap();
        let amount: f64 = record[3].parse().unwrap();
        match &record[0] {
            "2026-04" => {
                april += amount;
                *by_category.entry(record[2].to_owned()).or_default() += amount;
            }
            "2026-03" => march += amount,
            _ => {}
        }
    }
    let mut top: Vec<(String, f64)> = by_category.into_iter().collect();
    top.sort_by(|a, b| b.1.total_cmp(&a.1));
    top.truncate(3);
    (april, march, top)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sales_report_plan_runs_end_to_end() {
    let mut t = Sandbox::start().await;
    let plan =
        hermes_cli::plan_file::load_plan(&repo_root().join("examples/plans/sales-report.yaml")).unwrap();
    let goal_id = t.submit(plan).await.expect("plan accepted");
    let events = t.events(&goal_id).await;

    // The report carries the numbers the CSV gives.
    let (april, march, top) = expected_sales();
    let change = (april - march) / march * 100.0;
    let Some(Kind::GoalCompleted(done)) = &events.last().unwrap().kind else {
        panic!("goal did not complete: {:?}", events.iter().map(kind_name).collect::<Vec<_>>());
    };
    let output: Value = serde_json::from_str(&done.output_json).unwrap();
    let text = output["text"].as_str().unwrap();
    assert!(text.contains(&format!("Total April sales: {april:.2} (March: {march:.2})")), "{text}");
    assert!(text.contains(&format!("Month-over-month change: {change:+.1}%")), "{text}");
    for (i, (category, amount)) in top.iter().enumerate() {
        assert!(text.contains(&format!("{}. {category}: {amount:.2}", i + 1)), "{text}");
    }

    // Events come in causal order.
    let names: Vec<String> = events.iter().map(kind_name).collect();
    let pos = |name: &str| {
        names.iter().position(|n| n == name).unwrap_or_else(|| panic!("{name} missing: {names:?}"))
    };
    assert_eq!(&names[..2], ["accepted", "plan"]);
    assert!(pos("dispatched:april") < pos("succeeded:april"));
    assert!(pos("succeeded:april") < pos("dispatched:change"));
    assert!(pos("succeeded:march") < pos("dispatched:change"));
    assert!(pos("succeeded:change") < pos("dispatched:report"));
    assert!(pos("succeeded:report") < pos("completed"));
    assert_eq!(names.len(), 2 + 4 * 2 + 1, "{names:?}");

    // The two independent nodes were in flight at the same time: both were dispatched before
    // either finished.
    let first_success = names.iter().position(|n| n.starts_with("succeeded:")).unwrap();
    assert!(pos("dispatched:april") < first_success && pos("dispatched:march") < first_success, "{names:?}");
    let goal = t.client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await.unwrap().into_inner();
    let node_state = |id: &str| goal.nodes.iter().find(|n| n.node_id == id).unwrap().clone();
    let (a, m) = (node_state("april"), node_state("march"));
    assert!(a.dispatched_unix_ms <= m.finished_unix_ms && m.dispatched_unix_ms <= a.finished_unix_ms);
    assert!(goal.nodes.iter().all(|n| n.status == NodeStatus::Succeeded as i32));

    // The durable state is in KV.
    let stored = t.bus.goals().get(&goal_id).await.unwrap().expect("goal in kv");
    let state = GoalState::decode(stored).unwrap();
    assert_eq!(state.status, GoalStatus::Completed as i32);
    assert_eq!(state.output_json, done.output_json);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn same_idempotency_key_gives_one_goal() {
    let mut t = Sandbox::start().await;
    let plan = hermes_proto::TaskPlan {
        nodes: vec![node("n", "math.evaluate", json!({"expression": "6 * 7"}), &[])],
        ..Default::default()
    };
    let spec = GoalSpec { plan: Some(plan), idempotency_key: "order-1234".into(), ..Default::default() };
    let (first, dup1) = t.submit_spec(spec.clone()).await.unwrap();
    let (second, dup2) = t.submit_spec(spec).await.unwrap();
    assert_eq!(first, second);
    assert!(!dup1);
    assert!(dup2);
    let events = t.events(&first).await;
    assert_eq!(events.iter().filter(|e| kind_name(e) == "accepted").count(), 1);
    assert_eq!(events.iter().filter(|e| kind_name(e) == "dispatched:n").count(), 1);
    let goals = t.client.list_goals(ListGoalsRequest { limit: 10 }).await.unwrap().into_inner().goals;
    assert_eq!(goals.len(), 1);
    assert_eq!(goals[0].output_json, json!({"value": 42.0}).to_string());
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failing_tool_fails_the_goal_with_its_typed_error() {
    let mut t = Sandbox::start().await;
    let plan = hermes_proto::TaskPlan {
        nodes: vec![
            node("read", "table.aggregate", json!({"path": "examples/data/missing.csv", "op": "count"}), &[]),
            node(
                "after",
                "math.evaluate",
                json!({"expression": "x", "variables": {"x": {"$ref": "read.total"}}}),
                &[],
            ),
        ],
        ..Default::default()
    };
    let goal_id = t.submit(plan).await.unwrap();
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().kind else { panic!("expected failure") };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.code, "INVALID_ARGUMENT");
    assert_eq!(error.node_id, "read");
    assert!(error.message.contains("missing.csv"), "{}", error.message);
    // Not retried: an argument error would fail the same way again.
    assert!(!events.iter().any(|e| kind_name(e).starts_with("retrying")));
    let goal = t.client.get_goal(GetGoalRequest { goal_id }).await.unwrap().into_inner();
    assert_eq!(goal.status, GoalStatus::Failed as i32);
    assert_eq!(goal.nodes[1].status, NodeStatus::Skipped as i32);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_stops_a_goal_and_watch_replays_finished_goals() {
    let mut t = Sandbox::start().await;
    let plan =
        hermes_proto::TaskPlan { nodes: vec![node("n", "time.now", json!({}), &[])], ..Default::default() };
    let goal_id = t.submit(plan).await.unwrap();
    let first = t.events(&goal_id).await;
    // A second watch of an ended goal replays the same events from the start and ends.
    let replay = t.events(&goal_id).await;
    assert_eq!(
        first.iter().map(kind_name).collect::<Vec<_>>(),
        replay.iter().map(kind_name).collect::<Vec<_>>()
    );

    // Cancelling an ended goal changes nothing.
    let goal = t
        .client
        .cancel_goal(hermes_proto::CancelGoalRequest { goal_id: goal_id.clone(), reason: "late".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(goal.status, GoalStatus::Completed as i32);

    let err = t.client.get_goal(GetGoalRequest { goal_id: "g-doesnotexist".into() }).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::NotFound);
    let err = t
        .client
        .watch_goal(hermes_proto::WatchGoalRequest { goal_id: "bad id!".into(), after_seq: 0 })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    t.stop().await;
}
