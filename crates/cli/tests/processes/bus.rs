//! The production shape of the bus: every service as its own process and its own NATS user,
//! under the very `deploy/nats/accounts.conf` a deployment loads. A text goal is planned by the
//! planner, its agent loop calls a tool, a call waits for a person's approval, and the goal
//! completes, with nothing any service does refused by the server. Then an agent's credentials
//! try what the file forbids, and a forged result loses to the real one.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use futures::StreamExt;
use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::event::Kind;
use hermes_proto::{
    ApproveToolCallRequest, GetGoalRequest, GoalSpec, GoalStatus, ListGoalsRequest, SubmitGoalRequest,
    TaskPlan, TaskResult, TaskStatus, WatchGoalRequest,
};
use hermes_test_util::NatsServer;
use hermes_test_util::process::{HermesProcess, built_binary, wait_until};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use prost::Message as _;
use serde_json::{Value, json};
use tonic::transport::Channel;

use crate::repo_root;

const USERS: [&str; 5] = ["dispatcher", "registry", "planner", "memory", "agent"];

/// `deploy/nats/accounts.conf` with a fresh password for each user, and a URL per user.
pub(crate) struct Accounts {
    pub(crate) config: String,
    passwords: Vec<(&'static str, String)>,
}

impl Accounts {
    pub(crate) fn load() -> Accounts {
        let mut config = std::fs::read_to_string(repo_root().join("deploy/nats/accounts.conf")).unwrap();
        let mut passwords = Vec::new();
        for user in USERS {
            let password = format!("{user}-{}", uuid_like());
            config = config.replace(&format!("${}", password_var(user)), &format!("\"{password}\""));
            passwords.push((user, password));
        }
        config = config.replace("$NATS_SYS_PASSWORD", &format!("\"{}\"", uuid_like()));
        assert!(!config.contains("_PASSWORD"), "every password variable is filled in");
        Accounts { config, passwords }
    }

    pub(crate) fn url(&self, nats: &NatsServer, user: &str) -> String {
        let password = &self.passwords.iter().find(|(u, _)| *u == user).unwrap().1;
        format!("nats://{user}:{password}@127.0.0.1:{}", nats.port())
    }
}

fn password_var(user: &str) -> String {
    format!("HERMES_{}_NATS_PASSWORD", user.to_ascii_uppercase())
}

/// A random password: 128 bits in hex.
fn uuid_like() -> String {
    format!("{:032x}", rand::random::<u128>())
}

pub(crate) fn free_addr() -> String {
    format!("127.0.0.1:{}", hermes_test_util::free_port())
}

/// A service binary as its own process, logging to `<dir>/<name>.log`.
pub(crate) fn service(dir: &Path, binary: &str, args: &[&str]) -> (HermesProcess, PathBuf) {
    let log = dir.join(format!("{binary}.log"));
    (HermesProcess::start_logged(built_binary(binary), args, &log), log)
}

/// The API token of the test's one principal, with every role, in tenant `team-a` (which has
/// quotas, so the dispatcher's quota bucket is used under its NATS user too).
pub(crate) const TOKEN: &str = "bus-test-token";
const VIEWER_TOKEN: &str = "bus-test-viewer-token";

fn tokens_file(dir: &Path) -> PathBuf {
    let path = dir.join("tokens.toml");
    let roles = ["submitter", "viewer", "approver", "operator"];
    let text = hermes_test_util::api_token("ops", TOKEN, "team-a", &roles)
        + &hermes_test_util::api_token("dash", VIEWER_TOKEN, "team-a", &["viewer"])
        + "[[tenant]]\nname = \"team-a\"\nmax_running_goals = 10\ndaily_tokens = 1000000\n";
    std::fs::write(&path, text).unwrap();
    path
}

pub(crate) fn authorize(mut request: tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status> {
    request.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    Ok(request)
}

pub(crate) type Authorize = fn(tonic::Request<()>) -> Result<tonic::Request<()>, tonic::Status>;
pub(crate) type Client =
    DispatcherClient<tonic::service::interceptor::InterceptedService<Channel, Authorize>>;

pub(crate) async fn connect(addr: &str) -> Client {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match Channel::from_shared(format!("http://{addr}")).unwrap().connect().await {
            Ok(channel) => return DispatcherClient::with_interceptor(channel, authorize as Authorize),
            Err(e) if Instant::now() > deadline => panic!("the dispatcher does not answer on {addr}: {e}"),
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
}

/// Follows a goal to its end, approving every call that waits for a person.
async fn follow(client: &Client, goal_id: &str) -> Vec<hermes_proto::Event> {
    let mut approver = client.clone();
    let mut stream = client
        .clone()
        .watch_goal(WatchGoalRequest { goal_id: goal_id.into(), after_seq: 0 })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    let followed = tokio::time::timeout(Duration::from_secs(90), async {
        while let Some(event) = stream.next().await {
            let event = event.unwrap();
            if let Some(Kind::ApprovalRequired(a)) = &event.kind {
                let request = ApproveToolCallRequest {
                    goal_id: goal_id.into(),
                    call_id: a.call_id.clone(),
                    approve: true,
                    note: "looks right".into(),
                };
                assert!(approver.approve_tool_call(request).await.unwrap().into_inner().approved);
            }
            events.push(event);
        }
    })
    .await;
    assert!(followed.is_ok(), "goal {goal_id} did not end within 90 s: {events:?}");
    events
}

/// A channel to the registry at `addr`, once it answers and lists every agent of `ids` online
/// (within 60 s; `logs` says what the failure message shows).
pub(crate) async fn wait_online(addr: &str, ids: &[&str], logs: impl Fn() -> String) -> Channel {
    let channel = loop {
        if let Ok(channel) = Channel::from_shared(format!("http://{addr}")).unwrap().connect().await {
            break channel;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut registry =
        hermes_proto::registry_client::RegistryClient::with_interceptor(channel.clone(), authorize);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = registry.list_agents(hermes_proto::ListAgentsRequest {}).await;
        let online: Vec<String> = listed
            .map(|l| {
                l.into_inner()
                    .agents
                    .into_iter()
                    .filter(|a| a.online)
                    .filter_map(|a| a.heartbeat.map(|h| h.agent_id))
                    .collect()
            })
            .unwrap_or_default();
        if ids.iter().all(|id| online.iter().any(|o| o == id)) {
            return channel;
        }
        assert!(Instant::now() < deadline, "{ids:?} did not register within 60 s: {online:?}\n{}", logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A client of an agent's NATS user that records the server's refusals.
pub(crate) struct Attacker {
    pub(crate) client: async_nats::Client,
    refusals: tokio::sync::mpsc::UnboundedReceiver<String>,
}

impl Attacker {
    pub(crate) async fn connect(url: &str) -> Attacker {
        let (tx, refusals) = tokio::sync::mpsc::unbounded_channel();
        let addr: async_nats::ServerAddr = url.parse().unwrap();
        let user = addr.username().unwrap().to_owned();
        let client =
            async_nats::ConnectOptions::with_user_and_password(user.clone(), addr.password().unwrap().into())
                .name("attacker")
                .custom_inbox_prefix(format!("_INBOX_{user}"))
                .event_callback(move |event| {
                    let tx = tx.clone();
                    async move {
                        if let async_nats::Event::ServerError(e) = event {
                            let _ = tx.send(e.to_string());
                        }
                    }
                })
                .connect(url)
                .await
                .unwrap();
        Attacker { client, refusals }
    }

    /// The server's refusal that names `subject`, within 5 s.
    pub(crate) async fn refused(&mut self, what: &str, subject: &str) -> String {
        tokio::time::timeout(Duration::from_secs(5), async {
            while let Some(refusal) = self.refusals.recv().await {
                if refusal.contains(subject) {
                    return refusal;
                }
            }
            panic!("the refusals channel closed");
        })
        .await
        .unwrap_or_else(|_| panic!("the server did not refuse {what} ({subject}) to the agent"))
    }

    pub(crate) async fn publish_refused(&mut self, what: &str, subject: String) {
        self.client.publish(subject.clone(), "forged".into()).await.unwrap();
        self.client.flush().await.unwrap();
        let refusal = self.refused(what, &subject).await;
        assert!(refusal.to_lowercase().contains("permissions violation"), "{refusal}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_service_runs_as_its_own_nats_user_and_an_agent_cannot_forge_or_approve() {
    let accounts = Accounts::load();
    let nats = NatsServer::start_with_config(&accounts.config);
    let dir = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let llm = ScriptedLlm::start().await;
    let plan = json!({
        "reasoning": "a sum, an agent's product, and a file that needs approval",
        "nodes": [
            {"id": "sum", "task_type": "math.evaluate", "inputs": {"expression": "40 + 2"}},
            {"id": "think", "task_type": "agent.run", "inputs": {"instruction": "Multiply 19 by 3", "tools": ["math.evaluate"]}},
            {"id": "save", "task_type": "fs.write", "inputs": {"path": "answer.txt", "content": "42"}, "depends_on": ["sum"]}
        ]
    });
    llm.push("planner-model", ScriptedResponse::content(plan.to_string()));
    llm.push("agent-model", ScriptedResponse::tool_call("math__evaluate", r#"{"expression": "19 * 3"}"#));
    llm.push("agent-model", ScriptedResponse::content("The result is 57."));

    // The dispatcher first: it creates the shared streams and buckets the others only look up.
    let grpc = free_addr();
    let (_dispatcher, dispatcher_log) = service(
        dir.path(),
        "hermes-dispatcher",
        &[
            "--nats-url",
            &accounts.url(&nats, "dispatcher"),
            "--grpc-listen",
            &grpc,
            "--dispatcher-http-listen",
            "off",
            "--dispatcher-api-tokens-file",
            tokens_file(dir.path()).to_str().unwrap(),
            "--dispatcher-planner-service",
            "true",
            "--dispatcher-webhooks-allow",
            "127.0.0.1",
            "--llm-provider",
            "none",
        ],
    );
    let mut client = connect(&grpc).await;
    // A standing webhook endpoint of team-a: sent through the dispatcher's own NATS rights.
    let receiver = hermes_test_util::receiver::Receiver::start().await;
    let mut create = tonic::Request::new(hermes_proto::CreateWebhookRequest {
        url: receiver.url.clone(),
        ..Default::default()
    });
    create.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    let created = client.create_webhook(create).await.expect("a submitter registers a webhook").into_inner();
    // The registry and memory check the same API tokens on their own ports, as in the chart.
    let tokens = tokens_file(dir.path());
    let tokens = tokens.to_str().unwrap();
    let (registry_grpc, memory_grpc) = (free_addr(), free_addr());
    let (_registry, _) = service(
        dir.path(),
        "hermes-registry",
        &[
            "--nats-url",
            &accounts.url(&nats, "registry"),
            "--grpc-listen",
            &registry_grpc,
            "--api-tokens-file",
            tokens,
        ],
    );
    let (_memory, _) = service(
        dir.path(),
        "hermes-memory",
        &[
            "--nats-url",
            &accounts.url(&nats, "memory"),
            "--grpc-listen",
            &memory_grpc,
            "--api-tokens-file",
            tokens,
        ],
    );
    let (_planner, _) = service(
        dir.path(),
        "hermes-planner",
        &[
            "--nats-url",
            &accounts.url(&nats, "planner"),
            "--llm-provider",
            "openai",
            "--llm-base-url",
            &llm.base_url(),
            "--llm-planner-model",
            "planner-model",
        ],
    );
    let (_agent, agent_log) = service(
        dir.path(),
        "hermes-executor",
        &[
            "--nats-url",
            &accounts.url(&nats, "agent"),
            "--agent-id",
            "agent-1",
            "--agent-workspace",
            workspace.path().to_str().unwrap(),
            "--agent-confirm",
            "fs.write",
            "--agent-heartbeat-ms",
            "500",
            "--llm-provider",
            "openai",
            "--llm-base-url",
            &llm.base_url(),
            "--llm-model",
            "agent-model",
        ],
    );
    // The agent is live once the registry lists it.
    let registry_channel = wait_online(&registry_grpc, &["agent-1"], || {
        format!("its log:\n{}", std::fs::read_to_string(&agent_log).unwrap_or_default())
    })
    .await;

    let mut anonymous = hermes_proto::registry_client::RegistryClient::new(registry_channel);
    let refused = anonymous.list_agents(hermes_proto::ListAgentsRequest {}).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    // Memory needs an operator: no token and a viewer's are refused.
    // The memory service may still be starting: it binds its port after connecting to NATS.
    let deadline = Instant::now() + Duration::from_secs(60);
    let memory = loop {
        match Channel::from_shared(format!("http://{memory_grpc}")).unwrap().connect().await {
            Ok(channel) => break channel,
            Err(e) => {
                assert!(Instant::now() < deadline, "the memory service did not listen within 60 s: {e}")
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut memory = hermes_proto::memory_client::MemoryClient::new(memory);
    let sessions = |token: Option<&str>| {
        let mut request = tonic::Request::new(hermes_proto::ListSessionsRequest::default());
        if let Some(token) = token {
            request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().unwrap());
        }
        request
    };
    let refused = memory.list_sessions(sessions(None)).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::Unauthenticated, "{refused:?}");
    let refused = memory.list_sessions(sessions(Some(VIEWER_TOKEN))).await.unwrap_err();
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused:?}");
    // The token's tenant, not the one a call names: a turn sent for team-b lands in team-a.
    let turn = hermes_proto::SessionTurn {
        session_id: "chat".into(),
        role: "user".into(),
        content: "hello".into(),
        ..Default::default()
    };
    let mut append =
        tonic::Request::new(hermes_proto::AppendTurnRequest { turn: Some(turn), tenant: "team-b".into() });
    append.metadata_mut().insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    memory.append_turn(append).await.expect("an operator writes memory");
    let listed = memory.list_sessions(sessions(Some(TOKEN))).await.expect("an operator reads memory");
    let ids: Vec<String> = listed.into_inner().sessions.into_iter().map(|s| s.session_id).collect();
    assert_eq!(ids, ["chat"], "the turn is team-a's");

    // A text goal, end to end: planned, an agent loop, an approval (asked and answered through
    // a dispatcher, since agents may not write approvals), a file written.
    let spec = GoalSpec { text: "Add 40 and 2, multiply 19 by 3, save the sum".into(), ..Default::default() };
    let goal_id = client
        .submit_goal(SubmitGoalRequest { spec: Some(spec) })
        .await
        .expect("the text goal is accepted")
        .into_inner()
        .goal_id;
    let events = follow(&client, &goal_id).await;
    let goal = client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await.unwrap().into_inner();
    assert_eq!(
        goal.status,
        GoalStatus::Completed as i32,
        "the goal did not complete: {:?}\ndispatcher log:\n{}\nagent log:\n{}",
        goal.error,
        std::fs::read_to_string(&dispatcher_log).unwrap_or_default(),
        std::fs::read_to_string(&agent_log).unwrap_or_default()
    );
    // Lists come from the goal index, which the dispatcher follows under its own NATS rights.
    let listed = client.list_goals(ListGoalsRequest { limit: 10 }).await.unwrap().into_inner().goals;
    assert!(
        listed.iter().any(|g| g.goal_id == goal_id && g.status == GoalStatus::Completed as i32),
        "{listed:?}"
    );
    let output: Value = serde_json::from_str(&goal.output_json).unwrap();
    assert_eq!(output["think"]["answer"], "The result is 57.", "{output}");
    assert_eq!(std::fs::read_to_string(workspace.path().join("answer.txt")).unwrap().trim(), "42");
    assert!(
        events.iter().any(|e| matches!(&e.kind, Some(Kind::ToolCalled(c)) if c.tool == "math.evaluate")),
        "the agent loop's tool call reached the events through a dispatcher"
    );
    assert!(events.iter().any(|e| matches!(&e.kind, Some(Kind::ApprovalDecided(d)) if d.approved)));
    // The approval's wait and the end reached the tenant's endpoint, in that order, signed.
    let got = receiver.requests(2, Duration::from_secs(30)).await;
    let kinds: Vec<String> = got.iter().map(|r| r.event_type()).collect();
    assert_eq!(kinds, ["goal.needs_input", "goal.completed"], "{got:?}");
    assert!(got[1].header("webhook-signature").starts_with("v1,"));
    assert!(!created.secret.is_empty());

    // The audit trail has the submit and the approval, with where they came from.
    let records = client
        .list_audit(hermes_proto::ListAuditRequest { limit: 100, after_seq: 0 })
        .await
        .expect("the dispatcher reads its audit stream")
        .into_inner()
        .records;
    let actions: Vec<(&str, &str, &str)> =
        records.iter().map(|r| (r.action.as_str(), r.target.as_str(), r.outcome.as_str())).collect();
    assert!(actions.contains(&("goal.submit", goal_id.as_str(), "OK")), "{actions:?}");
    assert!(
        records.iter().any(|r| r.action == "approval.approve"
            && r.target.starts_with(&format!("{goal_id}/"))
            && r.outcome == "OK"
            && r.principal == "ops"
            && r.tenant == "team-a"
            && r.origin.starts_with("grpc 127.0.0.1:")),
        "{records:?}"
    );

    // An agent's credentials: no goal writes, no events, no approvals, no reading others'
    // replies, no deleting streams.
    let mut attacker = Attacker::connect(&accounts.url(&nats, "agent")).await;
    attacker.publish_refused("writing a goal", format!("$KV.hermes_goals.{goal_id}")).await;
    attacker.publish_refused("publishing a goal event", format!("hermes.event.{goal_id}")).await;
    attacker.publish_refused("approving a call", format!("$KV.hermes_approvals.{goal_id}.save.0.x")).await;
    attacker.publish_refused("deleting the goals", "$JS.API.STREAM.DELETE.KV_hermes_goals".into()).await;
    attacker.publish_refused("purging the events", "$JS.API.STREAM.PURGE.HERMES_EVENTS".into()).await;
    attacker.publish_refused("forging a webhook delivery", format!("hermes.webhook.wh-x.{goal_id}")).await;
    attacker
        .publish_refused(
            "reading a webhook's secret",
            "$JS.API.DIRECT.GET.KV_hermes_webhooks.$KV.hermes_webhooks.wh.x".into(),
        )
        .await;
    attacker
        .publish_refused(
            "reading a goal",
            format!("$JS.API.DIRECT.GET.KV_hermes_goals.$KV.hermes_goals.{goal_id}"),
        )
        .await;
    attacker
        .publish_refused("reading a goal from the leader", "$JS.API.STREAM.MSG.GET.KV_hermes_goals".into())
        .await;
    let _spy = attacker.client.subscribe("_INBOX_dispatcher.>").await.unwrap();
    attacker.client.flush().await.unwrap();
    attacker.refused("reading the dispatcher's replies", "_INBOX_dispatcher.>").await;
    let after = client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await.unwrap().into_inner();
    assert_eq!((after.status, after.output_json), (goal.status, goal.output_json.clone()));

    // A forged result from another agent identity, for a running attempt: ignored; the real
    // result wins.
    let plan =
        TaskPlan { nodes: vec![crate_node("nap", "time.sleep", json!({"ms": 1500}))], ..Default::default() };
    let spec = GoalSpec { plan: Some(plan), ..Default::default() };
    let napping =
        client.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await.unwrap().into_inner().goal_id;
    let forged = TaskResult {
        goal_id: napping.clone(),
        node_id: "nap".into(),
        task_id: format!("{napping}.nap.1"),
        attempt: 1,
        status: TaskStatus::Succeeded as i32,
        output_json: json!({"forged": true}).to_string(),
        agent_id: "forger".into(),
        result_token: "0123456789abcdef0123456789abcdef".into(),
        ..Default::default()
    };
    let js = async_nats::jetstream::new(attacker.client.clone());
    js.publish(format!("hermes.result.{napping}"), forged.encode_to_vec().into())
        .await
        .expect("agents may publish results")
        .await
        .expect("the forged result is stored");
    follow(&client, &napping).await;
    let napped = client.get_goal(GetGoalRequest { goal_id: napping.clone() }).await.unwrap().into_inner();
    assert_eq!(napped.status, GoalStatus::Completed as i32);
    assert_eq!(serde_json::from_str::<Value>(&napped.output_json).unwrap(), json!({"slept_ms": 1500}));
    assert_eq!(napped.nodes[0].agent_id, "agent-1");
    wait_until(Duration::from_secs(5), "the dispatcher to log the forged result", || {
        std::fs::read_to_string(&dispatcher_log).unwrap_or_default().contains("forged_result")
    })
    .await;

    // Nothing a service did was refused: every violation in the server's log is the attacker's.
    let log = nats.log();
    let refused: Vec<&str> =
        log.lines().filter(|l| l.contains("Violation") && !l.contains(":attacker\"")).collect();
    assert!(refused.is_empty(), "the server refused a service:\n{}", refused.join("\n"));
    assert!(log.contains(":attacker\""), "the attacker's refusals are in the server log");
}

fn crate_node(id: &str, task_type: &str, inputs: Value) -> hermes_proto::TaskNode {
    hermes_proto::TaskNode {
        id: id.into(),
        task_type: task_type.into(),
        inputs_json: inputs.to_string(),
        ..Default::default()
    }
}
