//! Poison messages: a task that reaches its consumer's MaxDeliver without an ack is moved to the
//! DLQ by the dispatcher (driven by the server's max-deliveries advisory) with the reason, its
//! node fails with POISON_MESSAGE, and the DLQ can be listed, read and replayed over gRPC.

use std::time::Duration;

use async_nats::jetstream::consumer::{AckPolicy, pull};
use futures::StreamExt;
use hermes_proto::event::Kind;
use hermes_proto::{
    DeadLetterRequest, GoalSpec, GoalState, GoalStatus, ListDeadLettersRequest, NodeState, NodeStatus,
    TaskMessage, TaskPlan,
};
use hermes_tests::{Sandbox, node};
use prost::Message as _;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_poison_task_goes_to_the_dlq_fails_its_node_and_can_be_replayed() {
    let mut t = Sandbox::start().await;
    // Let the dispatcher's start-up scan pass first: it would publish the hand-made goal's
    // in-flight attempt again, to a real agent.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let goal_id = "goal-poison";
    let now = hermes_core::now_unix_ms();
    let plan = TaskPlan {
        nodes: vec![node("calc", "math.evaluate", json!({"expression": "1 + 1"}), &[])],
        ..Default::default()
    };
    let state = GoalState {
        goal_id: goal_id.into(),
        status: GoalStatus::Running as i32,
        plan: Some(plan),
        nodes: vec![NodeState {
            node_id: "calc".into(),
            status: NodeStatus::Dispatched as i32,
            attempt: 1,
            task_id: format!("{goal_id}.calc.1"),
            agent_id: "ghost".into(),
            dispatched_unix_ms: now,
            ..Default::default()
        }],
        created_unix_ms: now,
        deadline_unix_ms: now + 120_000,
        spec: Some(GoalSpec::default()),
        ..Default::default()
    };
    t.bus.goals().put(goal_id, state.encode_to_vec().into()).await.unwrap();

    // An agent that takes its task and never acks it (it crashes on it, say).
    let topology = t.bus.topology().clone();
    let subject = topology.direct_task("ghost", "math.evaluate");
    let task = TaskMessage {
        goal_id: goal_id.into(),
        node_id: "calc".into(),
        task_id: format!("{goal_id}.calc.1"),
        attempt: 1,
        task_type: "math.evaluate".into(),
        inputs_json: r#"{"expression": "1 + 1", "variables": {"api_key": "sk-canary-0123456789abcdef"}}"#
            .into(),
        ..Default::default()
    };
    let stream = t.bus.jetstream().get_stream(topology.tasks_stream()).await.unwrap();
    let consumer = stream
        .create_consumer(pull::Config {
            durable_name: Some("agent_ghost".into()),
            filter_subject: subject.clone(),
            ack_policy: AckPolicy::Explicit,
            ack_wait: Duration::from_millis(300),
            max_deliver: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    t.bus.publish(subject.clone(), &task, &task.task_id, None).await.unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let ghost = tokio::spawn(async move {
        // Receive without acking, until the server stops redelivering.
        let mut seen = 0;
        while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_secs(3), messages.next()).await {
            seen += 1;
        }
        seen
    });

    let events = t.events(goal_id).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().kind else { panic!("{:?}", events.last()) };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.code, "POISON_MESSAGE");
    assert!(error.message.contains("delivered 2 times to consumer `agent_ghost`"), "{}", error.message);
    assert_eq!(ghost.await.unwrap(), 2);

    let list = t
        .client
        .list_dead_letters(ListDeadLettersRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    assert_eq!(list.len(), 1, "{list:?}");
    let dead = &list[0];
    assert_eq!(dead.subject, topology.dlq("task"));
    assert_eq!(dead.original_subject, subject);
    assert!(dead.reason.contains("MaxDeliver"), "{}", dead.reason);
    let shown =
        t.client.get_dead_letter(DeadLetterRequest { sequence: dead.sequence }).await.unwrap().into_inner();
    assert!(shown.decoded.contains("math.evaluate") && shown.decoded.contains(goal_id), "{}", shown.decoded);
    // Secrets never reach the decoded view.
    assert!(
        !shown.decoded.contains("sk-canary") && shown.decoded.contains("[REDACTED]"),
        "{}",
        shown.decoded
    );
    // Gone from its work queue, so it is not delivered again by itself.
    assert_eq!(
        t.bus
            .jetstream()
            .get_stream(topology.tasks_stream())
            .await
            .unwrap()
            .info()
            .await
            .unwrap()
            .state
            .messages,
        0
    );

    // Replay puts it back on its subject (where the ghost's consumer sees it again).
    let replayed = t
        .client
        .replay_dead_letter(DeadLetterRequest { sequence: dead.sequence })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(replayed.subject, subject);
    let audit =
        t.client.list_audit(hermes_proto::ListAuditRequest::default()).await.unwrap().into_inner().records;
    assert!(
        audit.iter().any(|r| r.action == "dead_letter.replay"
            && r.target == dead.sequence.to_string()
            && r.outcome == "OK"),
        "the replay is audited: {audit:?}"
    );
    let back = t
        .bus
        .jetstream()
        .get_stream(topology.tasks_stream())
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(back, 1);
    let list = t
        .client
        .list_dead_letters(ListDeadLettersRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    assert!(list.is_empty(), "{list:?}");
    let missing = t.client.get_dead_letter(DeadLetterRequest { sequence: dead.sequence }).await.unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    t.stop().await;
}

/// A dead letter goes back only to a subject of its kind: one that names another subject (any
/// bus user that may publish to the DLQ could write it) is refused, not published with the
/// dispatcher's rights.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dead_letter_naming_a_subject_outside_its_kind_is_not_replayed() {
    let mut t = Sandbox::start().await;
    let bus = t.bus.clone();
    bus.publish_dead_letter("task", "$KV.hermes_goals.g-forged", "HERMES_TASKS:999", "forged", "{}".into())
        .await
        .unwrap();
    let list = t
        .client
        .list_dead_letters(ListDeadLettersRequest { limit: 0 })
        .await
        .unwrap()
        .into_inner()
        .dead_letters;
    let forged = list.iter().find(|d| d.original_subject == "$KV.hermes_goals.g-forged").expect("listed");
    let refused =
        t.client.replay_dead_letter(DeadLetterRequest { sequence: forged.sequence }).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::FailedPrecondition, "{refused:?}");
    assert!(refused.message().contains("not a subject of its kind"), "{refused:?}");
    assert!(bus.goals().get("g-forged").await.unwrap().is_none(), "nothing was written to the goals");
    let audit =
        t.client.list_audit(hermes_proto::ListAuditRequest::default()).await.unwrap().into_inner().records;
    assert!(
        audit.iter().any(|r| r.action == "dead_letter.replay" && r.outcome == "FAILED_PRECONDITION"),
        "{audit:?}"
    );
    t.stop().await;
}
