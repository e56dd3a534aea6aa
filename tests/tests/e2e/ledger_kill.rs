//! The side-effect ledger across a real `kill -9`: an agent process runs an agent node that
//! appends to a file, and is killed right after the append (its outcome recorded) and before
//! the task is acked. The node goes to another agent as a new attempt; the model asks for the
//! same append again, and the ledger answers it without running the tool. The file has one line.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hermes_executor::AgentConfig;
use hermes_executor::agent_loop::AgentModel;
use hermes_llm::{OpenAiChat, OpenAiConfig};
use hermes_proto::event::Kind;
use hermes_proto::{GoalSpec, SubmitGoalRequest, TaskNode, TaskPlan, WatchGoalRequest};
use hermes_test_util::process::HermesAgent;
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use hermes_tests::{Sandbox, hermes_bin};

const MODEL: &str = "agent-model";
const APPEND: &str = r#"{"path": "log.txt", "content": "effect\n", "append": true}"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_side_effect_runs_once_when_its_agent_is_killed_before_the_ack() {
    let llm = ScriptedLlm::start().await;
    // The first agent appends, then sleeps (and is killed meanwhile); the second is asked for
    // the same append by the model, then answers.
    llm.push(MODEL, ScriptedResponse::tool_call("fs__write", APPEND));
    llm.push(MODEL, ScriptedResponse::tool_call("time__sleep", r#"{"ms": 20000}"#));
    llm.push(MODEL, ScriptedResponse::tool_call("fs__write", APPEND));
    llm.push(MODEL, ScriptedResponse::content("done"));
    let workspace = tempfile::tempdir().unwrap();
    let mut sandbox = Sandbox::builder().agents(0).heartbeat_ttl(Duration::from_secs(1)).start().await;
    let nats = sandbox.nats.url();
    let mut client = sandbox.client.clone();

    let mut first = HermesAgent::builder(hermes_bin(), &nats, "first")
        .args(["--tools", "fs.write,time.sleep"])
        .args(["--heartbeat-ms", "200", "--llm-base-url", &llm.base_url(), "--agent-model", MODEL])
        .arg("--workspace")
        .arg(workspace.path())
        .start();
    wait_for(Duration::from_secs(15), "the first agent to serve agent.run", || {
        sandbox.stack().registry().capable_agents("agent.run").contains(&"first".to_owned())
    })
    .await;

    let plan = TaskPlan {
        nodes: vec![TaskNode {
            id: "a".into(),
            task_type: "agent.run".into(),
            inputs_json: r#"{"instruction": "append effect to log.txt"}"#.into(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let spec = GoalSpec { plan: Some(plan), ..Default::default() };
    let goal_id =
        client.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await.unwrap().into_inner().goal_id;
    let events = client
        .watch_goal(WatchGoalRequest { goal_id: goal_id.clone(), after_seq: 0 })
        .await
        .unwrap()
        .into_inner();

    // Kill -9 once the append ran and its outcome is in the ledger: the task is not acked yet.
    let log = workspace.path().join("log.txt");
    let ledger = sandbox.bus.ledger();
    wait_for(Duration::from_secs(15), "the append and its ledger entry", || {
        std::fs::read_to_string(&log).is_ok_and(|s| s == "effect\n")
    })
    .await;
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        // The bucket also holds the task's crash marker (`inflight.*`); look at the call entries.
        let keys = ledger.keys().await.unwrap();
        let mut recorded = false;
        for key in keys.iter().filter(|k| !k.starts_with("inflight.")) {
            if let Ok(Some(value)) = ledger.get(key).await
                && String::from_utf8_lossy(&value).contains("\"ok\"")
            {
                recorded = true;
            }
        }
        if recorded {
            break;
        }
        assert!(Instant::now() < deadline, "the outcome was never recorded");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // ... and once its model was asked for the next step, so the script stays in step.
    wait_for(Duration::from_secs(10), "the first agent's second model turn", || {
        llm.requests_for(MODEL).len() >= 2
    })
    .await;
    first.kill9();

    let mut second = AgentConfig::new("second", workspace.path());
    second.tools = vec!["fs.write".into(), "time.sleep".into()];
    second.heartbeat_interval = Duration::from_millis(200);
    let mut model = OpenAiConfig::new(llm.base_url(), MODEL);
    model.backoff = Duration::from_millis(10);
    second.llm = Some(AgentModel(Arc::new(OpenAiChat::new(model).unwrap())));
    sandbox.stack().add_agent(second).await.unwrap();

    let events: Vec<_> =
        tokio::time::timeout(Duration::from_secs(30), events.map(|e| e.unwrap()).collect::<Vec<_>>())
            .await
            .expect("the goal ends");
    let last = events.last().unwrap();
    assert!(matches!(last.kind, Some(Kind::GoalCompleted(_))), "{last:?}");
    assert!(
        events.iter().any(|e| matches!(&e.kind, Some(Kind::TaskRetrying(r)) if r.node_id == "a")),
        "the node moved to the second agent"
    );
    assert_eq!(llm.remaining(MODEL), 0, "the second agent's model asked for the append again");
    let side_effects = std::fs::read_to_string(&log).unwrap().lines().count();
    assert_eq!(side_effects, 1, "the append ran {side_effects} times");
    sandbox.stop().await;
}

async fn wait_for(limit: Duration, what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
