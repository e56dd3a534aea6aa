//! Goal lists through the goal index (`crates/dispatcher/src/goal_index.rs`): a goal is listed
//! under its current status only, the index is read back after a restart, and a goal written
//! without index headers (by an older release) is indexed from the goal itself.

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
    listed_or_why(t, status).await.unwrap_or_else(|why| panic!("no list: {why}"))
}

/// The goals listed, or the answer when it is no list (the API answers 503 until the
/// dispatcher has reconnected).
async fn listed_or_why(t: &Sandbox, status: Option<&str>) -> Result<Vec<String>, serde_json::Value> {
    let url = match status {
        Some(s) => format!("{}/v1/goals?limit=1000&status={s}", t.http_url()),
        None => format!("{}/v1/goals?limit=1000", t.http_url()),
    };
    let page: serde_json::Value = reqwest::get(url).await.unwrap().json().await.unwrap();
    match page["goals"].as_array() {
        Some(goals) => Ok(goals.iter().map(|g| g["goalId"].as_str().unwrap().to_owned()).collect()),
        None => Err(page),
    }
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

    // A goal written by an older release: no index headers on its write.
    let js = async_nats::jetstream::new(async_nats::connect(t.nats.url()).await.unwrap());
    let goals = js.get_key_value("hermes_goals").await.unwrap();
    let stored = goals.get(&quick).await.unwrap().unwrap();
    let mut state = <hermes_proto::GoalState as prost::Message>::decode(stored).unwrap();
    state.goal_id = "g-older-release".into();
    state.created_unix_ms = hermes_core::now_unix_ms();
    goals.put("g-older-release", prost::Message::encode_to_vec(&state).into()).await.unwrap();
    let t = t.restart_services().await;
    assert_eq!(
        listed(&t, None).await,
        ["g-older-release".to_owned(), slow, quick],
        "a goal without index headers"
    );
    t.stop().await;
}

/// Copies a nats-server's store dir (`cp -a`, keeping what JetStream wrote as it is).
fn copy_store(from: &std::path::Path, to: &std::path::Path) {
    let copied =
        std::process::Command::new("cp").arg("-a").arg(from.join("jetstream")).arg(to).status().unwrap();
    assert!(copied.success(), "cp -a {} {}", from.display(), to.display());
}

/// A nats-server that comes back from a crash without writes it had acknowledged (a `kill -9`
/// before they reached its files; here, its store put back as it was before them) gives their
/// sequence numbers to new writes. The index, which had read the lost write, would take the
/// new one for an older write of the goal and ignore it. After the reconnect the index reads the
/// bucket again, and the goal is listed as the bucket now holds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn after_a_crash_that_lost_writes_the_index_reads_the_bucket_again() {
    let mut t = Sandbox::start().await;
    let goal = t.submit(plan(60_000)).await.unwrap();
    wait_listed(&t, "running", &goal).await;
    // Let the server write the goal to its files before they are copied.
    tokio::time::sleep(Duration::from_millis(500)).await;
    t.crash_nats().await;
    let before = tempfile::tempdir().unwrap();
    copy_store(t.nats.store_dir(), before.path());
    t.nats.restart();
    // The goal is cancelled: a write the next crash loses.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let cancel = hermes_proto::CancelGoalRequest { goal_id: goal.clone(), reason: "test".into() };
    while let Err(e) = t.client.cancel_goal(cancel.clone()).await {
        assert!(std::time::Instant::now() < deadline, "the dispatcher did not come back: {e}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    wait_listed(&t, "cancelled", &goal).await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    t.crash_nats().await;
    std::fs::remove_dir_all(t.nats.store_dir().join("jetstream")).unwrap();
    copy_store(before.path(), t.nats.store_dir());
    t.nats.restart();
    // Another writer (a replica, or an older release: no index headers) completes the goal; its
    // write takes the sequence number the lost cancel had.
    let js = async_nats::jetstream::new(async_nats::connect(t.nats.url()).await.unwrap());
    let goals = js.get_key_value("hermes_goals").await.unwrap();
    let stored = goals.get(&goal).await.unwrap().unwrap();
    let mut state = <hermes_proto::GoalState as prost::Message>::decode(stored).unwrap();
    assert_eq!(state.status, GoalStatus::Running as i32, "the crash did not lose the cancel");
    state.status = GoalStatus::Completed as i32;
    goals.put(&goal, prost::Message::encode_to_vec(&state).into()).await.unwrap();

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let completed = listed_or_why(&t, Some("completed")).await;
        if completed.as_ref().is_ok_and(|c| c.contains(&goal)) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "not listed as completed: {completed:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!listed(&t, Some("cancelled")).await.contains(&goal));
    t.stop().await;
}
