//! A goal's events carry a per-goal `seq` in commit order, are stored in that order, and a
//! watcher resumes after any `seq`; cancelling a goal leaves every node in a final state.

use std::collections::HashMap;
use std::time::Duration;

use futures::StreamExt;
use hermes_proto::event::Kind;
use hermes_proto::{CancelGoalRequest, Event, GetGoalRequest, NodeStatus, TaskPlan, WatchGoalRequest};
use hermes_tests::{Sandbox, node};
use serde_json::json;

/// `width` independent nodes feeding one that sums them.
fn fan_out(width: usize) -> TaskPlan {
    let mut nodes: Vec<_> = (0..width)
        .map(|i| node(&format!("n{i}"), "math.evaluate", json!({"expression": format!("{i} + 1")}), &[]))
        .collect();
    let vars: serde_json::Map<String, serde_json::Value> =
        (0..width).map(|i| (format!("v{i}"), json!({"$ref": format!("n{i}.value")}))).collect();
    nodes.push(node("sum", "math.evaluate", json!({"expression": "v0 + v1", "variables": vars}), &[]));
    TaskPlan { nodes, output_node: "sum".into(), ..Default::default() }
}

/// Every stored event of a goal, in stream order, read straight from JetStream.
async fn stored(t: &Sandbox, goal_id: &str) -> Vec<Event> {
    use async_nats::jetstream::consumer::{DeliverPolicy, pull};
    let stream = t.bus.jetstream().get_stream(t.bus.topology().events_stream()).await.unwrap();
    let consumer = stream
        .create_consumer(pull::OrderedConfig {
            filter_subject: t.bus.topology().event(goal_id),
            deliver_policy: DeliverPolicy::All,
            ..Default::default()
        })
        .await
        .unwrap();
    let pending = consumer.clone().info().await.unwrap().num_pending as usize;
    let mut messages = consumer.messages().await.unwrap();
    let mut out = Vec::with_capacity(pending);
    for _ in 0..pending {
        let msg =
            tokio::time::timeout(Duration::from_secs(10), messages.next()).await.unwrap().unwrap().unwrap();
        out.extend(hermes_core::events::decode(&msg.payload).unwrap());
    }
    out
}

/// The event-order contract, checked on one goal's stored events.
fn check_order(goal_id: &str, events: &[Event]) {
    let seqs: Vec<u64> = events.iter().map(|e| e.seq).filter(|s| *s > 0).collect();
    let expected: Vec<u64> = (1..=seqs.len() as u64).collect();
    assert_eq!(seqs, expected, "{goal_id}: seq must run 1..n in stream order, without gap or repeat");
    let mut dispatched: HashMap<(String, u32), usize> = HashMap::new();
    for (i, event) in events.iter().enumerate() {
        match &event.kind {
            Some(Kind::TaskDispatched(e)) => {
                dispatched.insert((e.node_id.clone(), e.attempt), i);
            }
            Some(Kind::TaskSucceeded(e)) => {
                let at = dispatched.get(&(e.node_id.clone(), e.attempt));
                assert!(
                    at.is_some_and(|at| *at < i),
                    "{goal_id}: {} succeeded before it was dispatched",
                    e.node_id
                );
            }
            Some(Kind::TaskFailed(e)) => {
                let at = dispatched.get(&(e.node_id.clone(), e.attempt));
                assert!(
                    at.is_some_and(|at| *at < i),
                    "{goal_id}: {} failed before it was dispatched",
                    e.node_id
                );
            }
            _ => {}
        }
    }
    let last = events.last().unwrap();
    assert!(hermes_dispatcher::engine::is_terminal_event(last), "{goal_id}: the terminal event is not last");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_wide_fan_outs_store_their_events_in_seq_order() {
    let mut t = Sandbox::builder().agents(2).max_concurrency(64).start().await;
    let mut goals = Vec::new();
    let submits = (0..20).map(|_| {
        let mut client = t.client.clone();
        async move {
            let spec = hermes_proto::GoalSpec { plan: Some(fan_out(200)), ..Default::default() };
            client
                .submit_goal(hermes_proto::SubmitGoalRequest { spec: Some(spec) })
                .await
                .unwrap()
                .into_inner()
                .goal_id
        }
    });
    goals.extend(futures::future::join_all(submits).await);
    for goal_id in &goals {
        let events = tokio::time::timeout(Duration::from_secs(120), t.events(goal_id)).await.unwrap();
        assert!(
            matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))),
            "{goal_id}: {:?}",
            events.last()
        );
    }
    for goal_id in &goals {
        let events = tokio::time::timeout(Duration::from_secs(60), stored(&t, goal_id))
            .await
            .unwrap_or_else(|_| panic!("{goal_id}: reading its stored events did not finish"));
        check_order(goal_id, &events);
    }

    // A watcher that resumes after seq k gets exactly the events after k.
    let all = stored(&t, &goals[0]).await;
    for k in [1u64, 7, 150, all.iter().map(|e| e.seq).max().unwrap() - 1] {
        let cut = all.iter().position(|e| e.seq == k).unwrap();
        let watch = t
            .client
            .watch_goal(WatchGoalRequest { goal_id: goals[0].clone(), after_seq: k })
            .await
            .unwrap()
            .into_inner()
            .map(|e| e.unwrap())
            .collect::<Vec<Event>>();
        // Bounded, so a stream that never ends fails here, naming the step.
        let resumed = tokio::time::timeout(Duration::from_secs(60), watch)
            .await
            .unwrap_or_else(|_| panic!("the watch resumed after seq {k} did not end"));
        assert_eq!(resumed, all[cut + 1..].to_vec(), "resuming after seq {k}");
    }
    // After the last one there is nothing more.
    let last = all.iter().map(|e| e.seq).max().unwrap();
    let watch = t
        .client
        .watch_goal(WatchGoalRequest { goal_id: goals[0].clone(), after_seq: last })
        .await
        .unwrap()
        .into_inner()
        .collect::<Vec<_>>();
    let rest = tokio::time::timeout(Duration::from_secs(60), watch)
        .await
        .unwrap_or_else(|_| panic!("the watch resumed after the last seq {last} did not end"));
    assert!(rest.is_empty(), "{rest:?}");
    t.stop().await;
}

/// Cancelling a goal leaves every node final: done ones succeeded, running ones cancelled with a
/// finish time and the reason, pending ones skipped; no node stays DISPATCHED.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_leaves_every_node_in_a_final_state() {
    let mut t = Sandbox::start().await;
    let plan = TaskPlan {
        nodes: vec![
            node("quick", "math.evaluate", json!({"expression": "1 + 1"}), &[]),
            node("slow", "time.sleep", json!({"ms": 20_000}), &[]),
            node(
                "later",
                "math.evaluate",
                json!({"expression": "v", "variables": {"v": {"$ref": "slow.slept_ms"}}}),
                &[],
            ),
        ],
        ..Default::default()
    };
    let goal_id = t.submit(plan).await.unwrap();
    // Wait until the quick node is done and the slow one runs.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let goal = t.client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await.unwrap().into_inner();
        let status = |id: &str| goal.nodes.iter().find(|n| n.node_id == id).unwrap().status;
        if status("quick") == NodeStatus::Succeeded as i32 && status("slow") == NodeStatus::Dispatched as i32
        {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "{goal:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let goal = t
        .client
        .cancel_goal(CancelGoalRequest { goal_id: goal_id.clone(), reason: "operator stop".into() })
        .await
        .unwrap()
        .into_inner();
    let by_id: HashMap<_, _> = goal.nodes.iter().map(|n| (n.node_id.as_str(), n)).collect();
    assert_eq!(by_id["quick"].status, NodeStatus::Succeeded as i32);
    let slow = by_id["slow"];
    assert_eq!(slow.status, NodeStatus::Cancelled as i32, "{slow:?}");
    assert!(slow.finished_unix_ms >= slow.dispatched_unix_ms && slow.finished_unix_ms > 0, "{slow:?}");
    let error = slow.error.as_ref().unwrap();
    assert_eq!(error.code, "CANCELLED");
    assert!(error.message.contains("operator stop"), "{}", error.message);
    assert_eq!(by_id["later"].status, NodeStatus::Skipped as i32);
    assert!(
        goal.nodes
            .iter()
            .all(|n| n.status != NodeStatus::Dispatched as i32 && n.status != NodeStatus::Pending as i32)
    );
    // The events end with the cancellation, in seq order.
    let events = t.events(&goal_id).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCancelled(_))));
    check_order(&goal_id, &stored(&t, &goal_id).await);
    // The stored state stays final: the agent's late result (if any) changes nothing.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let again = t.client.get_goal(GetGoalRequest { goal_id }).await.unwrap().into_inner();
    assert_eq!(again.nodes, goal.nodes);
    t.stop().await;
}
