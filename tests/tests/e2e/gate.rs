//! One rule per operation, whatever the door: a single table of operations (what each needs and
//! whether it is the goal's tenant's), run for every caller (no token, an unknown one, each role
//! of tenant A, every role of tenant B) through every door that has the operation (gRPC, HTTP,
//! A2A). The outcome each door answers is held against the one the table predicts, which is
//! computed from the tokens file by `hermes_core::access`, not written out by hand; a door that
//! checked a rule of its own, skipped one or checked them in another order would differ.
//!
//! Also: a caller's `traceparent` is followed by a goal submitted through any door.

use std::time::Duration;

use futures::StreamExt as _;
use hermes_core::access::{Access, Need};
use hermes_proto::event::Kind;
use hermes_proto::{
    ApproveToolCallRequest, CancelGoalRequest, DeadLetterRequest, GetGoalRequest, GoalArtifactRequest,
    GoalSpec, ListAuditRequest, ListDeadLettersRequest, ListGoalsRequest, ListModelExchangesRequest,
    SubmitGoalRequest, TaskPlan, WatchGoalRequest,
};
use hermes_tests::{Sandbox, local_memory, node, with_token};
use serde_json::{Value, json};

const VIEWER_A: &str = "gate-viewer-a";
const SUBMITTER_A: &str = "gate-submitter-a";
const APPROVER_A: &str = "gate-approver-a";
const OPERATOR_A: &str = "gate-operator-a";
const EVERY_ROLE_B: &str = "gate-every-role-b";

fn tokens() -> String {
    use hermes_test_util::api_token as entry;
    [
        entry("viewer-a", VIEWER_A, "team-a", &["viewer"]),
        entry("submitter-a", SUBMITTER_A, "team-a", &["submitter"]),
        entry("approver-a", APPROVER_A, "team-a", &["approver"]),
        entry("operator-a", OPERATOR_A, "team-a", &["operator"]),
        entry("every-role-b", EVERY_ROLE_B, "team-b", &["viewer", "submitter", "approver", "operator"]),
    ]
    .concat()
}

/// Every caller of the table: no token, an unknown token, and the tokens above.
const CALLERS: [Option<&str>; 7] = [
    None,
    Some("not-a-known-token"),
    Some(VIEWER_A),
    Some(SUBMITTER_A),
    Some(APPROVER_A),
    Some(OPERATOR_A),
    Some(EVERY_ROLE_B),
];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Done; for a list, the tenant A item is in it.
    Ok,
    Unauthenticated,
    Denied,
    /// Not found; for a list, done without the tenant A item.
    NotFound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Door {
    Grpc,
    Http,
    A2a,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Submit,
    Get,
    List,
    Cancel,
    Watch,
    Decide,
    PendingApprovals,
    DeadLetters,
    DeadLetter,
    ReplayDeadLetter,
    Audit,
    Artifact,
    Exchanges,
    Agents,
    Sessions,
}

impl Op {
    const ALL: [Op; 15] = [
        Op::Submit,
        Op::Get,
        Op::List,
        Op::Cancel,
        Op::Watch,
        Op::Decide,
        Op::PendingApprovals,
        Op::DeadLetters,
        Op::DeadLetter,
        Op::ReplayDeadLetter,
        Op::Audit,
        Op::Artifact,
        Op::Exchanges,
        Op::Agents,
        Op::Sessions,
    ];

    /// The rule: the role it needs, and whether it reaches only the goal's own tenant (tenant
    /// A's goal, dead letter, audit records ...).
    fn rule(self) -> (Need, bool) {
        match self {
            Op::Submit => (Need::Submit, false),
            Op::Get | Op::List | Op::Watch | Op::PendingApprovals | Op::Artifact | Op::Exchanges => {
                (Need::Read, true)
            }
            Op::Cancel => (Need::Submit, true),
            Op::Decide => (Need::Approve, true),
            Op::DeadLetters | Op::DeadLetter | Op::ReplayDeadLetter | Op::Audit => (Need::Operate, true),
            Op::Agents | Op::Sessions => (Need::Read, false),
        }
    }

    /// The doors that have the operation.
    fn doors(self) -> &'static [Door] {
        match self {
            Op::Submit | Op::Get | Op::List | Op::Cancel | Op::Watch | Op::Decide => {
                &[Door::Grpc, Door::Http, Door::A2a]
            }
            Op::DeadLetters | Op::DeadLetter | Op::ReplayDeadLetter | Op::Audit | Op::Artifact => {
                &[Door::Grpc, Door::Http]
            }
            Op::Exchanges => &[Door::Grpc],
            Op::PendingApprovals | Op::Agents | Op::Sessions => &[Door::Http],
        }
    }
}

/// What the table predicts for `token` doing `op` on tenant A's things.
fn expected(access: &Access, token: Option<&str>, op: Op) -> Outcome {
    let authorization = token.map(|t| format!("Bearer {t}"));
    let Ok(principal) = access.authenticate(authorization.as_deref()) else {
        return Outcome::Unauthenticated;
    };
    let (need, tenants_own) = op.rule();
    if principal.require(need).is_err() {
        return Outcome::Denied;
    }
    if tenants_own && principal.tenant.as_deref() != Some("team-a") {
        return Outcome::NotFound;
    }
    Outcome::Ok
}

/// Tenant A's things the operations act on. Cancel and decide change them: after a caller did,
/// the next case gets a fresh one.
struct Fixture {
    /// A goal that runs for the whole test, with an artifact and a dead letter of its own.
    goal: String,
    artifact: String,
    dead_letter: u64,
    /// A goal to cancel.
    running: String,
    /// A goal waiting for a decision on `call`.
    waiting: (String, String),
}

fn sleep_plan(ms: u64) -> GoalSpec {
    GoalSpec {
        plan: Some(TaskPlan {
            nodes: vec![node("nap", "time.sleep", json!({"ms": ms}), &[])],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Sleeps longer than the test runs, in steps under `time.sleep`'s limit.
fn long_plan() -> GoalSpec {
    let naps = (0..3).map(|i| {
        let after = format!("nap{}", i.max(1) - 1);
        let deps: &[&str] = if i == 0 { &[] } else { &[after.as_str()] };
        node(&format!("nap{i}"), "time.sleep", json!({"ms": 55_000}), deps)
    });
    GoalSpec { plan: Some(TaskPlan { nodes: naps.collect(), ..Default::default() }), ..Default::default() }
}

async fn submit_as(t: &Sandbox, spec: GoalSpec, token: &str) -> String {
    let reply = t.client.clone().submit_goal(with_token(SubmitGoalRequest { spec: Some(spec) }, token)).await;
    reply.unwrap().into_inner().goal_id
}

/// A fresh goal of tenant A whose `fs.write` waits for a person, and its call id.
async fn waiting_goal(t: &Sandbox) -> (String, String) {
    let plan = TaskPlan {
        nodes: vec![node("w", "fs.write", json!({"path": "gate.txt", "content": "x"}), &[])],
        ..Default::default()
    };
    let goal = submit_as(t, GoalSpec { plan: Some(plan), ..Default::default() }, SUBMITTER_A).await;
    let request = with_token(WatchGoalRequest { goal_id: goal.clone(), after_seq: 0 }, VIEWER_A);
    let mut events = t.client.clone().watch_goal(request).await.unwrap().into_inner();
    let call = tokio::time::timeout(Duration::from_secs(30), async {
        while let Some(event) = events.next().await {
            if let Some(Kind::ApprovalRequired(asked)) = event.unwrap().kind {
                return asked.call_id;
            }
        }
        panic!("goal {goal} ended without asking for approval")
    })
    .await
    .expect("an approval is asked for within 30 s");
    (goal, call)
}

/// A fresh dead letter of `goal` (a task it sent, poisoned), and its sequence once the DLQ
/// lists it (after `after`, the last one's). `n` tells it from the earlier ones.
async fn fresh_dead_letter(t: &Sandbox, goal: &str, n: u64, after: u64) -> u64 {
    let task = hermes_proto::TaskMessage {
        goal_id: goal.into(),
        task_id: format!("{goal}.nap.{n}"),
        ..Default::default()
    };
    let payload = prost::Message::encode_to_vec(&task);
    let origin = format!("HERMES_TASKS:{}", 1000 + n);
    t.bus
        .publish_dead_letter("task", "hermes.task.pool.time.sleep", &origin, "poison", payload.into())
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let request = with_token(ListDeadLettersRequest { limit: 1000 }, OPERATOR_A);
            let letters =
                t.client.clone().list_dead_letters(request).await.unwrap().into_inner().dead_letters;
            if let Some(letter) = letters.iter().find(|d| d.goal_id == goal && d.sequence > after) {
                return letter.sequence;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the dead letter is listed within 30 s")
}

fn grpc_outcome<T>(what: &str, reply: Result<T, tonic::Status>) -> Result<T, Outcome> {
    match reply {
        Ok(value) => Ok(value),
        Err(status) => Err(match status.code() {
            tonic::Code::Unauthenticated => Outcome::Unauthenticated,
            tonic::Code::PermissionDenied => Outcome::Denied,
            tonic::Code::NotFound => Outcome::NotFound,
            _ => panic!("{what}: unexpected status {status:?}"),
        }),
    }
}

/// A list's outcome: `Ok` when it holds what `holds` looks for, `NotFound` when it does not.
fn listed(holds: bool) -> Outcome {
    if holds { Outcome::Ok } else { Outcome::NotFound }
}

async fn grpc(t: &Sandbox, fx: &Fixture, token: Option<&str>, op: Op) -> Outcome {
    let mut client = t.client.clone();
    fn request<T>(message: T, token: Option<&str>) -> tonic::Request<T> {
        match token {
            Some(token) => with_token(message, token),
            None => tonic::Request::new(message),
        }
    }
    let goal = fx.goal.clone();
    let what = format!("gRPC {op:?} as {token:?}");
    let outcome = match op {
        Op::Submit => client
            .submit_goal(request(SubmitGoalRequest { spec: Some(sleep_plan(1)) }, token))
            .await
            .map(|_| Outcome::Ok),
        Op::Get => {
            client.get_goal(request(GetGoalRequest { goal_id: goal }, token)).await.map(|_| Outcome::Ok)
        }
        Op::List => client
            .list_goals(request(ListGoalsRequest { limit: 1000 }, token))
            .await
            .map(|r| listed(r.into_inner().goals.iter().any(|g| g.goal_id == fx.goal))),
        Op::Cancel => client
            .cancel_goal(request(
                CancelGoalRequest { goal_id: fx.running.clone(), reason: "table".into() },
                token,
            ))
            .await
            .map(|_| Outcome::Ok),
        Op::Watch => client
            .watch_goal(request(WatchGoalRequest { goal_id: goal, after_seq: 0 }, token))
            .await
            .map(|_| Outcome::Ok),
        Op::Decide => {
            let (goal_id, call_id) = fx.waiting.clone();
            let decide = ApproveToolCallRequest { goal_id, call_id, approve: true, note: String::new() };
            client.approve_tool_call(request(decide, token)).await.map(|_| Outcome::Ok)
        }
        Op::DeadLetters => client
            .list_dead_letters(request(ListDeadLettersRequest { limit: 1000 }, token))
            .await
            .map(|r| listed(r.into_inner().dead_letters.iter().any(|d| d.sequence == fx.dead_letter))),
        Op::DeadLetter => client
            .get_dead_letter(request(DeadLetterRequest { sequence: fx.dead_letter }, token))
            .await
            .map(|_| Outcome::Ok),
        Op::ReplayDeadLetter => client
            .replay_dead_letter(request(DeadLetterRequest { sequence: fx.dead_letter }, token))
            .await
            .map(|_| Outcome::Ok),
        Op::Audit => client
            .list_audit(request(ListAuditRequest { limit: 1000, after_seq: 0 }, token))
            .await
            .map(|r| listed(r.into_inner().records.iter().any(|a| a.target == fx.goal))),
        Op::Artifact => {
            let read = GoalArtifactRequest { goal_id: goal, r#ref: fx.artifact.clone() };
            match client.get_goal_artifact(request(read, token)).await {
                // A stream: its first message says whether it is served.
                Ok(stream) => stream.into_inner().message().await.map(|_| Outcome::Ok),
                Err(status) => Err(status),
            }
        }
        Op::Exchanges => client
            .list_model_exchanges(request(ListModelExchangesRequest { goal_id: goal }, token))
            .await
            .map(|_| Outcome::Ok),
        Op::PendingApprovals | Op::Agents | Op::Sessions => unreachable!("{op:?} has no gRPC call"),
    };
    grpc_outcome(&what, outcome).unwrap_or_else(|outcome| outcome)
}

fn http_outcome(what: &str, status: reqwest::StatusCode, body: &str) -> Result<(), Outcome> {
    match status.as_u16() {
        200..=299 => Ok(()),
        401 => Err(Outcome::Unauthenticated),
        403 => Err(Outcome::Denied),
        404 => Err(Outcome::NotFound),
        other => panic!("{what}: unexpected status {other}: {body}"),
    }
}

/// `request` with `token` as its bearer, or without credentials.
fn bearer(request: reqwest::RequestBuilder, token: Option<&str>) -> reqwest::RequestBuilder {
    match token {
        Some(token) => request.bearer_auth(token),
        None => request,
    }
}

async fn http(t: &Sandbox, fx: &Fixture, token: Option<&str>, op: Op) -> Outcome {
    let base = t.http_url();
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let goal = &fx.goal;
    let request = match op {
        Op::Submit => client.post(format!("{base}/v1/goals")).json(&json!({"plan": {"nodes": [
            {"id": "nap", "task_type": "time.sleep", "inputs": {"ms": 1}}]}})),
        Op::Get => client.get(format!("{base}/v1/goals/{goal}")),
        Op::List => client.get(format!("{base}/v1/goals?limit=1000")),
        Op::Cancel => {
            client.post(format!("{base}/v1/goals/{}:cancel", fx.running)).json(&json!({"reason": "table"}))
        }
        Op::Watch => client.get(format!("{base}/v1/goals/{goal}/events")),
        Op::Decide => {
            let (goal, call) = &fx.waiting;
            client.post(format!("{base}/v1/approvals/{goal}/{call}:approve")).json(&json!({}))
        }
        Op::PendingApprovals => client.get(format!("{base}/v1/approvals")),
        Op::DeadLetters => client.get(format!("{base}/v1/dead-letters?limit=1000")),
        Op::DeadLetter => client.get(format!("{base}/v1/dead-letters/{}", fx.dead_letter)),
        Op::ReplayDeadLetter => client.post(format!("{base}/v1/dead-letters/{}:replay", fx.dead_letter)),
        Op::Audit => client.get(format!("{base}/v1/audit?limit=1000")),
        Op::Artifact => client.get(format!("{base}/v1/goals/{goal}/artifacts/{}", fx.artifact)),
        Op::Agents => client.get(format!("{base}/v1/agents")),
        Op::Sessions => client.get(format!("{base}/v1/sessions")),
        Op::Exchanges => unreachable!("{op:?} has no HTTP route"),
    };
    let what = format!("HTTP {op:?} as {token:?}");
    let reply = bearer(request, token).send().await.unwrap();
    let status = reply.status();
    // An event stream goes on: its status is the answer.
    let body =
        if op == Op::Watch && status.is_success() { String::new() } else { reply.text().await.unwrap() };
    if let Err(outcome) = http_outcome(&what, status, &body) {
        return outcome;
    }
    let json = || serde_json::from_str::<Value>(&body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
    match op {
        Op::List => listed(json()["goals"].as_array().unwrap().iter().any(|g| g["goalId"] == goal.as_str())),
        Op::PendingApprovals => listed(
            json()["approvals"].as_array().unwrap().iter().any(|a| a["goalId"] == fx.waiting.0.as_str()),
        ),
        Op::DeadLetters => listed(
            json()["deadLetters"]
                .as_array()
                .unwrap()
                .iter()
                .any(|d| d["sequence"].as_str().and_then(|s| s.parse().ok()) == Some(fx.dead_letter)),
        ),
        Op::Audit => {
            listed(json()["records"].as_array().unwrap().iter().any(|r| r["target"] == goal.as_str()))
        }
        _ => Outcome::Ok,
    }
}

async fn a2a(t: &Sandbox, fx: &Fixture, token: Option<&str>, op: Op, case: usize) -> Outcome {
    let (method, params) = match op {
        Op::Submit => (
            "SendMessage",
            json!({"message": {"messageId": format!("gate-table-{case}"), "role": "ROLE_USER",
                "parts": [{"data": {"nodes": [{"id": "nap", "task_type": "time.sleep", "inputs": {"ms": 1}}]}}]},
                "configuration": {"returnImmediately": true}}),
        ),
        Op::Get => ("GetTask", json!({"id": fx.goal})),
        Op::List => ("ListTasks", json!({"pageSize": 100})),
        Op::Cancel => ("CancelTask", json!({"id": fx.running})),
        Op::Watch => ("SubscribeToTask", json!({"id": fx.goal})),
        Op::Decide => (
            "SendMessage",
            json!({"message": {"messageId": format!("gate-decide-{case}"), "role": "ROLE_USER",
                "taskId": fx.waiting.0, "parts": [{"text": "approve"}]},
                "configuration": {"returnImmediately": true}}),
        ),
        _ => unreachable!("{op:?} has no A2A method"),
    };
    let client = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let request = client
        .post(format!("{}/a2a", t.http_url()))
        .json(&json!({"jsonrpc": "2.0", "id": case, "method": method, "params": params}));
    let what = format!("A2A {op:?} as {token:?}");
    let reply = bearer(request, token).send().await.unwrap();
    let status = reply.status();
    let streams = reply
        .headers()
        .get("content-type")
        .is_some_and(|v| v.to_str().unwrap_or("").starts_with("text/event-stream"));
    if streams && status.is_success() {
        return Outcome::Ok;
    }
    let body = reply.text().await.unwrap();
    if let Err(outcome) = http_outcome(&what, status, &body) {
        return outcome;
    }
    let answer: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("{what}: {e}: {body}"));
    if let Some(error) = answer.get("error") {
        assert_eq!(error["code"], -32001, "{what}: an error other than not found: {body}");
        return Outcome::NotFound;
    }
    match op {
        Op::List => {
            listed(answer["result"]["tasks"].as_array().unwrap().iter().any(|g| g["id"] == fx.goal.as_str()))
        }
        _ => Outcome::Ok,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_door_applies_the_same_rule_to_each_operation() {
    let workspace = tempfile::tempdir().unwrap();
    // Over the size a goal's output is kept inline, so the read's output is an artifact.
    std::fs::write(workspace.path().join("big.txt"), "a line of a large file\n".repeat(4_000)).unwrap();
    let t = Sandbox::builder()
        .api_tokens(&tokens())
        .workspace(workspace.path())
        .confirm(&["fs.write"], Duration::from_secs(300))
        .memory(local_memory())
        .start()
        .await;
    let access = Access::parse(&tokens()).unwrap();

    // Tenant A's goal, with an artifact: it reads a large file, then sleeps through the test.
    let plan = TaskPlan {
        nodes: vec![
            node("read", "fs.read", json!({"path": "big.txt"}), &[]),
            node("nap", "time.sleep", json!({"ms": 55_000}), &["read"]),
            node("nap2", "time.sleep", json!({"ms": 55_000}), &["nap"]),
        ],
        ..Default::default()
    };
    let goal = submit_as(&t, GoalSpec { plan: Some(plan), ..Default::default() }, SUBMITTER_A).await;
    let artifact = tokio::time::timeout(Duration::from_secs(30), async {
        loop {
            let state = t
                .client
                .clone()
                .get_goal(with_token(GetGoalRequest { goal_id: goal.clone() }, VIEWER_A))
                .await;
            let state = state.unwrap().into_inner();
            let read = state.nodes.iter().find(|n| n.node_id == "read").and_then(|n| {
                let stub: Value = serde_json::from_str(&n.output_json).ok()?;
                stub["$artifact"].as_str().map(str::to_owned)
            });
            if let Some(reference) = read {
                return reference;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("the read's output is an artifact within 30 s");
    // A dead letter of the goal.
    let dead_letter = fresh_dead_letter(&t, &goal, 0, 0).await;
    let mut fx = Fixture {
        goal,
        artifact,
        dead_letter,
        running: submit_as(&t, long_plan(), SUBMITTER_A).await,
        waiting: waiting_goal(&t).await,
    };

    let mut mismatches = Vec::new();
    let mut case = 0;
    for op in Op::ALL {
        for &door in op.doors() {
            for token in CALLERS {
                case += 1;
                let want = expected(&access, token, op);
                let got = match door {
                    Door::Grpc => grpc(&t, &fx, token, op).await,
                    Door::Http => http(&t, &fx, token, op).await,
                    Door::A2a => a2a(&t, &fx, token, op, case).await,
                };
                if got != want {
                    mismatches.push(format!(
                        "{op:?} through {door:?} as {token:?}: {got:?}, the rule says {want:?}"
                    ));
                }
                // What a case changed is replaced for the next one.
                if got == Outcome::Ok && op == Op::Cancel {
                    fx.running = submit_as(&t, long_plan(), SUBMITTER_A).await;
                }
                if got == Outcome::Ok && op == Op::Decide {
                    fx.waiting = waiting_goal(&t).await;
                }
                if got == Outcome::Ok && op == Op::ReplayDeadLetter {
                    fx.dead_letter = fresh_dead_letter(&t, &fx.goal, case as u64, fx.dead_letter).await;
                }
            }
        }
    }
    assert!(case > 150, "the table ran {case} cases");
    assert!(
        mismatches.is_empty(),
        "{} of {case} cases differ from the rule:\n{}",
        mismatches.len(),
        mismatches.join("\n")
    );
    t.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_callers_traceparent_is_followed_through_every_door() {
    let t = Sandbox::builder().api_tokens(&tokens()).start().await;
    let trace_of = |door: &str| format!("{:0>32}", format!("{:x}", door.len() as u64 * 0x9e37_79b9 + 7));
    let header = |trace: &str| format!("00-{trace}-00f067aa0ba902b7-01");
    let http = reqwest::Client::builder().timeout(Duration::from_secs(30)).build().unwrap();
    let base = t.http_url();

    let grpc_trace = trace_of("grpc");
    let mut request = with_token(SubmitGoalRequest { spec: Some(sleep_plan(1)) }, SUBMITTER_A);
    request.metadata_mut().insert("traceparent", header(&grpc_trace).parse().unwrap());
    let grpc_goal = t.client.clone().submit_goal(request).await.unwrap().into_inner().goal_id;

    let http_trace = trace_of("http-door");
    let reply = http
        .post(format!("{base}/v1/goals"))
        .bearer_auth(SUBMITTER_A)
        .header("traceparent", header(&http_trace))
        .json(&json!({"plan": {"nodes": [{"id": "nap", "task_type": "time.sleep", "inputs": {"ms": 1}}]}}))
        .send()
        .await
        .unwrap();
    assert!(reply.status().is_success(), "{}", reply.status());
    let http_goal = reply.json::<Value>().await.unwrap()["goalId"].as_str().unwrap().to_owned();

    let a2a_trace = trace_of("a2a-door-x");
    let send = json!({"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": {
        "message": {"messageId": "gate-trace", "role": "ROLE_USER",
            "parts": [{"data": {"nodes": [{"id": "nap", "task_type": "time.sleep", "inputs": {"ms": 1}}]}}]},
        "configuration": {"returnImmediately": true}}});
    let reply = http
        .post(format!("{base}/a2a"))
        .bearer_auth(SUBMITTER_A)
        .header("traceparent", header(&a2a_trace))
        .json(&send)
        .send()
        .await
        .unwrap();
    let answer: Value = reply.json().await.unwrap();
    let a2a_goal = answer["result"]["task"]["id"].as_str().unwrap_or_else(|| panic!("{answer}")).to_owned();

    for (door, goal, trace) in
        [("gRPC", grpc_goal, grpc_trace), ("HTTP", http_goal, http_trace), ("A2A", a2a_goal, a2a_trace)]
    {
        let state =
            t.client.clone().get_goal(with_token(GetGoalRequest { goal_id: goal.clone() }, VIEWER_A)).await;
        assert_eq!(
            state.unwrap().into_inner().trace_id,
            trace,
            "{door}: goal {goal} is in the caller's trace"
        );
    }
    t.stop().await;
}
