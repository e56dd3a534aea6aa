//! Deadlines are persisted and enforced: a goal past its deadline fails with TIMEOUT instead of
//! staying RUNNING; a node whose task was lost (the dispatcher died between storing the
//! transition and publishing the task, or a crashed nats-server lost it) is published again by a
//! dispatcher that starts or reconnects (and otherwise retried once its node deadline passes, see
//! the engine's tests), past a value in the goals' bucket that is no goal.

use std::time::{Duration, Instant};

use hermes_proto::event::Kind;
use hermes_proto::{GoalSpec, GoalState, GoalStatus, NodeState, NodeStatus, TaskPlan};
use hermes_tests::{Sandbox, node};
use prost::Message as _;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_goal_past_its_deadline_fails_with_timeout() {
    let mut t = Sandbox::start().await;
    let plan =
        TaskPlan { nodes: vec![node("nap", "time.sleep", json!({"ms": 4000}), &[])], ..Default::default() };
    let spec = GoalSpec { plan: Some(plan), timeout_ms: 1000, ..Default::default() };
    let started = Instant::now();
    let (goal_id, _) = t.submit_spec(spec).await.unwrap();
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().kind else { panic!("{:?}", events.last()) };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.code, "TIMEOUT");
    assert!(error.message.contains("1 s deadline"), "{}", error.message);
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    t.stop().await;
}

/// A goal whose one node (`add`: 40 + 2) waits on attempt 1, a task nobody published: what a
/// dispatcher leaves behind when it dies after the CAS and before publishing, or a server that
/// lost the task.
fn dispatched_but_never_published(goal_id: &str, node_timeout_ms: u64, goal_timeout_ms: u64) -> GoalState {
    let now = hermes_core::now_unix_ms();
    let mut plan_node = node("add", "math.evaluate", json!({"expression": "40 + 2"}), &[]);
    plan_node.timeout_ms = node_timeout_ms;
    GoalState {
        goal_id: goal_id.into(),
        status: GoalStatus::Running as i32,
        plan: Some(TaskPlan { nodes: vec![plan_node], ..Default::default() }),
        nodes: vec![NodeState {
            node_id: "add".into(),
            status: NodeStatus::Dispatched as i32,
            attempt: 1,
            task_id: format!("{goal_id}.add.1"),
            dispatched_unix_ms: now,
            ..Default::default()
        }],
        created_unix_ms: now,
        updated_unix_ms: now,
        deadline_unix_ms: now + goal_timeout_ms,
        spec: Some(GoalSpec::default()),
        ..Default::default()
    }
}

/// Bytes no `GoalState` decodes from (a field tag of wire type 7).
const UNDECODABLE: &[u8] = b"\xff\xff\xff\xff not a goal";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_task_is_published_again_by_a_restarted_dispatcher() {
    let t = Sandbox::start().await;
    // The node timeout is far enough that only a republish (not the deadline's retry, attempt 2)
    // can finish the goal within the bound below, even on a loaded machine.
    let state = dispatched_but_never_published("goal-lost-task", 30_000, 60_000);
    // A value that is no goal, stored first: it must not keep the goals after it unscheduled.
    t.bus.goals().put("goal-0-undecodable", UNDECODABLE.into()).await.unwrap();
    t.bus.goals().put("goal-lost-task", state.encode_to_vec().into()).await.unwrap();

    // Every service restarts; the new dispatcher finds the goal in KV and publishes the attempt
    // again, long before the node's deadline.
    let mut t = t.restart_services().await;
    // From the new dispatcher being up (stopping the old stack is not part of it).
    let started = Instant::now();
    let events = t.events("goal-lost-task").await;
    let Some(Kind::GoalCompleted(done)) = &events.last().unwrap().kind else { panic!("{:?}", events.last()) };
    assert_eq!(serde_json::from_str::<serde_json::Value>(&done.output_json).unwrap()["value"], 42.0);
    // Generous: under a loaded 2-core CI machine restarted services take seconds to settle; the
    // attempt number below is what proves the task was republished rather than retried.
    assert!(started.elapsed() < Duration::from_secs(15), "{:?}", started.elapsed());
    let stored = GoalState::decode(t.bus.goals().get("goal-lost-task").await.unwrap().unwrap()).unwrap();
    assert_eq!(stored.nodes[0].attempt, 1, "the same attempt, not a retry");
    t.stop().await;
}

/// Cancelling a goal makes the agent abandon its running task at once rather than finish it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cancelled_goal_s_running_task_is_abandoned_by_its_agent() {
    use futures::StreamExt;
    let mut t = Sandbox::start().await;
    let plan =
        TaskPlan { nodes: vec![node("nap", "time.sleep", json!({"ms": 20000}), &[])], ..Default::default() };
    let goal_id = t.submit(plan).await.unwrap();
    let mut results = t.bus.client().subscribe(t.bus.topology().result(&goal_id)).await.unwrap();
    t.bus.client().flush().await.unwrap();
    // Let the agent start the task.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let cancelled_at = Instant::now();
    t.client
        .cancel_goal(hermes_proto::CancelGoalRequest {
            goal_id: goal_id.clone(),
            reason: "changed my mind".into(),
        })
        .await
        .unwrap();
    let msg = tokio::time::timeout(Duration::from_secs(5), results.next())
        .await
        .expect("the agent gave up")
        .unwrap();
    let result = hermes_proto::TaskResult::decode(msg.payload).unwrap();
    assert_eq!(result.error.unwrap().code, "CANCELLED");
    assert!(cancelled_at.elapsed() < Duration::from_secs(3), "{:?}", cancelled_at.elapsed());
    let events = t.events(&goal_id).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCancelled(_))));
    t.stop().await;
}

/// A task the nats-server lost (a `kill -9` can drop the last messages it acknowledged) is
/// published again once the dispatcher has reconnected, not left to its node's deadline.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_lost_by_a_crashed_server_is_published_again_after_the_reconnect() {
    let mut t = Sandbox::start().await;
    // Let the start-up scan pass: it would publish the hand-made attempt below by itself.
    tokio::time::sleep(Duration::from_millis(1000)).await;
    // A node timeout far beyond the bound below: only a republish can finish the goal in time.
    let state = dispatched_but_never_published("goal-lost-at-the-server", 60_000, 120_000);
    // A value that is no goal, stored first: the reconnect's scan reads every key, and must read
    // past it.
    t.bus.goals().put("goal-0-undecodable", UNDECODABLE.into()).await.unwrap();
    t.bus.goals().put("goal-lost-at-the-server", state.encode_to_vec().into()).await.unwrap();
    // Give the server time to write the goal to its store: it is the task that is lost here.
    tokio::time::sleep(Duration::from_millis(500)).await;

    t.crash_nats().await;
    t.nats.restart();
    let restarted = Instant::now();
    let events = loop {
        // The API answers UNAVAILABLE until the dispatcher has reconnected.
        let watch = t
            .client
            .watch_goal(hermes_proto::WatchGoalRequest {
                goal_id: "goal-lost-at-the-server".into(),
                after_seq: 0,
            })
            .await;
        if watch.is_ok() {
            break t.events("goal-lost-at-the-server").await;
        }
        assert!(restarted.elapsed() < Duration::from_secs(20), "the dispatcher did not reconnect");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let Some(Kind::GoalCompleted(done)) = &events.last().unwrap().kind else { panic!("{:?}", events.last()) };
    assert_eq!(serde_json::from_str::<serde_json::Value>(&done.output_json).unwrap()["value"], 42.0);
    assert!(restarted.elapsed() < Duration::from_secs(30), "{:?}", restarted.elapsed());
    let stored =
        GoalState::decode(t.bus.goals().get("goal-lost-at-the-server").await.unwrap().unwrap()).unwrap();
    assert_eq!(stored.nodes[0].attempt, 1, "the same attempt, not a retry");
    t.stop().await;
}
