//! Large payloads travel by reference: a tool output over the inline limit is stored in the
//! `hermes_artifacts` object store, the result and the goal state carry a stub, and the
//! downstream node gets the exact content. Every NATS message of the goal, watched on `>`, stays
//! at or below the inline limit.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use futures::StreamExt;
use hermes_core::artifacts::DEFAULT_INLINE_LIMIT;
use hermes_proto::event::Kind;
use hermes_proto::{GetGoalRequest, TaskPlan};
use hermes_tests::{Sandbox, node};
use serde_json::json;

/// `size` bytes of text with lines, unicode and characters JSON must escape.
fn content(size: usize) -> String {
    let line = "row,\"quoted\",naïve\\path\ttab — ünïcödé\n";
    let mut text = String::with_capacity(size + line.len());
    let mut i = 0u64;
    while text.len() < size {
        text.push_str(&format!("{i:08} {line}"));
        i += 1;
    }
    text
}

async fn passes_through_a_goal(size: usize) {
    let workspace = tempfile::tempdir().unwrap();
    let original = content(size);
    std::fs::write(workspace.path().join("big.txt"), &original).unwrap();
    let mut t = Sandbox::builder().workspace(workspace.path()).start().await;

    // Watch every message on the server.
    let watcher = async_nats::connect(t.nats.url()).await.unwrap();
    let mut all = watcher.subscribe(">").await.unwrap();
    watcher.flush().await.unwrap();
    let largest = Arc::new(AtomicUsize::new(0));
    let seen = Arc::new(AtomicUsize::new(0));
    let (largest_w, seen_w) = (largest.clone(), seen.clone());
    let watching = tokio::spawn(async move {
        while let Some(msg) = all.next().await {
            // Replies and the server's API advisories are not Hermes payloads: a JetStream API
            // answer such as the list of HERMES_TASKS' consumers (a pool and a lane per tenant per task
            // type) grows with the topology. Every payload published is seen on its own subject.
            if !msg.subject.starts_with("_INBOX") && !msg.subject.starts_with("$JS.EVENT.") {
                largest_w.fetch_max(msg.payload.len(), Ordering::Relaxed);
            }
            seen_w.fetch_add(1, Ordering::Relaxed);
        }
    });

    let plan = TaskPlan {
        nodes: vec![
            node("read", "fs.read", json!({"path": "big.txt"}), &[]),
            node(
                "copy",
                "fs.write",
                json!({"path": "copy.txt", "content": {"$ref": "read.text"}}),
                &["read"],
            ),
        ],
        ..Default::default()
    };
    let goal_id = t.submit(plan).await.unwrap();
    let events = t.events(&goal_id).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{:?}", events.last());

    // The downstream node got the exact bytes.
    let copy = std::fs::read(workspace.path().join("copy.txt")).unwrap();
    assert!(copy == original.as_bytes(), "the copy differs ({} vs {} bytes)", copy.len(), original.len());

    // The read's output is a stub naming an artifact of the whole output.
    let goal = t.client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await.unwrap().into_inner();
    let read = goal.nodes.iter().find(|n| n.node_id == "read").unwrap();
    assert!(read.memory_ref.starts_with("art-"), "{read:?}");
    let stub: serde_json::Value = serde_json::from_str(&read.output_json).unwrap();
    assert_eq!(stub["$artifact"], read.memory_ref.as_str());
    assert!(stub["size_bytes"].as_u64().unwrap() > size as u64);
    let info = t.bus.artifacts().info(&read.memory_ref).await.unwrap();
    assert_eq!(info.goal_id, goal_id);

    watcher.flush().await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    watching.abort();
    assert!(seen.load(Ordering::Relaxed) > size / DEFAULT_INLINE_LIMIT, "the watcher saw the transfer");
    let largest = largest.load(Ordering::Relaxed);
    assert!(largest <= DEFAULT_INLINE_LIMIT, "a message of {largest} bytes went over the inline limit");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_5_mb_output_reaches_the_next_node_by_reference() {
    passes_through_a_goal(5 * 1024 * 1024).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_50_mb_artifact_passes_through_a_goal_with_no_message_over_the_limit() {
    passes_through_a_goal(50 * 1024 * 1024).await;
}
