//! Every service survives a nats-server crash: while it is down the gRPC API answers UNAVAILABLE
//! instead of hanging, and once it is back (same store) the services reconnect and re-bind their
//! consumers by themselves, goals accepted before the crash finish, and new goals run.

use std::time::{Duration, Instant};

use hermes_proto::event::Kind;
use hermes_proto::{GetGoalRequest, GoalSpec, SubmitGoalRequest, TaskPlan};
use hermes_tests::{Sandbox, node};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn services_ride_out_a_nats_server_crash() {
    let mut t = Sandbox::start().await;
    let plan = |ms: u64| TaskPlan {
        nodes: vec![
            node("nap", "time.sleep", json!({"ms": ms}), &[]),
            node("add", "math.evaluate", json!({"expression": "40 + 2"}), &["nap"]),
        ],
        ..Default::default()
    };
    let before = t.submit(plan(1500)).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The guarantee is about a connection known to be down.
    t.crash_nats().await;
    let started = Instant::now();
    let answer = tokio::time::timeout(
        Duration::from_secs(20),
        t.client.get_goal(GetGoalRequest { goal_id: before.clone() }),
    )
    .await
    .expect("the API answers while NATS is down");
    let status = answer.unwrap_err();
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status:?}");
    let spec = GoalSpec { plan: Some(plan(10)), ..Default::default() };
    let submit = tokio::time::timeout(
        Duration::from_secs(20),
        t.client.submit_goal(SubmitGoalRequest { spec: Some(spec) }),
    )
    .await
    .expect("submit answers while NATS is down");
    assert_eq!(submit.unwrap_err().code(), tonic::Code::Unavailable);
    assert!(started.elapsed() < Duration::from_secs(5), "UNAVAILABLE took {:?}", started.elapsed());

    t.nats.restart();
    let reconnected = Instant::now();
    // Like any client, retry while the dispatcher says UNAVAILABLE: it is reconnecting.
    loop {
        match t.client.get_goal(GetGoalRequest { goal_id: before.clone() }).await {
            Err(status) if status.code() == tonic::Code::Unavailable => {
                assert!(reconnected.elapsed() < Duration::from_secs(20), "the dispatcher did not reconnect");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("{status:?}"),
            Ok(_) => break,
        }
    }
    // The goal accepted before the crash finishes; a new one runs end to end.
    let events = t.events(&before).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{:?}", events.last());
    let after = t.submit(plan(10)).await.unwrap();
    let events = t.events(&after).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{:?}", events.last());
    println!("recovered {:?} after the restart", reconnected.elapsed());
    t.stop().await;
}
