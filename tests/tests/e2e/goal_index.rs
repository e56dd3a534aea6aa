//! Goal lists through the goal index (`crates/dispatcher/src/goal_index.rs`): a goal is listed
//! under its current status only, the index survives a restart, and goals stored before the
//! index existed are indexed on the next start.

use std::time::Duration;

use hermes_proto::{GoalStatus, ListGoalsRequest};
use hermes_tests::{Sandbox, node};
use serde_json::json;

fn plan(ms: u64) -> hermes_proto::TaskPlan {
    hermes_proto::TaskPlan {
        nodes: vec![node("nap", "time.sleep", json!({"ms": ms}), &[])],
        ..Default::default()
    }
}

async fn listed(t: &Sandbox, status: Option<&str>) -> Vec<String> {
    let url = match status {
        Some(s) => format!("{}/v1/goals?limit=1000&status={s}", t.http_url()),
        None => format!("{}/v1/goals?limit=1000", t.http_url()),
    };
    let page: serde_json::Value = reqwest::get(url).await.unwrap().json().await.unwrap();
    page["goals"].as_array().unwrap().iter().map(|g| g["goalId"].as_str().unwrap().to_owned()).collect()
}

async fn wait_listed(t: &Sandbox, status: &str, goal: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !listed(t, Some(status)).await.iter().any(|g| g == goal) {
        assert!(std::time::Instant::now() < deadline, "{goal} never listed as {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn goals_are_listed_by_status_across_a_restart_and_an_older_store_is_indexed() {
    let mut t = Sandbox::start().await;
    let quick = t.submit(plan(1)).await.unwrap();
    let slow = t.submit(plan(60_000)).await.unwrap();
    wait_listed(&t, "completed", &quick).await;
    wait_listed(&t, "running", &slow).await;
    assert!(!listed(&t, Some("running")).await.contains(&quick), "a completed goal listed as running");
    // A goal moves to its new status and leaves the old one.
    t.client
        .cancel_goal(hermes_proto::CancelGoalRequest { goal_id: slow.clone(), reason: "test".into() })
        .await
        .unwrap();
    wait_listed(&t, "cancelled", &slow).await;
    assert!(!listed(&t, Some("running")).await.contains(&slow), "a cancelled goal still listed as running");
    assert_eq!(listed(&t, None).await, [slow.clone(), quick.clone()], "newest first");

    // A restart reads the index back.
    let mut t = t.restart_services().await;
    assert_eq!(listed(&t, None).await, [slow.clone(), quick.clone()]);
    let grpc = t.client.list_goals(ListGoalsRequest { limit: 1 }).await.unwrap().into_inner().goals;
    assert_eq!(grpc.len(), 1);
    assert_eq!(grpc[0].goal_id, slow);
    assert_eq!(grpc[0].status, GoalStatus::Cancelled as i32);

    // A store from before the index: the index stream is gone, the goals are not.
    let third = t.submit(plan(1)).await.unwrap();
    wait_listed(&t, "completed", &third).await;
    let js = async_nats::jetstream::new(async_nats::connect(t.nats.url()).await.unwrap());
    let t = t
        .restart_services_with(|| async {
            js.delete_stream("HERMES_GOAL_INDEX").await.unwrap();
        })
        .await;
    assert_eq!(listed(&t, None).await, [third, slow, quick], "the goals stored before the index");
    t.stop().await;
}
