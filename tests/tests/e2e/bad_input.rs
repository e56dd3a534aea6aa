//! Bad input gets a typed gRPC error naming the problem, and poison messages go to the DLQ while
//! agents keep serving.

use std::time::Duration;

use futures::StreamExt;
use hermes_proto::event::Kind;
use hermes_proto::{GoalSpec, TaskPlan};
use hermes_tests::{Sandbox, node};
use serde_json::json;

fn plan(nodes: Vec<hermes_proto::TaskNode>) -> TaskPlan {
    TaskPlan { nodes, ..Default::default() }
}

async fn rejected(t: &mut Sandbox, plan: TaskPlan) -> tonic::Status {
    t.submit(plan).await.expect_err("plan must be rejected")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn invalid_plans_are_rejected_with_the_reason() {
    let mut t = Sandbox::builder().max_nodes(20).start().await;
    let calc = |expr: &str| json!({"expression": expr});

    let cyclic = plan(vec![
        node("a", "math.evaluate", calc("1"), &["c"]),
        node("b", "math.evaluate", calc("1"), &["a"]),
        node("c", "math.evaluate", calc("1"), &["b"]),
    ]);
    let err = rejected(&mut t, cyclic).await;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("PLAN_INVALID") && err.message().contains("cycle"), "{}", err.message());

    let unknown = plan(vec![node("a", "web.search", json!({}), &[])]);
    let err = rejected(&mut t, unknown).await;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("unknown task type `web.search`"), "{}", err.message());

    let dangling = plan(vec![node(
        "a",
        "math.evaluate",
        json!({"expression": "x", "variables": {"x": {"$ref": "ghost.value"}}}),
        &[],
    )]);
    let err = rejected(&mut t, dangling).await;
    assert!(err.message().contains("$ref `ghost.value` names node `ghost`"), "{}", err.message());

    let too_big = plan((0..21).map(|i| node(&format!("n{i}"), "math.evaluate", calc("1"), &[])).collect());
    let err = rejected(&mut t, too_big).await;
    assert!(err.message().contains("21 nodes, over the limit of 20"), "{}", err.message());

    let bad_args = plan(vec![node("a", "math.evaluate", json!({"expression": 5, "bogus": true}), &[])]);
    let err = rejected(&mut t, bad_args).await;
    assert_eq!(err.code(), tonic::Code::InvalidArgument);
    assert!(err.message().contains("node `a` (math.evaluate): input /expression"), "{}", err.message());
    assert!(err.message().contains("bogus"), "{}", err.message());

    let bad_json = plan(vec![hermes_proto::TaskNode {
        id: "a".into(),
        task_type: "math.evaluate".into(),
        inputs_json: "{not json".into(),
        ..Default::default()
    }]);
    let err = rejected(&mut t, bad_json).await;
    assert!(err.message().contains("inputs are not valid JSON"), "{}", err.message());

    let text = GoalSpec { text: "compare April sales".into(), ..Default::default() };
    let err = t.submit_spec(text).await.unwrap_err();
    assert_eq!(err.code(), tonic::Code::FailedPrecondition);
    assert!(err.message().contains("no planner configured"), "{}", err.message());

    let empty = t.submit_spec(GoalSpec::default()).await.unwrap_err();
    assert_eq!(empty.code(), tonic::Code::InvalidArgument);

    // Nothing was stored for any rejected goal.
    let goals =
        t.client.list_goals(hermes_proto::ListGoalsRequest { limit: 100 }).await.unwrap().into_inner();
    assert!(goals.goals.is_empty());
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_malformed_task_lands_in_the_dlq_and_the_agent_keeps_serving() {
    let mut t = Sandbox::start().await;
    let topology = t.bus.topology().clone();
    let garbage = bytes::Bytes::from_static(b"\xff\xff\xff this is not a TaskMessage");
    t.bus
        .publish_bytes(topology.pool_task("math.evaluate"), garbage.clone(), "poison-1", None)
        .await
        .unwrap();

    // The DLQ receives it with the reason.
    let dlq = t.bus.jetstream().get_stream(topology.dlq_stream()).await.unwrap();
    let consumer =
        dlq.create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default()).await.unwrap();
    let mut messages = consumer.messages().await.unwrap();
    let dead = tokio::time::timeout(Duration::from_secs(10), messages.next())
        .await
        .expect("dlq entry within 10 s")
        .unwrap()
        .unwrap();
    assert_eq!(dead.subject.as_str(), topology.dlq("task"));
    assert_eq!(dead.payload, garbage);
    let headers = dead.headers.clone().unwrap();
    let reason = headers.get(hermes_core::bus::DLQ_REASON).unwrap().as_str();
    assert!(reason.contains("cannot decode task"), "{reason}");
    assert_eq!(
        headers.get(hermes_core::bus::DLQ_SUBJECT).unwrap().as_str(),
        topology.pool_task("math.evaluate")
    );

    // And only once, not redelivered.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let info = t
        .bus
        .jetstream()
        .get_stream(topology.dlq_stream())
        .await
        .unwrap()
        .info()
        .await
        .unwrap()
        .state
        .messages;
    assert_eq!(info, 1);

    // The agents still serve the same task type.
    let goal_id =
        t.submit(plan(vec![node("a", "math.evaluate", json!({"expression": "2 ^ 10"}), &[])])).await.unwrap();
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalCompleted(done)) = &events.last().unwrap().kind else {
        panic!("goal did not complete")
    };
    assert_eq!(done.output_json, json!({"value": 1024.0}).to_string());
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn arguments_that_fail_the_schema_after_ref_resolution_fail_the_node() {
    let mut t = Sandbox::start().await;
    // `text.template`'s output is {text: string}; math.evaluate wants numbers for variables.
    let goal_id = t
        .submit(plan(vec![
            node("words", "text.template", json!({"template": "seven"}), &[]),
            node(
                "calc",
                "math.evaluate",
                json!({"expression": "x + 1", "variables": {"x": {"$ref": "words.text"}}}),
                &[],
            ),
        ]))
        .await
        .unwrap();
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().kind else { panic!("goal should fail") };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.code, "INVALID_ARGUMENT");
    assert_eq!(error.node_id, "calc");
    assert!(error.message.contains("/variables/x"), "{}", error.message);
    t.stop().await;
}

/// A request over the gRPC size limit is refused with INVALID_ARGUMENT naming the limit, not a
/// codec's OUT_OF_RANGE.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_oversized_request_is_an_invalid_argument_naming_the_limit() {
    let mut t = Sandbox::builder().agents(1).start().await;
    let limit = hermes_core::grpc::DEFAULT_MAX_MESSAGE_BYTES;
    let spec = hermes_proto::GoalSpec { text: "x".repeat(5 * 1024 * 1024), ..Default::default() };
    let status = t
        .client
        .submit_goal(hermes_proto::SubmitGoalRequest { spec: Some(spec) })
        .await
        .expect_err("a 5 MiB request is refused");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(status.message().starts_with("INVALID_ARGUMENT"), "{}", status.message());
    assert!(status.message().contains(&limit.to_string()), "{}", status.message());
    assert!(status.message().contains("HERMES_GRPC_MAX_MESSAGE_BYTES"), "{}", status.message());
    // The server is fine afterwards.
    let plan = TaskPlan {
        nodes: vec![node("a", "math.evaluate", json!({"expression": "1"}), &[])],
        ..Default::default()
    };
    t.submit(plan).await.unwrap();
    t.stop().await;
}
