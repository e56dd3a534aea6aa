//! A side-effecting tool runs once per node even when its task is delivered again, as it is when
//! an agent dies after the tool ran and before it acked, or handed to another agent as a new
//! attempt: the task finds the outcome in the `hermes_ledger` bucket and does not repeat the side
//! effect. (`crates/cli/tests/ledger_kill.rs` does the same with a real `kill -9`.)

use std::time::{Duration, Instant};

use hermes_proto::event::Kind;
use hermes_proto::{TaskMessage, TaskPlan};
use hermes_tests::{Sandbox, node};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivered_side_effect_is_not_repeated() {
    let workspace = tempfile::tempdir().unwrap();
    let mut t = Sandbox::builder().workspace(workspace.path()).start().await;
    let inputs = json!({"path": "log.txt", "content": "x", "append": true});
    let plan = TaskPlan { nodes: vec![node("w", "fs.write", inputs.clone(), &[])], ..Default::default() };
    let goal_id = t.submit(plan).await.unwrap();
    let events = t.events(&goal_id).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))));
    assert_eq!(std::fs::read_to_string(workspace.path().join("log.txt")).unwrap(), "x");

    // Deliver the very same attempt again, then a later attempt, under new message ids so
    // JetStream keeps them.
    let topology = t.bus.topology().clone();
    let tasks = t.bus.jetstream().get_stream(topology.tasks_stream()).await.unwrap();
    for attempt in [1, 2] {
        let task = TaskMessage {
            goal_id: goal_id.clone(),
            node_id: "w".into(),
            task_id: format!("{goal_id}.w.{attempt}"),
            attempt,
            task_type: "fs.write".into(),
            inputs_json: inputs.to_string(),
            ..Default::default()
        };
        let msg_id = format!("redelivery-{attempt}");
        t.bus.publish(topology.pool_task("fs.write"), &task, &msg_id, None).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(10);
        while tasks.clone().info().await.unwrap().state.messages > 0 {
            assert!(Instant::now() < deadline, "the redelivered task was not handled");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("log.txt")).unwrap(),
        "x",
        "the side effect ran twice"
    );

    // The ledger holds the call's outcome, and the attempt that produced it, under the call's key.
    // (The bucket also holds crash markers, `inflight.*`, while tasks run.)
    let keys = t.bus.ledger().keys().await.unwrap();
    let key = keys.into_iter().find(|k| !k.starts_with("inflight.")).expect("a call entry");
    assert!(key.starts_with(&format!("{goal_id}.w.0.")), "{key}");
    let stored: serde_json::Value =
        serde_json::from_slice(&t.bus.ledger().get(&key).await.unwrap().unwrap()).unwrap();
    assert_eq!(stored["ok"]["bytes_written"], 1);
    assert_eq!(stored["attempt"], 1);
    t.stop().await;
}
