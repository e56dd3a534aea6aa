//! A side-effecting tool runs once per node attempt even when its task is delivered again, as
//! it is when an agent dies after the tool ran and before it acked: the redelivered task finds
//! the outcome in the `hermes_ledger` bucket and does not repeat the side effect.

use std::time::{Duration, Instant};

use hermes_proto::event::Kind;
use hermes_proto::{TaskMessage, TaskPlan};
use hermes_tests::{StackOptions, TestStack, node};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_redelivered_side_effect_is_not_repeated() {
    let workspace = tempfile::tempdir().unwrap();
    let mut t = TestStack::start_with(StackOptions {
        workspace: Some(workspace.path().to_path_buf()),
        ..Default::default()
    })
    .await;
    let inputs = json!({"path": "log.txt", "content": "x", "append": true});
    let plan = TaskPlan { nodes: vec![node("w", "fs.write", inputs.clone(), &[])], ..Default::default() };
    let goal_id = t.submit(plan).await.unwrap();
    let events = t.events(&goal_id).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))));
    assert_eq!(std::fs::read_to_string(workspace.path().join("log.txt")).unwrap(), "x");

    // Deliver the very same attempt again, under a new message id so JetStream keeps it.
    let task = TaskMessage {
        goal_id: goal_id.clone(),
        node_id: "w".into(),
        task_id: format!("{goal_id}.w.1"),
        attempt: 1,
        task_type: "fs.write".into(),
        inputs_json: inputs.to_string(),
        ..Default::default()
    };
    let topology = t.bus.topology().clone();
    t.bus.publish(topology.pool_task("fs.write"), &task, "redelivery-1", None).await.unwrap();
    let tasks = t.bus.jetstream().get_stream(topology.tasks_stream()).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while tasks.clone().info().await.unwrap().state.messages > 0 {
        assert!(Instant::now() < deadline, "the redelivered task was not handled");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("log.txt")).unwrap(),
        "x",
        "the side effect ran twice"
    );

    // The ledger holds the call's outcome under the attempt's key.
    let mut keys = t.bus.ledger().keys().await.unwrap();
    let key = futures::StreamExt::next(&mut keys).await.unwrap().unwrap();
    assert!(key.starts_with(&format!("{goal_id}.w.1.0.")), "{key}");
    let stored: serde_json::Value =
        serde_json::from_slice(&t.bus.ledger().get(&key).await.unwrap().unwrap()).unwrap();
    assert_eq!(stored["ok"]["bytes_written"], 1);
    t.stop().await;
}
