//! Per-agent NATS identities, as a deployment runs them: the services as their own users of
//! `deploy/nats/accounts.conf`, `deploy/nats/identities.conf` sending every other connection to
//! the registry (the NATS auth callout), and two agents, `a1` and `b2`, each connecting as
//! `agent_<id>` with its own agent token. A goal runs on both; then agent a1, compromised, tries
//! every part of another agent's work, and each try is refused by the server; and connections
//! that are not an agent's own are refused by the registry.

use std::time::{Duration, Instant};

use hermes_proto::{GetGoalRequest, GoalSpec, GoalStatus, SubmitGoalRequest, TaskNode, TaskPlan};
use hermes_test_util::NatsServer;

use crate::bus::{Accounts, Attacker, Client, TOKEN, connect, free_addr, service, wait_online};

const AGENTS: [&str; 2] = ["a1", "b2"];

fn sha(secret: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(secret.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
}

/// `hermes <args>` as an operator runs it: its stdout and stderr.
fn hermes(args: &[&str]) -> (String, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_hermes")).args(args).output().unwrap();
    assert!(out.status.success(), "hermes {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap())
}

/// A nats-server running `accounts` and deploy/nats/identities.conf with a new issuer key pair
/// (`hermes identities-issuer`), and the pair's seed for the registry.
fn identities_server(accounts: &Accounts) -> (NatsServer, String) {
    let (printed, _) = hermes(&["identities-issuer"]);
    let value = |name: &str| {
        printed.lines().find_map(|l| l.strip_prefix(&format!("{name}="))).map(str::to_owned).unwrap()
    };
    let (seed, issuer) = (value("HERMES_IDENTITIES_ISSUER_SEED"), value("HERMES_IDENTITIES_ISSUER"));
    assert_eq!(nkeys::KeyPair::from_seed(&seed).unwrap().public_key(), issuer);
    let identities = std::fs::read_to_string(crate::repo_root().join("deploy/nats/identities.conf")).unwrap();
    let config = format!("{}\n{}", accounts.config, identities.replace("$HERMES_IDENTITIES_ISSUER", &issuer));
    (NatsServer::start_with_config(&config), seed)
}

/// `hermes-dispatcher` as its own user, serving gRPC on `grpc` with the tokens of `tokens_file`.
fn dispatcher(
    dir: &std::path::Path,
    accounts: &Accounts,
    nats: &NatsServer,
    grpc: &str,
    tokens_file: &str,
) -> (hermes_test_util::process::HermesProcess, std::path::PathBuf) {
    service(
        dir,
        "hermes-dispatcher",
        &[
            "--nats-url",
            &accounts.url(nats, "dispatcher"),
            "--grpc-listen",
            grpc,
            "--dispatcher-http-listen",
            "off",
            "--dispatcher-api-tokens-file",
            tokens_file,
            "--llm-provider",
            "none",
        ],
    )
}

/// `hermes-registry` as its own user, issuing identities with `seed` and checking the tokens of
/// `tokens_file`, serving gRPC on `grpc`; `more` adds settings (the Kubernetes issuer's).
fn identities_registry(
    dir: &std::path::Path,
    accounts: &Accounts,
    nats: &NatsServer,
    grpc: &str,
    tokens_file: &str,
    seed: &str,
    more: &[&str],
) -> (hermes_test_util::process::HermesProcess, std::path::PathBuf) {
    let url = accounts.url(nats, "registry");
    let mut args = vec![
        "--nats-url",
        &url,
        "--grpc-listen",
        grpc,
        "--api-tokens-file",
        tokens_file,
        "--identities-issuer-seed",
        seed,
    ];
    args.extend_from_slice(more);
    service(dir, "hermes-registry", &args)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn each_agent_gets_only_its_own_subjects_and_nothing_of_another_agents() {
    let accounts = Accounts::load();
    // The keys and tokens as an operator makes them.
    let (nats, seed) = identities_server(&accounts);
    let dir = tempfile::tempdir().unwrap();
    let mut tokens =
        hermes_test_util::api_token("ops", TOKEN, "team-a", &["submitter", "viewer", "operator"]);
    let mut agent_tokens: Vec<(&str, String)> = Vec::new();
    for id in AGENTS {
        let (token, told) = hermes(&["agent-token", id]);
        let token = token.trim().to_owned();
        let entry = told.split("\n\n").nth(1).unwrap();
        assert_eq!(entry, format!("[[agent]]\nid = \"{id}\"\nsha256 = \"{}\"", sha(&token)));
        tokens += &format!("{entry}\n\n");
        agent_tokens.push((id, token));
    }
    let tokens_file = dir.path().join("tokens.toml");
    std::fs::write(&tokens_file, tokens).unwrap();
    let tokens_file = tokens_file.to_str().unwrap();
    let agent_url = |id: &str, token: &str| format!("nats://agent_{id}:{token}@127.0.0.1:{}", nats.port());

    let grpc = free_addr();
    let (_dispatcher, dispatcher_log) = dispatcher(dir.path(), &accounts, &nats, &grpc, tokens_file);
    // Agents with identities reach the ledger and artifacts only through the memory service.
    let memory_grpc = free_addr();
    let (mut memory, memory_log) = service(
        dir.path(),
        "hermes-memory",
        &[
            "--nats-url",
            &accounts.url(&nats, "memory"),
            "--grpc-listen",
            &memory_grpc,
            "--api-tokens-file",
            tokens_file,
        ],
    );
    let mut client = connect(&grpc).await;
    let workspace = tempfile::tempdir().unwrap();
    let mut agents = Vec::new();
    for (id, token) in &agent_tokens {
        agents.push(service(
            dir.path(),
            "hermes-executor",
            &[
                "--nats-url",
                &agent_url(id, token),
                "--agent-id",
                id,
                "--agent-workspace",
                workspace.path().to_str().unwrap(),
                "--agent-heartbeat-ms",
                "500",
                "--cache",
                "math.evaluate",
                "--llm-provider",
                "none",
            ],
        ));
    }
    // The agents start first: refused until the registry answers the server, they try again.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (_, log) in &agents {
        while !std::fs::read_to_string(log).unwrap_or_default().contains("trying again") {
            assert!(Instant::now() < deadline, "an agent without the registry was not refused and retrying");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let registry_grpc = free_addr();
    let (_registry, registry_log) =
        identities_registry(dir.path(), &accounts, &nats, &registry_grpc, tokens_file, &seed, &[]);
    let logs = || {
        let mut all = format!(
            "registry log:\n{}\ndispatcher log:\n{}\n",
            std::fs::read_to_string(&registry_log).unwrap_or_default(),
            std::fs::read_to_string(&dispatcher_log).unwrap_or_default()
        );
        all += &format!("memory log:\n{}\n", std::fs::read_to_string(&memory_log).unwrap_or_default());
        for (_, log) in &agents {
            all += &format!("agent log:\n{}\n", std::fs::read_to_string(log).unwrap_or_default());
        }
        all + &format!("server log:\n{}", nats.log())
    };

    // Both agents register through their own identities.
    wait_online(&registry_grpc, &AGENTS, &logs).await;

    // Agent a1, compromised, with its own credentials; first, it waits for memory to answer.
    let mut a1 = Attacker::connect(&agent_url("a1", &agent_tokens[0].1)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let asked = hermes_core::broker::request::<_, hermes_proto::LedgerReply>(
            &a1.client,
            &hermes_core::Topology::default(),
            "ledger",
            &hermes_proto::LedgerRequest::default(),
            Duration::from_secs(2),
        )
        .await;
        match asked {
            Err(e) if e.code() == hermes_core::ErrorCode::Denied => break,
            other => assert!(Instant::now() < deadline, "memory does not answer: {other:?}\n{}", logs()),
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A goal wide enough for both agents completes: each pulls, acknowledges and answers its work.
    let nodes = (0..8)
        .map(|i| {
            node(
                &format!("n{i}"),
                "math.evaluate",
                serde_json::json!({"expression": format!("{i} * 2")}),
                &[],
            )
        })
        .collect();
    let spec = GoalSpec { plan: Some(TaskPlan { nodes, ..Default::default() }), ..Default::default() };
    let goal = run_goal(&mut client, spec, &logs).await;
    assert_eq!(goal.status, GoalStatus::Completed as i32, "{:?}\n{}", goal.error, logs());

    // A large output (an artifact of two parts) feeds a side-effecting write (a ledger entry):
    // both go through the memory service with the task's token, and the content arrives whole.
    let size = 700_000;
    let spec = written_large_output('x', size);
    // With no memory replica running when it starts (a restart): the agents ask again.
    memory.kill9();
    let submitted = tokio::spawn({
        let mut client = client.clone();
        async move { run_goal(&mut client, spec, &String::new).await }
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    memory.restart();
    let big_goal = submitted.await.unwrap();
    assert_eq!(big_goal.status, GoalStatus::Completed as i32, "{:?}\n{}", big_goal.error, logs());
    let output = |id: &str| -> serde_json::Value {
        let node = big_goal.nodes.iter().find(|n| n.node_id == id).unwrap();
        serde_json::from_str(&node.output_json).unwrap()
    };
    let artifact = output("big")["$artifact"].as_str().expect("the large output is an artifact").to_owned();
    assert_eq!(output("save")["bytes_written"], size, "{}", logs());
    assert_eq!(std::fs::read(workspace.path().join("big.txt")).unwrap(), vec![b'x'; size]);
    let server_log = nats.log();
    assert!(!server_log.contains("Permissions Violation"), "an agent's own work was refused:\n{}", logs());

    // Agent a1 tries the other agent's work.
    let tasks = "HERMES_TASKS";
    for (what, subject) in [
        ("pulling b2's directed tasks", format!("$JS.API.CONSUMER.MSG.NEXT.{tasks}.agent_b2")),
        ("reading b2's consumer", format!("$JS.API.CONSUMER.INFO.{tasks}.agent_b2")),
        (
            "pulling b2's work a dispatcher took over",
            format!("$JS.API.CONSUMER.MSG.NEXT.{tasks}.reassign_b2"),
        ),
        (
            "a consumer of its own on b2's directed subjects",
            format!("$JS.API.CONSUMER.CREATE.{tasks}.steal.hermes.task.direct.b2.>"),
        ),
        ("acknowledging b2's deliveries", format!("$JS.ACK.{tasks}.agent_b2.1.1.1.1.1")),
        (
            "repointing b2's consumer at a pool",
            format!("$JS.API.CONSUMER.CREATE.{tasks}.agent_b2.hermes.task.pool.math.evaluate"),
        ),
        ("a heartbeat as b2", "hermes.registry.heartbeat.b2".to_owned()),
        ("b2's entry of the agents bucket", "$KV.hermes_agents.b2".to_owned()),
    ] {
        a1.publish_refused(what, subject).await;
    }
    // The ledger and the artifacts are not its to read or write on the bus ...
    for (what, subject) in [
        ("the ledger's keys", "$JS.API.STREAM.INFO.KV_hermes_ledger".to_owned()),
        (
            "a ledger entry",
            format!("$JS.API.DIRECT.GET.KV_hermes_ledger.$KV.hermes_ledger.{}.save", big_goal.goal_id),
        ),
        ("writing a ledger entry", format!("$KV.hermes_ledger.{}.save.0.forged", big_goal.goal_id)),
        ("the artifacts' names", "$JS.API.STREAM.INFO.OBJ_hermes_artifacts".to_owned()),
        (
            "an artifact's description",
            "$JS.API.DIRECT.GET.OBJ_hermes_artifacts.$O.hermes_artifacts.M.forged".to_owned(),
        ),
        ("reading artifacts' chunks", "$JS.API.CONSUMER.CREATE.OBJ_hermes_artifacts".to_owned()),
        ("writing an artifact's chunk", "$O.hermes_artifacts.C.forged".to_owned()),
        ("the tool cache", "$JS.API.DIRECT.GET.KV_hermes_tool_cache.$KV.hermes_tool_cache.t.x.y".to_owned()),
        ("planting a cached result", "$KV.hermes_tool_cache.t0.math.evaluate.forged".to_owned()),
    ] {
        a1.publish_refused(what, subject).await;
    }
    // ... and the memory service does for it only what a task's token allows: that goal's.
    let dispatcher_bus =
        hermes_core::Bus::connect(hermes_core::BusConfig::new(accounts.url(&nats, "dispatcher")))
            .await
            .unwrap();
    let key = hermes_core::task_token::TaskKey::open(&dispatcher_bus).await.unwrap();
    let other_goal_token = key.sign("another-goal", "team-a", hermes_core::now_unix_ms() + 60_000);
    let broker = |method: &'static str, body: Vec<u8>| {
        let client = a1.client.clone();
        async move {
            let subject = hermes_core::Topology::default().memory_rpc(method);
            let reply = client.request(subject, body.into()).await.unwrap();
            let headers = reply.headers.unwrap_or_default();
            let code = headers.get(hermes_core::broker::ERROR_CODE_HEADER).map(|c| c.as_str().to_owned());
            (code, headers.get(hermes_core::broker::ERROR_MESSAGE_HEADER).map(|m| m.as_str().to_owned()))
        }
    };
    use prost::Message as _;
    for (what, token, key) in [
        ("another goal's ledger entry", other_goal_token.clone(), format!("{}.save.0.x", big_goal.goal_id)),
        (
            "another goal's crash marker",
            other_goal_token.clone(),
            format!("inflight.{}.save", big_goal.goal_id),
        ),
        ("a forged token", format!("{other_goal_token}x"), "another-goal.n.0.x".to_owned()),
    ] {
        let request = hermes_proto::LedgerRequest {
            task_token: token,
            op: hermes_proto::LedgerOp::Get as i32,
            key,
            ..Default::default()
        };
        let (code, message) = broker("ledger", request.encode_to_vec()).await;
        assert_eq!(code.as_deref(), Some("DENIED"), "{what}: {message:?}");
    }
    // The first goal's results were cached through memory, as its tenant's.
    let cached = hermes_core::tool_cache::stats(&dispatcher_bus, Some("team-a"), None).await.unwrap();
    assert!(cached.get("math.evaluate").is_some_and(|s| s.entries >= 8), "{cached:?}\n{}", logs());
    let team_a = key.sign("another-goal", "team-a", hermes_core::now_unix_ms() + 60_000);
    for (tenant, expected) in [("team-b", Some("DENIED")), ("team-a", None)] {
        let request = hermes_proto::LedgerRequest {
            task_token: team_a.clone(),
            op: hermes_proto::LedgerOp::Get as i32,
            key: format!("{}.math.evaluate.x", hermes_core::tool_cache::tenant_token(tenant)),
            ..Default::default()
        };
        let (code, message) = broker("tool_cache", request.encode_to_vec()).await;
        assert_eq!(code.as_deref(), expected, "{tenant}'s cache entry: {message:?}");
    }
    for method in ["artifact_info", "artifact_read"] {
        let request = hermes_proto::TaskArtifactRequest {
            task_token: other_goal_token.clone(),
            r#ref: artifact.clone(),
            cursor: 0,
        };
        let (code, message) = broker(method, request.encode_to_vec()).await;
        assert_eq!(code.as_deref(), Some("NOT_FOUND"), "{method} of another goal's artifact: {message:?}");
    }
    let own_token = key.sign(&big_goal.goal_id, "team-a", hermes_core::now_unix_ms() + 60_000);
    let request = hermes_proto::TaskArtifactRequest {
        task_token: own_token.clone(),
        r#ref: artifact.clone(),
        cursor: 0,
    };
    let (code, message) = broker("artifact_info", request.encode_to_vec()).await;
    assert_eq!(code, None, "its own goal's artifact: {message:?}");
    // What it stores is its task's goal's and tenant's, whatever it claims, with the TTL it asks.
    let commit = hermes_proto::TaskArtifactCommit {
        task_token: own_token,
        data: b"a note".to_vec(),
        content_type: "text/plain".into(),
        ttl_secs: 60,
        ..Default::default()
    };
    let stored = a1
        .client
        .request(
            hermes_core::Topology::default().memory_rpc("artifact_commit"),
            commit.encode_to_vec().into(),
        )
        .await
        .unwrap();
    let stored = hermes_proto::MemoryRef::decode(stored.payload).unwrap();
    assert_eq!((stored.goal_id.as_str(), stored.tenant.as_str()), (big_goal.goal_id.as_str(), "team-a"));
    let ttl = stored.expires_unix_ms.saturating_sub(stored.created_unix_ms);
    assert_eq!(ttl, 60_000, "{stored:?}");

    for (what, subject) in [
        ("b2's replies and task deliveries", "_INBOX_agent_b2.>"),
        ("the shared agents' inbox", "_INBOX_agent.>"),
    ] {
        let _subscription = a1.client.subscribe(subject).await.unwrap();
        a1.client.flush().await.unwrap();
        let refusal = a1.refused(what, subject).await;
        assert!(refusal.to_lowercase().contains("permissions violation"), "{refusal}");
    }

    // Connections that are not an agent's own are refused.
    let port = nats.port();
    for (what, user, password) in [
        ("a1's token used as b2", "agent_b2", agent_tokens[0].1.clone()),
        ("an unknown token", "agent_a1", "not-a-token".to_owned()),
        ("the static agent user", "agent", "whatever".to_owned()),
        ("a user that is no agent's", "someone", agent_tokens[0].1.clone()),
    ] {
        let refused = async_nats::ConnectOptions::with_user_and_password(user.into(), password)
            .connect(format!("nats://127.0.0.1:{port}"))
            .await;
        assert!(refused.is_err(), "{what} was let in");
    }
    let registry_log = std::fs::read_to_string(&registry_log).unwrap_or_default();
    assert!(registry_log.contains("is not agent `b2`'s"), "{registry_log}");
    assert!(registry_log.contains("the agent token is not known"), "{registry_log}");
}

/// Submits `spec` and waits (up to a minute) for the goal to end.
async fn run_goal(client: &mut Client, spec: GoalSpec, logs: &impl Fn() -> String) -> hermes_proto::Goal {
    let goal_id =
        client.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await.unwrap().into_inner().goal_id;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let goal = client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await.unwrap().into_inner();
        if goal.status != GoalStatus::Running as i32 {
            return goal;
        }
        assert!(Instant::now() < deadline, "the goal did not end within 60 s\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `hermes up` with its own server runs the users a deployment does: each in-process service
/// connects as its own user of accounts.conf, and each agent as its own identity, issued by the
/// in-process registry; the operator's user is left for what joins the stack (`hermes nats-url`).
/// A goal whose large output feeds a side-effecting write runs through them (the agents reach the
/// ledger and artifacts through the in-process memory service).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hermes_up_runs_each_service_as_its_own_user_and_each_agent_as_its_identity() {
    use hermes_test_util::process::HermesUp;
    let data = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    // An agent started apart joins as itself with the token of its `[[agent]]` entry.
    let (extra_token, told) = hermes(&["agent-token", "extra-1"]);
    let extra_token = extra_token.trim().to_owned();
    let entry = told.split("\n\n").nth(1).unwrap().to_owned();
    let tokens = data.path().join("tokens.toml");
    let api = hermes_test_util::api_token("ops", TOKEN, "team-a", &["submitter", "viewer"]);
    std::fs::write(&tokens, format!("{api}{entry}\n")).unwrap();
    let up = HermesUp::builder(env!("CARGO_BIN_EXE_hermes"), data.path())
        .env("HERMES_LLM_PROVIDER", "none")
        .args(["--agents", "2", "--agents-confirm-tools", "none", "--api-tokens-file"])
        .args([&tokens])
        .args(["--workspace"])
        .args([workspace.path()])
        .start();
    let lock = std::fs::read_to_string(data.path().join("nats/hermes-up.lock")).unwrap();
    let monitor = lock.lines().find_map(|l| l.strip_prefix("monitor ")).expect("the monitor port").trim();
    let connections = || async {
        let url = format!("http://127.0.0.1:{monitor}/connz?auth=true&limit=1024");
        let connz: serde_json::Value = reqwest::get(url).await.unwrap().json().await.unwrap();
        connz["connections"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                let field = |k: &str| c[k].as_str().unwrap_or_default().to_owned();
                (field("name"), field("authorized_user"))
            })
            .collect::<Vec<(String, String)>>()
    };
    let port = lock.lines().find_map(|l| l.strip_prefix("port ")).expect("the client port").trim();
    let extra_url = format!("nats://agent_extra-1:{extra_token}@127.0.0.1:{port}");
    // It alone serves the test tool that aborts its process.
    let extra_log = data.path().join("extra-1.log");
    let _extra =
        hermes_test_util::process::HermesAgent::builder(env!("CARGO_BIN_EXE_hermes"), &extra_url, "extra-1")
            .args(["--workspace"])
            .arg(workspace.path())
            .args(["--agent-tools", "test.abort", "--agent-ack-wait-secs", "5"])
            .env("HERMES_TEST_TOOLS", "1")
            .stderr_file(&extra_log)
            .start();
    let users: std::collections::BTreeSet<String> = connections().await.into_iter().map(|(_, u)| u).collect();
    for user in ["dispatcher", "registry", "memory", "agent_local-1", "agent_local-2", "agent_extra-1"] {
        assert!(users.contains(user), "no connection as `{user}`: {:?}", connections().await);
    }
    assert!(!users.contains("hermes"), "a service connects as the operator: {:?}", connections().await);

    let size = 300_000;
    let spec = written_large_output('y', size);
    let mut client = connect(&up.grpc).await;
    let goal = run_goal(&mut client, spec, &|| String::new()).await;
    assert_eq!(goal.status, GoalStatus::Completed as i32, "{:?}", goal.error);
    assert_eq!(std::fs::read(workspace.path().join("big.txt")).unwrap(), vec![b'y'; size]);

    // A task that crashes the identified agent is counted through memory, with the token its
    // worker told the supervisor, and quarantined after its second crash.
    let extra_logs = || std::fs::read_to_string(&extra_log).unwrap_or_default();
    let spec = GoalSpec {
        plan: Some(TaskPlan {
            nodes: vec![node("s", "test.abort", serde_json::json!({}), &[])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let goal = run_goal(&mut client, spec, &extra_logs).await;
    let error =
        goal.nodes.iter().find(|n| n.node_id == "s").and_then(|n| n.error.clone()).expect("the node's error");
    assert_eq!(error.code, "POISON_MESSAGE", "{error:?}\n{}", extra_logs());
    assert!(error.message.contains("crashed its consumer"), "{}", error.message);
    let logged = extra_logs();
    assert!(logged.matches("a task was in flight when its process crashed").count() >= 2, "{logged}");
    assert!(!logged.contains("cannot count") && !logged.contains("cannot read the crash marker"), "{logged}");

    // The operator's URL joins the stack as before.
    let (url, _) = hermes(&["nats-url", "--data-dir", data.path().to_str().unwrap()]);
    assert!(url.trim().starts_with("nats://hermes:"), "{url}");
    let addr: async_nats::ServerAddr = url.trim().parse().unwrap();
    let operator = async_nats::ConnectOptions::with_user_and_password(
        addr.username().unwrap().into(),
        addr.password().unwrap().into(),
    )
    .connect(url.trim())
    .await
    .unwrap();
    operator.flush().await.unwrap();
}

/// A goal whose node `big` outputs `size` times `letter` (over the inline limit: an artifact) and
/// whose node `save` writes it to `big.txt` with `fs.write` (a side effect: a ledger entry).
fn written_large_output(letter: char, size: usize) -> GoalSpec {
    let nodes = vec![
        node(
            "big",
            "text.template",
            serde_json::json!({"template": format!("{{{{ \"{letter}\" * {size} }}}}")}),
            &[],
        ),
        node(
            "save",
            "fs.write",
            serde_json::json!({"path": "big.txt", "content": {"$ref": "big.text"}}),
            &["big"],
        ),
    ];
    GoalSpec { plan: Some(TaskPlan { nodes, ..Default::default() }), ..Default::default() }
}

/// A plan node of `task_type` with `inputs`, after `deps`.
fn node(id: &str, task_type: &str, inputs: serde_json::Value, deps: &[&str]) -> TaskNode {
    TaskNode {
        id: id.into(),
        task_type: task_type.into(),
        inputs_json: inputs.to_string(),
        depends_on: deps.iter().map(|d| (*d).to_owned()).collect(),
        ..Default::default()
    }
}

/// On Kubernetes each pod is its own agent without a token issued to it: it connects as
/// `agent_<pod name>` with its projected service-account token as the password (read from its
/// file at every connect), and the registry checks the token against the cluster's keys (here a
/// local provider standing for the API server's), its audience, the pod it is bound to and its
/// service account. Tokens of another pod, of another service account, for another audience or
/// of another cluster are refused; a token file that goes bad is refused at the next reconnect,
/// and a good one lets the agent back.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pod_joins_as_its_own_agent_with_its_service_account_token() {
    use hermes_test_util::oidc::{KeyKind, TestIdp};
    let accounts = Accounts::load();
    let cluster = TestIdp::start(KeyKind::Ed25519).await;
    let stranger = TestIdp::start(KeyKind::Ed25519).await;
    let (mut nats, seed) = identities_server(&accounts);
    let dir = tempfile::tempdir().unwrap();
    let tokens_file = dir.path().join("tokens.toml");
    std::fs::write(
        &tokens_file,
        hermes_test_util::api_token("ops", TOKEN, "team-a", &["submitter", "viewer"]),
    )
    .unwrap();
    let tokens_file = tokens_file.to_str().unwrap();
    let grpc = free_addr();
    let (_dispatcher, _) = dispatcher(dir.path(), &accounts, &nats, &grpc, tokens_file);
    let registry_grpc = free_addr();
    let jwks = format!("{}/jwks", cluster.issuer);
    let kubernetes = [
        "--identities-kubernetes-issuer",
        &cluster.issuer,
        "--identities-kubernetes-jwks-url",
        &jwks,
        "--identities-kubernetes-service-accounts",
        "agents/hermes-executor",
    ];
    let (_registry, registry_log) =
        identities_registry(dir.path(), &accounts, &nats, &registry_grpc, tokens_file, &seed, &kubernetes);
    // A projected token as the kubelet makes it: bound to its pod, for the audience asked.
    let pod_token = |idp: &TestIdp, pod: &str, account: &str, audience: &str| {
        idp.token(
            "k1",
            audience,
            serde_json::json!({
                "sub": format!("system:serviceaccount:agents:{account}"),
                "kubernetes.io": {
                    "namespace": "agents",
                    "pod": {"name": pod, "uid": "6f0b3a52"},
                    "serviceaccount": {"name": account, "uid": "0c1d2e3f"},
                },
            }),
        )
    };
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, pod_token(&cluster, "pod-a", "hermes-executor", "hermes-nats")).unwrap();
    let port = nats.port();
    let workspace = tempfile::tempdir().unwrap();
    let (_agent, agent_log) = service(
        dir.path(),
        "hermes-executor",
        &[
            "--nats-url",
            &format!("nats://agent_pod-a@127.0.0.1:{port}"),
            "--nats-password-file",
            token_file.to_str().unwrap(),
            "--agent-id",
            "pod-a",
            "--agent-workspace",
            workspace.path().to_str().unwrap(),
            "--agent-heartbeat-ms",
            "500",
            "--llm-provider",
            "none",
        ],
    );
    let logs = || {
        format!(
            "registry log:\n{}\nagent log:\n{}",
            std::fs::read_to_string(&registry_log).unwrap_or_default(),
            std::fs::read_to_string(&agent_log).unwrap_or_default(),
        )
    };
    wait_online(&registry_grpc, &["pod-a"], &logs).await;
    let mut client = connect(&grpc).await;
    let spec = GoalSpec {
        plan: Some(TaskPlan {
            nodes: vec![node("n", "math.evaluate", serde_json::json!({"expression": "6 * 7"}), &[])],
            ..Default::default()
        }),
        ..Default::default()
    };
    let goal = run_goal(&mut client, spec.clone(), &logs).await;
    assert_eq!(goal.status, GoalStatus::Completed as i32, "{:?}\n{}", goal.error, logs());
    assert_eq!(goal.nodes[0].agent_id, "pod-a");
    let users = |nats: &NatsServer| -> Vec<String> {
        let connz = nats.monitor("/connz?auth=true&limit=1024").unwrap_or_default();
        connz["connections"]
            .as_array()
            .map(|c| c.iter().filter_map(|c| c["authorized_user"].as_str().map(str::to_owned)).collect())
            .unwrap_or_default()
    };
    assert!(users(&nats).contains(&"agent_pod-a".to_owned()), "{:?}", users(&nats));

    for (what, user, token, reason) in [
        (
            "pod-a's token used as pod-b",
            "agent_pod-b",
            pod_token(&cluster, "pod-a", "hermes-executor", "hermes-nats"),
            "is pod `pod-a`'s, not `pod-b`'s",
        ),
        (
            "a pod of another service account",
            "agent_pod-c",
            pod_token(&cluster, "pod-c", "default", "hermes-nats"),
            "is not one whose pods are agents",
        ),
        (
            "a token made for another audience",
            "agent_pod-c",
            pod_token(&cluster, "pod-c", "hermes-executor", "vault"),
            "not for this audience",
        ),
        (
            "another cluster's token",
            "agent_pod-c",
            pod_token(&stranger, "pod-c", "hermes-executor", "hermes-nats"),
            "is not trusted",
        ),
    ] {
        let refused = async_nats::ConnectOptions::with_user_and_password(user.into(), token)
            .connect(format!("nats://127.0.0.1:{port}"))
            .await;
        assert!(refused.is_err(), "{what} was let in");
        let registry = std::fs::read_to_string(&registry_log).unwrap_or_default();
        assert!(registry.contains(reason), "{what}: no `{reason}` in\n{registry}");
    }

    // The file is read again at each connect: gone bad, the reconnect after a server restart is
    // refused; good again, the agent is back and serves.
    std::fs::write(&token_file, "not-a-token").unwrap();
    let refusals =
        || std::fs::read_to_string(&registry_log).unwrap_or_default().matches("agent_pod-a").count();
    let before = refusals();
    nats.restart();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !std::fs::read_to_string(&registry_log).unwrap_or_default().contains("the agent token is not known")
    {
        assert!(Instant::now() < deadline, "the bad token was not refused at a reconnect\n{}", logs());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(!users(&nats).contains(&"agent_pod-a".to_owned()), "{:?}", users(&nats));
    std::fs::write(&token_file, pod_token(&cluster, "pod-a", "hermes-executor", "hermes-nats")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !users(&nats).contains(&"agent_pod-a".to_owned()) {
        assert!(Instant::now() < deadline, "the agent did not come back with a good token\n{}", logs());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(refusals() > before);
    let goal = run_goal(&mut client, spec, &logs).await;
    assert_eq!(goal.status, GoalStatus::Completed as i32, "{:?}\n{}", goal.error, logs());
}
