//! Auth on, over gRPC and HTTP (and A2A): no token is refused, a viewer cannot submit, and one
//! tenant cannot see, watch, cancel or approve another tenant's goals, which are `NOT_FOUND` to
//! it as goals that do not exist.

use std::time::Duration;

use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::{
    ApproveToolCallRequest, CancelGoalRequest, GetGoalRequest, GoalArtifactRequest, GoalSpec,
    ListDeadLettersRequest, ListGoalsRequest, SubmitGoalRequest, WatchGoalRequest,
};
use hermes_tests::{Sandbox, node, with_token};
use reqwest::StatusCode;
use serde_json::{Value, json};
use tonic::transport::Channel;

const SUBMITTER_A: &str = "token-submitter-a";
const VIEWER_A: &str = "token-viewer-a";
const SUBMITTER_B: &str = "token-submitter-b";
const APPROVER_B: &str = "token-approver-b";
const OPERATOR_A: &str = "token-operator-a";
const PLATFORM: &str = "token-platform";

fn tokens() -> String {
    use hermes_test_util::api_token as entry;
    [
        entry("ci-a", SUBMITTER_A, "team-a", &["submitter"]),
        entry("dash-a", VIEWER_A, "team-a", &["viewer"]),
        entry("ci-b", SUBMITTER_B, "team-b", &["submitter"]),
        entry("lead-b", APPROVER_B, "team-b", &["approver"]),
        entry("ops-a", OPERATOR_A, "team-a", &["operator"]),
        entry("platform-ops", PLATFORM, "team-ops", &["platform", "operator", "submitter"]),
    ]
    .concat()
}

fn sleep_spec(ms: u64) -> GoalSpec {
    GoalSpec {
        plan: Some(hermes_proto::TaskPlan {
            nodes: vec![node("nap", "time.sleep", json!({"ms": ms}), &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn submit(client: &mut DispatcherClient<Channel>, token: &str, spec: GoalSpec) -> String {
    client
        .submit_goal(with_token(SubmitGoalRequest { spec: Some(spec) }, token))
        .await
        .unwrap()
        .into_inner()
        .goal_id
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_grpc_no_token_is_unauthenticated_a_viewer_cannot_submit_and_tenants_do_not_see_each_other() {
    let t = Sandbox::builder().api_tokens(&tokens()).start().await;
    let mut client = t.client.clone();

    let refused = client.list_goals(ListGoalsRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let refused =
        client.list_goals(with_token(ListGoalsRequest::default(), "not-a-token")).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");

    let viewer = client
        .submit_goal(with_token(SubmitGoalRequest { spec: Some(sleep_spec(10)) }, VIEWER_A))
        .await
        .unwrap_err();
    assert_eq!(viewer.code(), tonic::Code::PermissionDenied, "{viewer:?}");
    assert!(viewer.message().contains("submitter"), "{}", viewer.message());

    let a = submit(&mut client, SUBMITTER_A, sleep_spec(30_000)).await;
    // The viewer of the same tenant reads it; tenant B does not see it at all.
    let goal = client.get_goal(with_token(GetGoalRequest { goal_id: a.clone() }, VIEWER_A)).await.unwrap();
    assert_eq!(goal.into_inner().goal_id, a);
    for (what, status) in [
        (
            "get",
            client.get_goal(with_token(GetGoalRequest { goal_id: a.clone() }, SUBMITTER_B)).await.map(|_| ()),
        ),
        (
            "watch",
            client
                .watch_goal(with_token(WatchGoalRequest { goal_id: a.clone(), after_seq: 0 }, SUBMITTER_B))
                .await
                .map(|_| ()),
        ),
        (
            "cancel",
            client
                .cancel_goal(with_token(
                    CancelGoalRequest { goal_id: a.clone(), reason: "b".into() },
                    SUBMITTER_B,
                ))
                .await
                .map(|_| ()),
        ),
        (
            "approve",
            client
                .approve_tool_call(with_token(
                    ApproveToolCallRequest {
                        goal_id: a.clone(),
                        call_id: "c1".into(),
                        approve: true,
                        note: String::new(),
                    },
                    APPROVER_B,
                ))
                .await
                .map(|_| ()),
        ),
    ] {
        let status = status.expect_err(what);
        assert_eq!(status.code(), tonic::Code::NotFound, "{what}: {status:?}");
    }
    let b_list = client.list_goals(with_token(ListGoalsRequest::default(), SUBMITTER_B)).await.unwrap();
    assert!(b_list.into_inner().goals.is_empty());
    let a_list = client.list_goals(with_token(ListGoalsRequest::default(), VIEWER_A)).await.unwrap();
    let ids: Vec<String> = a_list.into_inner().goals.into_iter().map(|g| g.goal_id).collect();
    assert_eq!(ids, [a.as_str()]);

    // The same idempotency key in two tenants is two goals.
    let keyed = |key: &str| GoalSpec { idempotency_key: key.into(), ..sleep_spec(10) };
    let ka = submit(&mut client, SUBMITTER_A, keyed("nightly")).await;
    let kb = submit(&mut client, SUBMITTER_B, keyed("nightly")).await;
    assert_ne!(ka, kb);
    assert_eq!(submit(&mut client, SUBMITTER_A, keyed("nightly")).await, ka);

    // Dead letters are the operator's.
    let denied = client
        .list_dead_letters(with_token(ListDeadLettersRequest::default(), SUBMITTER_A))
        .await
        .unwrap_err();
    assert_eq!(denied.code(), tonic::Code::PermissionDenied);
    client.list_dead_letters(with_token(ListDeadLettersRequest::default(), OPERATOR_A)).await.unwrap();

    let cancelled = client
        .cancel_goal(with_token(CancelGoalRequest { goal_id: a.clone(), reason: "done".into() }, SUBMITTER_A))
        .await
        .unwrap();
    assert_eq!(cancelled.into_inner().status, hermes_proto::GoalStatus::Cancelled as i32);
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn over_http_no_token_is_401_a_viewer_cannot_submit_and_tenants_do_not_see_each_other() {
    let t = Sandbox::builder().api_tokens(&tokens()).start().await;
    let base = t.http_url();
    let plan =
        json!({"plan": {"nodes": [{"id": "nap", "task_type": "time.sleep", "inputs": {"ms": 30000}}]}});

    let response = http().get(format!("{base}/v1/goals")).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(response.headers()["www-authenticate"], "Bearer realm=\"hermes\"");
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "UNAUTHENTICATED");

    let response =
        http().post(format!("{base}/v1/goals")).bearer_auth(VIEWER_A).json(&plan).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let problem: Value = response.json().await.unwrap();
    assert_eq!(problem["code"], "DENIED", "{problem}");

    let response =
        http().post(format!("{base}/v1/goals")).bearer_auth(SUBMITTER_A).json(&plan).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::CREATED);
    let goal: Value = response.json().await.unwrap();
    let a = goal["goalId"].as_str().unwrap().to_owned();

    let get = |token: &'static str, path: String| {
        let url = format!("{base}{path}");
        async move { http().get(url).bearer_auth(token).send().await.unwrap().status() }
    };
    assert_eq!(get(VIEWER_A, format!("/v1/goals/{a}")).await, StatusCode::OK);
    assert_eq!(get(SUBMITTER_B, format!("/v1/goals/{a}")).await, StatusCode::NOT_FOUND);
    assert_eq!(get(SUBMITTER_B, format!("/v1/goals/{a}/events")).await, StatusCode::NOT_FOUND);
    let cancel =
        http().post(format!("{base}/v1/goals/{a}:cancel")).bearer_auth(SUBMITTER_B).send().await.unwrap();
    assert_eq!(cancel.status(), StatusCode::NOT_FOUND);
    let approve = http()
        .post(format!("{base}/v1/approvals/{a}/c1:approve"))
        .bearer_auth(APPROVER_B)
        .send()
        .await
        .unwrap();
    assert_eq!(approve.status(), StatusCode::NOT_FOUND);
    let page: Value = http()
        .get(format!("{base}/v1/goals"))
        .bearer_auth(SUBMITTER_B)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(page["goals"], json!([]));
    assert_eq!(get(SUBMITTER_A, "/v1/dead-letters".into()).await, StatusCode::FORBIDDEN);
    assert_eq!(get(OPERATOR_A, "/v1/dead-letters".into()).await, StatusCode::OK);
    // The OpenAPI document and the A2A card stay public; the card says how to authenticate.
    assert_eq!(http().get(format!("{base}/v1/openapi.json")).send().await.unwrap().status(), StatusCode::OK);
    let card: Value =
        http().get(format!("{base}/.well-known/agent-card.json")).send().await.unwrap().json().await.unwrap();
    assert_eq!(card["securitySchemes"]["bearer"]["httpAuthSecurityScheme"]["scheme"], "Bearer");

    // A2A: no token is 401; tenant B's GetTask of A's goal is task-not-found.
    let rpc = json!({"jsonrpc": "2.0", "id": 1, "method": "GetTask", "params": {"id": a}});
    let response = http().post(format!("{base}/a2a")).json(&rpc).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::UNAUTHORIZED);
    let rpc_as = |token: &'static str| {
        let (url, rpc) = (format!("{base}/a2a"), rpc.clone());
        async move {
            let response = http().post(url).bearer_auth(token).json(&rpc).send().await.unwrap();
            response.json::<Value>().await.unwrap()
        }
    };
    let answer = rpc_as(SUBMITTER_B).await;
    assert_eq!(answer["error"]["code"], -32001, "{answer}");
    let answer = rpc_as(VIEWER_A).await;
    assert_eq!(answer["result"]["id"], a.as_str(), "{answer}");
    let send = json!({"jsonrpc": "2.0", "id": 2, "method": "SendMessage", "params": {"message": {
        "messageId": "m-1", "role": "ROLE_USER", "parts": [{"data": {"nodes": [
            {"id": "x", "task_type": "math.evaluate", "inputs": {"expression": "1"}}]}}]}}});
    let response = http().post(format!("{base}/a2a")).bearer_auth(VIEWER_A).json(&send).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let cancel =
        http().post(format!("{base}/v1/goals/{a}:cancel")).bearer_auth(SUBMITTER_A).send().await.unwrap();
    assert_eq!(cancel.status(), StatusCode::OK);
    t.stop().await;
}

/// Every submit, cancel and approval decision is in the audit trail with its principal, tenant,
/// origin and outcome, refused ones too; an operator reads only its own tenant's records, over
/// gRPC and HTTP, and nobody else may read them.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn audited_actions_are_recorded_with_their_principal_and_read_by_their_tenants_operators() {
    let t = Sandbox::builder().api_tokens(&tokens()).start().await;
    let mut client = t.client.clone();
    let a = submit(&mut client, SUBMITTER_A, sleep_spec(30_000)).await;
    let b = submit(&mut client, SUBMITTER_B, sleep_spec(1)).await;
    // Refused: a viewer submits, tenant B cancels A's goal, B's approver decides on A's goal.
    let denied =
        client.submit_goal(with_token(SubmitGoalRequest { spec: Some(sleep_spec(1)) }, VIEWER_A)).await;
    assert_eq!(denied.unwrap_err().code(), tonic::Code::PermissionDenied);
    let request = CancelGoalRequest { goal_id: a.clone(), reason: "not yours".into() };
    assert_eq!(
        client.cancel_goal(with_token(request, SUBMITTER_B)).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    let request = ApproveToolCallRequest {
        goal_id: a.clone(),
        call_id: "c1".into(),
        approve: true,
        note: String::new(),
    };
    assert_eq!(
        client.approve_tool_call(with_token(request, APPROVER_B)).await.unwrap_err().code(),
        tonic::Code::NotFound
    );
    // Done: A cancels its own goal over HTTP.
    let base = t.http_url();
    let cancel =
        http().post(format!("{base}/v1/goals/{a}:cancel")).bearer_auth(SUBMITTER_A).send().await.unwrap();
    assert_eq!(cancel.status(), StatusCode::OK);

    let request = hermes_proto::ListAuditRequest { limit: 100, after_seq: 0 };
    let records = client.list_audit(with_token(request, OPERATOR_A)).await.unwrap().into_inner().records;
    let seen: Vec<(&str, &str, &str, &str)> = records
        .iter()
        .map(|r| (r.principal.as_str(), r.action.as_str(), r.target.as_str(), r.outcome.as_str()))
        .collect();
    assert_eq!(
        seen,
        vec![
            ("ci-a", "goal.submit", a.as_str(), "OK"),
            ("dash-a", "goal.submit", "", "DENIED"),
            ("ci-a", "goal.cancel", a.as_str(), "OK"),
        ],
        "team-a's operator sees team-a's records only, in order"
    );
    assert!(records.iter().all(|r| r.tenant == "team-a" && r.at_unix_ms > 0 && r.seq > 0));
    assert!(records[0].origin.starts_with("grpc 127.0.0.1:"), "{:?}", records[0].origin);
    assert!(records[2].origin.starts_with("http 127.0.0.1:"), "{:?}", records[2].origin);
    // Paging: after the first record's seq come the other two.
    let request = hermes_proto::ListAuditRequest { limit: 100, after_seq: records[0].seq };
    assert_eq!(
        client.list_audit(with_token(request, OPERATOR_A)).await.unwrap().into_inner().records.len(),
        2
    );

    // Only operators read the trail.
    let request = hermes_proto::ListAuditRequest::default();
    assert_eq!(
        client.list_audit(with_token(request, SUBMITTER_A)).await.unwrap_err().code(),
        tonic::Code::PermissionDenied
    );
    let response = http().get(format!("{base}/v1/audit")).bearer_auth(VIEWER_A).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::FORBIDDEN);
    let response =
        http().get(format!("{base}/v1/audit?limit=2")).bearer_auth(OPERATOR_A).send().await.unwrap();
    assert_eq!(response.status(), StatusCode::OK);
    let body: Value = response.json().await.unwrap();
    let records = body["records"].as_array().unwrap();
    assert_eq!(records.len(), 2, "{body}");
    assert_eq!(records[0]["action"], "goal.submit");
    assert_eq!(records[0]["principal"], "ci-a");
    assert!(!body.to_string().contains(&b), "no record of team-b's goal reaches team-a: {body}");
    t.stop().await;
}

/// A platform operator (the `platform` role) reads and acts on every tenant's goals and reads
/// every tenant's audit trail; its cancel of team-a's goal is in team-a's trail too, so team-a's
/// operators see who acted. Its own submits stay in its own tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_platform_operator_acts_across_tenants_and_is_audited_in_theirs() {
    let t = Sandbox::builder().api_tokens(&tokens()).start().await;
    let mut client = t.client.clone();
    let a = submit(&mut client, SUBMITTER_A, sleep_spec(30_000)).await;
    let b = submit(&mut client, SUBMITTER_B, sleep_spec(1)).await;
    let own = submit(&mut client, PLATFORM, sleep_spec(1)).await;
    let listed =
        client.list_goals(with_token(ListGoalsRequest::default(), PLATFORM)).await.unwrap().into_inner();
    let ids: Vec<&str> = listed.goals.iter().map(|g| g.goal_id.as_str()).collect();
    for goal in [&a, &b, &own] {
        assert!(ids.contains(&goal.as_str()), "{goal} missing from {ids:?}");
    }
    // Tenants still do not see the platform's own goal.
    let listed = client.list_goals(with_token(ListGoalsRequest::default(), SUBMITTER_A)).await.unwrap();
    assert!(listed.into_inner().goals.iter().all(|g| g.goal_id != own));

    let request = CancelGoalRequest { goal_id: a.clone(), reason: "runaway".into() };
    client.cancel_goal(with_token(request, PLATFORM)).await.expect("the platform cancels team-a's goal");

    let request = hermes_proto::ListAuditRequest { limit: 100, after_seq: 0 };
    let team_a = client.list_audit(with_token(request, OPERATOR_A)).await.unwrap().into_inner().records;
    let cancel = team_a.iter().find(|r| r.action == "goal.cancel").expect("the cancel is in team-a's trail");
    assert_eq!(
        (cancel.principal.as_str(), cancel.tenant.as_str(), cancel.target.as_str()),
        ("platform-ops", "team-a", a.as_str())
    );
    assert!(cancel.detail.contains("platform operator `platform-ops` of tenant `team-ops`"), "{cancel:?}");
    let all = client.list_audit(with_token(request, PLATFORM)).await.unwrap().into_inner().records;
    let tenants: std::collections::BTreeSet<&str> = all.iter().map(|r| r.tenant.as_str()).collect();
    assert!(tenants.is_superset(&["team-a", "team-b", "team-ops"].into()), "{tenants:?}");
    t.stop().await;
}

/// A call refused for its credentials is audited with its door and address, at most once per
/// address every 10 s: a flood of bad tokens leaves one record that counts the rest when the
/// next is written, and the metric counts every one.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn failed_authentications_are_audited_at_a_bounded_rate() {
    let t = Sandbox::builder().api_tokens(&tokens()).start().await;
    let mut client = t.client.clone();
    for _ in 0..25 {
        let refused = client.list_goals(with_token(ListGoalsRequest::default(), "not-a-token")).await;
        assert_eq!(refused.unwrap_err().code(), tonic::Code::Unauthenticated);
    }
    let read = || async {
        let js = t.bus.jetstream();
        let filter = "hermes.audit._".to_owned();
        hermes_core::bus::read_filtered::<hermes_proto::AuditRecord>(
            js,
            "HERMES_AUDIT",
            filter,
            1,
            100,
            "audit",
        )
        .await
        .unwrap()
    };
    // Written off the call's path: wait for it.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    let records = loop {
        let records = read().await;
        if !records.is_empty() || std::time::Instant::now() > deadline {
            break records;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(records.len(), 1, "25 failures from one address within 10 s leave one record: {records:?}");
    let record = &records[0].1;
    assert_eq!(
        (record.principal.as_str(), record.action.as_str(), record.outcome.as_str(), record.tenant.as_str()),
        ("unauthenticated", "auth.failed", "UNAUTHENTICATED", "")
    );
    assert!(record.origin.starts_with("grpc 127.0.0.1"), "{record:?}");
    assert!(record.detail.contains("not known"), "{record:?}");
    assert!(!format!("{record:?}").contains("not-a-token"), "the token itself is never recorded");
    let metrics = hermes_core::metrics::global().render();
    let line = metrics.lines().find(|l| l.starts_with("hermes_auth_failures_total{door=\"grpc\"}"));
    let counted: f64 = line.and_then(|l| l.rsplit(' ').next()).and_then(|v| v.parse().ok()).unwrap_or(0.0);
    assert!(counted >= 25.0, "{line:?}");
    t.stop().await;
}

/// The Registry and Memory gRPC services on the dispatcher's port check tokens too: any role
/// reads agents, only operators use the Memory API (each in its tenant, see tenancy.rs);
/// health stays open.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_registry_and_memory_services_beside_the_dispatcher_need_a_token() {
    let mut t =
        Sandbox::builder().api_tokens(&tokens()).memory(hermes_memory::MemoryConfig::default()).start().await;
    let channel =
        tonic::transport::Channel::from_shared(t.stack().grpc_url()).unwrap().connect().await.unwrap();
    let mut registry = hermes_proto::registry_client::RegistryClient::new(channel.clone());
    let refused = registry.list_agents(hermes_proto::ListAgentsRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    registry
        .list_agents(with_token(hermes_proto::ListAgentsRequest {}, VIEWER_A))
        .await
        .expect("a viewer reads agents");

    let mut memory = hermes_proto::memory_client::MemoryClient::new(channel.clone());
    let refused = memory.list_sessions(hermes_proto::ListSessionsRequest::default()).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let refused = memory
        .list_sessions(with_token(hermes_proto::ListSessionsRequest::default(), VIEWER_A))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    memory
        .list_sessions(with_token(hermes_proto::ListSessionsRequest::default(), OPERATOR_A))
        .await
        .expect("an operator reads memory");

    let mut health = tonic_health::pb::health_client::HealthClient::new(channel);
    health.check(tonic_health::pb::HealthCheckRequest::default()).await.expect("health stays open");
    t.stop().await;
}

/// Inputs marked `secret_inputs`, and values the redaction rules find, reach only principals
/// with the `secrets` role: a viewer reads them redacted over gRPC and HTTP and in the events;
/// a `secret_inputs` name that is not an input is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secret_inputs_are_shown_only_to_principals_with_the_secrets_role() {
    const REVEALER: &str = "token-secrets-a";
    let workspace = tempfile::tempdir().unwrap();
    let tokens =
        tokens() + &hermes_test_util::api_token("auditor-a", REVEALER, "team-a", &["viewer", "secrets"]);
    let t = Sandbox::builder().api_tokens(&tokens).workspace(workspace.path()).start().await;
    let mut client = t.client.clone();
    let mut write = node("w", "fs.write", json!({"path": "note.txt", "content": "hunter2-canary"}), &[]);
    write.secret_inputs = vec!["content".into()];
    let spec = GoalSpec {
        plan: Some(hermes_proto::TaskPlan { nodes: vec![write.clone()], ..Default::default() }),
        ..Default::default()
    };
    let goal_id = submit(&mut client, SUBMITTER_A, spec).await;
    t.events_as(&goal_id, VIEWER_A).await;
    assert_eq!(
        std::fs::read_to_string(workspace.path().join("note.txt")).unwrap(),
        "hunter2-canary",
        "the agent got it whole"
    );

    let as_viewer = client
        .get_goal(with_token(GetGoalRequest { goal_id: goal_id.clone() }, VIEWER_A))
        .await
        .unwrap()
        .into_inner();
    let inputs = &as_viewer.plan.as_ref().unwrap().nodes[0].inputs_json;
    assert!(
        !inputs.contains("hunter2") && inputs.contains("[REDACTED]") && inputs.contains("note.txt"),
        "{inputs}"
    );
    let as_revealer = client
        .get_goal(with_token(GetGoalRequest { goal_id: goal_id.clone() }, REVEALER))
        .await
        .unwrap()
        .into_inner();
    assert!(as_revealer.plan.as_ref().unwrap().nodes[0].inputs_json.contains("hunter2-canary"));
    let listed =
        client.list_goals(with_token(ListGoalsRequest::default(), VIEWER_A)).await.unwrap().into_inner();
    assert!(!format!("{listed:?}").contains("hunter2"), "the list is redacted too");
    let body = http()
        .get(format!("{}/v1/goals/{goal_id}", t.http_url()))
        .bearer_auth(VIEWER_A)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!body.contains("hunter2") && body.contains("REDACTED"), "{body}");
    let events = t.events_as(&goal_id, REVEALER).await;
    assert!(!format!("{events:?}").contains("hunter2"), "events are redacted for everyone");
    // The goal a submit answers with is redacted too (the submitter lacks the secrets role).
    let plan = json!({"plan": {"nodes": [{"id": "w", "task_type": "fs.write",
        "inputs": {"path": "other.txt", "content": "hunter2-again"}, "secret_inputs": ["content"]}]}});
    let answer = http()
        .post(format!("{}/v1/goals", t.http_url()))
        .bearer_auth(SUBMITTER_A)
        .json(&plan)
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), StatusCode::CREATED);
    let body = answer.text().await.unwrap();
    assert!(!body.contains("hunter2") && body.contains("REDACTED"), "{body}");

    write.secret_inputs = vec!["nope".into()];
    let spec = GoalSpec {
        plan: Some(hermes_proto::TaskPlan { nodes: vec![write], ..Default::default() }),
        ..Default::default()
    };
    let refused = client
        .submit_goal(with_token(SubmitGoalRequest { spec: Some(spec) }, SUBMITTER_A))
        .await
        .unwrap_err();
    assert_eq!(refused.code(), tonic::Code::InvalidArgument);
    assert!(refused.message().contains("secret_inputs names `nope`"), "{refused:?}");

    // A large output is kept as an artifact; read through the goal, it is redacted as the
    // goal's outputs are, over HTTP and gRPC, and whole for the secrets role.
    let big = format!("password: hunter2-large\n{}", "a line of a large file\n".repeat(4_000));
    std::fs::write(workspace.path().join("big.txt"), &big).unwrap();
    let read = node("r", "fs.read", json!({"path": "big.txt"}), &[]);
    let spec = GoalSpec {
        plan: Some(hermes_proto::TaskPlan { nodes: vec![read], ..Default::default() }),
        ..Default::default()
    };
    let goal_id = submit(&mut client, SUBMITTER_A, spec).await;
    t.events_as(&goal_id, VIEWER_A).await;
    let goal = client
        .get_goal(with_token(GetGoalRequest { goal_id: goal_id.clone() }, VIEWER_A))
        .await
        .unwrap()
        .into_inner();
    assert!(!goal.output_json.contains("hunter2"), "the stub's preview is redacted: {}", goal.output_json);
    let stub: Value = serde_json::from_str(&goal.output_json).unwrap();
    let reference = stub["$artifact"].as_str().expect("the output is a stub").to_owned();
    let url = format!("{}/v1/goals/{goal_id}/artifacts/{reference}", t.http_url());
    let body = http().get(&url).bearer_auth(VIEWER_A).send().await.unwrap().text().await.unwrap();
    let output: Value = serde_json::from_str(&body).unwrap();
    let text = output["text"].as_str().unwrap();
    assert!(!text.contains("hunter2") && text.contains("[REDACTED]"), "{}", &text[..80]);
    assert!(text.ends_with("a line of a large file\n"), "the rest is kept");
    let read = |token: &'static str| {
        let mut client = client.clone();
        let request = GoalArtifactRequest { goal_id: goal_id.clone(), r#ref: reference.clone() };
        async move {
            let mut chunks = client.get_goal_artifact(with_token(request, token)).await.unwrap().into_inner();
            let mut bytes = Vec::new();
            while let Some(chunk) = chunks.message().await.unwrap() {
                bytes.extend(chunk.data);
            }
            String::from_utf8(bytes).unwrap()
        }
    };
    assert!(!read(VIEWER_A).await.contains("hunter2"), "gRPC redacts it too");
    let whole: Value = serde_json::from_str(&read(REVEALER).await).unwrap();
    assert_eq!(whole["text"], big.as_str(), "the secrets role reads it whole");
    t.stop().await;
}
