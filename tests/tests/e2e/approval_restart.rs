//! An approval survives the agent that asked for it: the agent is killed while the call waits,
//! its task moves to another agent, and that agent waits for the same approval.

use std::time::{Duration, Instant};

use futures::StreamExt;
use hermes_executor::AgentConfig;
use hermes_proto::event::Kind;
use hermes_proto::{
    ApproveToolCallRequest, GoalSpec, SubmitGoalRequest, TaskNode, TaskPlan, WatchGoalRequest,
};
use hermes_test_util::process::HermesAgent;
use hermes_tests::{Sandbox, hermes_bin};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pending_approval_survives_an_agent_kill() {
    let workspace = tempfile::tempdir().unwrap();
    let mut helper = AgentConfig::new("helper", workspace.path());
    helper.tools = vec!["math.evaluate".into()];
    let mut sandbox =
        Sandbox::builder().agents(0).agent(helper).heartbeat_ttl(Duration::from_secs(1)).start().await;
    let nats = sandbox.nats.url();
    let mut client = sandbox.client.clone();
    let mut registry = sandbox.registry_client().await;

    let mut first = HermesAgent::builder(hermes_bin(), &nats, "first")
        .args(["--tools", "fs.write", "--confirm", "fs.write"])
        .args(["--heartbeat-ms", "200", "--workspace"])
        .arg(workspace.path())
        .start();
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let agents =
            registry.list_agents(hermes_proto::ListAgentsRequest {}).await.unwrap().into_inner().agents;
        if agents.iter().any(|a| a.heartbeat.as_ref().is_some_and(|h| h.agent_id == "first")) {
            break;
        }
        assert!(Instant::now() < deadline, "the first agent did not register");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let plan = TaskPlan {
        nodes: vec![TaskNode {
            id: "w".into(),
            task_type: "fs.write".into(),
            inputs_json: r#"{"path": "out.txt", "content": "once", "append": true}"#.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let spec = GoalSpec { plan: Some(plan), ..Default::default() };
    let goal_id =
        client.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await.unwrap().into_inner().goal_id;
    let mut events = client
        .watch_goal(WatchGoalRequest { goal_id: goal_id.clone(), after_seq: 0 })
        .await
        .unwrap()
        .into_inner();
    let call_id = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Some(Kind::ApprovalRequired(a)) = events.next().await.unwrap().unwrap().kind {
                return a.call_id;
            }
        }
    })
    .await
    .expect("approval requested");

    // Kill the agent that asked, and give the node somewhere else to go.
    first.kill9();
    let mut second = AgentConfig::new("second", workspace.path());
    second.tools = vec!["fs.write".into()];
    second.confirm_tools = vec!["fs.write".into()];
    second.heartbeat_interval = Duration::from_millis(200);
    sandbox.stack().add_agent(second).await.unwrap();

    // The task is reassigned after the TTL; the new agent waits on the same approval.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!workspace.path().join("out.txt").exists(), "ran without approval");
    let reply = client
        .approve_tool_call(ApproveToolCallRequest {
            goal_id: goal_id.clone(),
            call_id: call_id.clone(),
            approve: true,
            note: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(reply.approved);

    let rest: Vec<_> =
        tokio::time::timeout(Duration::from_secs(15), events.map(|e| e.unwrap()).collect::<Vec<_>>())
            .await
            .expect("goal ends");
    assert!(matches!(rest.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{:?}", rest.last());
    assert!(
        rest.iter().any(|e| matches!(&e.kind, Some(Kind::TaskRetrying(r)) if r.node_id == "w")),
        "the task moved"
    );
    assert!(!rest.iter().any(|e| matches!(e.kind, Some(Kind::ApprovalRequired(_)))), "asked a second time");
    assert_eq!(std::fs::read_to_string(workspace.path().join("out.txt")).unwrap(), "once");
    sandbox.stop().await;
}
