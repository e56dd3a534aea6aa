//! Human approval over real gRPC: a tool that needs confirmation parks its task until someone
//! approves, denies, or lets the approval time out.

use std::time::Duration;

use futures::StreamExt;
use hermes_proto::event::Kind;
use hermes_proto::{ApproveToolCallRequest, TaskPlan, WatchGoalRequest};
use hermes_tests::{Sandbox, kind_name, node};
use serde_json::json;

async fn stack(workspace: &tempfile::TempDir, timeout: Duration) -> Sandbox {
    Sandbox::builder().workspace(workspace.path()).confirm(&["fs.write"], timeout).start().await
}

fn write_plan() -> TaskPlan {
    TaskPlan {
        nodes: vec![node("w", "fs.write", json!({"path": "approved.txt", "content": "yes"}), &[])],
        ..Default::default()
    }
}

/// A write whose content looks like a credential: it must not appear in the approval request.
fn secret_plan() -> TaskPlan {
    TaskPlan {
        nodes: vec![node(
            "w",
            "fs.write",
            json!({"path": "approved.txt", "content": "Bearer s3cr3t-canary"}),
            &[],
        )],
        ..Default::default()
    }
}

/// Follows the goal's events until `ApprovalRequired`; returns its call id.
async fn wait_for_approval(t: &mut Sandbox, goal_id: &str) -> String {
    wait_for_approval_args(t, goal_id).await.0
}

/// The call id and the arguments the approval request shows.
async fn wait_for_approval_args(t: &mut Sandbox, goal_id: &str) -> (String, String) {
    let mut events = t
        .client
        .watch_goal(WatchGoalRequest { goal_id: goal_id.into(), after_seq: 0 })
        .await
        .unwrap()
        .into_inner();
    tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(event) = events.next().await {
            if let Some(Kind::ApprovalRequired(a)) = event.unwrap().kind {
                assert_eq!(a.tool, "fs.write");
                assert!(a.arguments_json.contains("approved.txt"));
                return (a.call_id, a.arguments_json);
            }
        }
        panic!("the watch ended without an approval request");
    })
    .await
    .expect("ApprovalRequired within 10 s")
}

async fn decide(t: &mut Sandbox, goal_id: &str, call_id: &str, approve: bool) {
    let request = ApproveToolCallRequest {
        goal_id: goal_id.into(),
        call_id: call_id.into(),
        approve,
        note: "checked by ops".into(),
    };
    let reply = t.client.approve_tool_call(request).await.unwrap().into_inner();
    assert_eq!(reply.approved, approve);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approved_call_runs() {
    let workspace = tempfile::tempdir().unwrap();
    let mut t = stack(&workspace, Duration::from_secs(60)).await;
    let goal_id = t.submit(write_plan()).await.unwrap();
    let call_id = wait_for_approval(&mut t, &goal_id).await;
    assert!(!workspace.path().join("approved.txt").exists(), "ran before approval");
    decide(&mut t, &goal_id, &call_id, true).await;
    let events = t.events(&goal_id).await;
    let names: Vec<String> = events.iter().map(kind_name).collect();
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))), "{names:?}");
    assert!(events.iter().any(|e| matches!(&e.kind, Some(Kind::ApprovalDecided(d)) if d.approved)));
    assert_eq!(std::fs::read_to_string(workspace.path().join("approved.txt")).unwrap(), "yes");
    // A second decision does not change the first.
    let request =
        ApproveToolCallRequest { goal_id: goal_id.clone(), call_id, approve: false, note: String::new() };
    assert!(t.client.approve_tool_call(request).await.unwrap().into_inner().approved);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_denied_call_fails_the_node_with_denied() {
    let workspace = tempfile::tempdir().unwrap();
    let mut t = stack(&workspace, Duration::from_secs(60)).await;
    let goal_id = t.submit(write_plan()).await.unwrap();
    let call_id = wait_for_approval(&mut t, &goal_id).await;
    decide(&mut t, &goal_id, &call_id, false).await;
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().kind else { panic!("goal should fail") };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.code, "DENIED");
    assert!(error.message.contains("checked by ops"), "{}", error.message);
    assert!(!workspace.path().join("approved.txt").exists());
    // Unknown calls are NOT_FOUND.
    let request = ApproveToolCallRequest {
        goal_id: goal_id.clone(),
        call_id: "nope".into(),
        approve: true,
        note: String::new(),
    };
    assert_eq!(t.client.approve_tool_call(request).await.unwrap_err().code(), tonic::Code::NotFound);
    // The audit trail has the denial (auth off: the anonymous principal) and the refused guess.
    let audit =
        t.client.list_audit(hermes_proto::ListAuditRequest::default()).await.unwrap().into_inner().records;
    let denial = audit
        .iter()
        .find(|r| r.action == "approval.deny" && r.outcome == "OK")
        .expect("the denial is audited");
    assert_eq!(
        (denial.target.as_str(), denial.principal.as_str()),
        (format!("{goal_id}/{call_id}").as_str(), "anonymous")
    );
    assert!(denial.detail.contains("checked by ops"), "{denial:?}");
    assert!(audit.iter().any(|r| r.action == "approval.approve" && r.outcome == "NOT_FOUND"), "{audit:?}");
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_approval_nobody_gives_times_out_as_a_denial() {
    let workspace = tempfile::tempdir().unwrap();
    let mut t = stack(&workspace, Duration::from_millis(800)).await;
    let goal_id = t.submit(write_plan()).await.unwrap();
    let events = t.events(&goal_id).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().kind else { panic!("goal should fail") };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.code, "DENIED");
    assert!(error.message.contains("not approved in time"), "{}", error.message);
    assert!(events.iter().any(|e| matches!(&e.kind, Some(Kind::ApprovalDecided(d)) if d.timed_out)));
    assert!(!workspace.path().join("approved.txt").exists());
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secrets_in_the_arguments_are_redacted_in_the_request_but_used_by_the_call() {
    let workspace = tempfile::tempdir().unwrap();
    let mut t = stack(&workspace, Duration::from_secs(60)).await;
    let goal_id = t.submit(secret_plan()).await.unwrap();
    let (call_id, shown) = wait_for_approval_args(&mut t, &goal_id).await;
    assert!(!shown.contains("s3cr3t-canary") && shown.contains("[REDACTED]"), "{shown}");
    let (stored, _) = t.bus.approvals().load(&call_id).await.unwrap().unwrap();
    assert!(!format!("{stored:?}").contains("s3cr3t-canary"));
    decide(&mut t, &goal_id, &call_id, true).await;
    let events = t.events(&goal_id).await;
    assert!(matches!(events.last().unwrap().kind, Some(Kind::GoalCompleted(_))));
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("approved.txt")).unwrap(),
        "Bearer s3cr3t-canary"
    );
    t.stop().await;
}

/// A tool the agent's config says needs confirmation needs it inside an `agent.run` loop too:
/// the loop's call of it parks for approval like a plan's node, and runs only once approved.
/// (The loop once held a copy of the agent's tools made before the config's confirmations were
/// applied, and wrote without asking.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_confirmed_tool_called_by_an_agent_loop_waits_for_approval() {
    use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
    let workspace = tempfile::tempdir().unwrap();
    let llm = ScriptedLlm::start().await;
    llm.push(
        "agent-model",
        ScriptedResponse::tool_call("fs__write", r#"{"path": "approved.txt", "content": "yes"}"#),
    );
    llm.push("agent-model", ScriptedResponse::content("Written."));
    let mut t = Sandbox::builder()
        .llm(llm.base_url())
        .workspace(workspace.path())
        .confirm(&["fs.write"], Duration::from_secs(60))
        .start()
        .await;
    let plan = TaskPlan {
        nodes: vec![node(
            "loop",
            "agent.run",
            json!({"instruction": "Write yes to approved.txt", "tools": ["fs.write"]}),
            &[],
        )],
        ..Default::default()
    };
    let goal_id = t.submit(plan).await.unwrap();
    let call_id = wait_for_approval(&mut t, &goal_id).await;
    assert!(!workspace.path().join("approved.txt").exists(), "the loop wrote before approval");
    decide(&mut t, &goal_id, &call_id, true).await;
    let events = t.events(&goal_id).await;
    let names: Vec<_> = events.iter().map(kind_name).collect();
    assert_eq!(names.last().map(String::as_str), Some("completed"), "{names:?}");
    assert_eq!(std::fs::read_to_string(workspace.path().join("approved.txt")).unwrap(), "yes");
    t.stop().await;
}
