//! The chaos suite: real processes (`hermes up` running the dispatcher and registry, `hermes
//! agent` processes, and nats-server with file storage) are killed, stopped and restarted while
//! goals run. Every goal appends one line with its own tag to a shared file through `fs.write`,
//! so the file counts side effects: a tag twice is a duplicate, a completed goal without its line
//! or a goal that never completes is a loss. The suite prints a table and fails on any duplicate
//! or loss.
//!
//! `make chaos` runs the full trial counts (`HERMES_CHAOS_SCALE=full`); `make test` runs it
//! reduced. Scenarios: 1 `kill -9` an agent mid-task; 2 `kill -9` the dispatcher with goals in
//! flight, then restart it; 4 `kill -9` nats-server with goals in flight, then restart it;
//! 5 SIGSTOP an agent past AckWait and its heartbeat TTL, then SIGCONT it; 6 a poison task among
//! healthy goals; 7 two dispatchers and three agents with random kills for a bounded time; and 3
//! `kill -9` a planner (`hermes planner`, with the scripted model answering slowly) mid-plan; 13
//! goals whose webhook receiver is down while the dispatcher is killed twice, every webhook
//! delivered once it is up, and each goal's three webhooks in order through a kill.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::{GetGoalRequest, GoalSpec, GoalStatus, SubmitGoalRequest, TaskNode, TaskPlan};
use hermes_test_util::process::{HermesAgent, HermesProcess, HermesUp};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use tonic::transport::Channel;

use hermes_tests::hermes_bin;

const EFFECTS: &str = "effects.log";

/// One dispatcher process: a `hermes up` (a dispatcher and a registry replica), or a
/// `hermes-dispatcher` of the production shape.
struct Up {
    proc: HermesProcess,
    /// Its gRPC address.
    grpc: String,
    /// Its data dir, kept across restarts.
    _data: Option<tempfile::TempDir>,
}

/// The NATS under a [`Cluster`]: one server, or a three-node JetStream cluster with R3 streams.
enum Nats {
    One(hermes_test_util::NatsServer),
    Three(hermes_test_util::NatsCluster),
}

impl Nats {
    /// What the services connect to: the server's URL, or every cluster server's.
    fn url(&self) -> String {
        match self {
            Nats::One(server) => server.url(),
            Nats::Three(cluster) => cluster.urls(),
        }
    }

    /// Stream replicas the services create (`HERMES_NATS_REPLICAS`).
    fn replicas(&self) -> &'static str {
        match self {
            Nats::One(_) => "1",
            Nats::Three(_) => "3",
        }
    }

    fn one(&mut self) -> &mut hermes_test_util::NatsServer {
        match self {
            Nats::One(server) => server,
            Nats::Three(_) => panic!("a single-server scenario on a cluster"),
        }
    }

    fn three(&mut self) -> &mut hermes_test_util::NatsCluster {
        match self {
            Nats::Three(cluster) => cluster,
            Nats::One(_) => panic!("a cluster scenario on one server"),
        }
    }
}

struct Cluster {
    nats: Nats,
    workspace: tempfile::TempDir,
    ups: Vec<Up>,
    /// Which `hermes up` clients talk to.
    current: usize,
    agents: HashMap<String, HermesAgent>,
    /// Where the registry answers: the first `hermes up`, or the production shape's registry.
    registry: String,
    /// The production shape's other services (registry, planner, memory, executors).
    services: Vec<HermesProcess>,
}

impl Cluster {
    async fn start(agent_ids: &[&str]) -> Cluster {
        Self::start_with(1, agent_ids).await
    }

    async fn start_with(dispatchers: usize, agent_ids: &[&str]) -> Cluster {
        Self::start_on(Nats::One(hermes_test_util::NatsServer::start()), dispatchers, agent_ids).await
    }

    /// Hermes on a three-node JetStream cluster: R3 streams, every service given all three URLs.
    async fn start_clustered(dispatchers: usize, agent_ids: &[&str]) -> Cluster {
        let nats = Nats::Three(hermes_test_util::NatsCluster::start(3));
        Self::start_on(nats, dispatchers, agent_ids).await
    }

    async fn start_on(nats: Nats, dispatchers: usize, agent_ids: &[&str]) -> Cluster {
        let workspace = tempfile::tempdir().unwrap();
        let ups: Vec<Up> = (0..dispatchers)
            .map(|_| {
                let data = tempfile::tempdir().unwrap();
                let (proc, grpc) = start_up(&nats.url(), nats.replicas(), data.path()).into_parts();
                Up { proc, grpc, _data: Some(data) }
            })
            .collect();
        let registry = ups[0].grpc.clone();
        let mut cluster = Cluster {
            nats,
            workspace,
            ups,
            current: 0,
            agents: HashMap::new(),
            registry,
            services: Vec::new(),
        };
        for id in agent_ids {
            cluster.start_agent(id);
        }
        cluster.wait_ready(agent_ids.len()).await;
        cluster
    }

    fn start_agent(&mut self, id: &str) {
        self.start_agent_with(id, &[]);
    }

    /// [`Cluster::start_agent`] with more settings in its environment.
    fn start_agent_with(&mut self, id: &str, env: &[(&str, &str)]) {
        let mut agent = HermesAgent::builder(hermes_bin(), &self.nats.url(), id)
            .env("HERMES_NATS_REPLICAS", self.nats.replicas())
            .args(["--tools", "fs.write,time.sleep"])
            .args(["--heartbeat-ms", "200", "--ack-wait-secs", "3", "--max-concurrency", "64", "--workspace"])
            .arg(self.workspace.path());
        for (key, value) in env {
            agent = agent.env(key, value);
        }
        if let Some(dir) = logs_dir() {
            agent = agent.env("RUST_LOG", "info").stderr_file(&dir.join(format!("agent-{id}.log")));
        }
        self.agents.insert(id.to_owned(), agent.start());
    }

    /// `kill -9` the `i`th `hermes up` and start it again on the same port and data dir.
    fn restart_up(&mut self, i: usize) {
        self.ups[i].proc.restart();
    }

    /// A client of the first `hermes up` that answers, starting with the current one.
    async fn client(&self) -> DispatcherClient<Channel> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for k in 0..self.ups.len() {
                let up = &self.ups[(self.current + k) % self.ups.len()];
                if let Ok(client) = DispatcherClient::connect(format!("http://{}", up.grpc)).await {
                    return client;
                }
            }
            assert!(Instant::now() < deadline, "no hermes up came back");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Waits until `n` agents serve both task types.
    async fn wait_ready(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let channel = Channel::from_shared(format!("http://{}", self.registry)).unwrap().connect().await;
            if let Ok(channel) = channel {
                let mut registry = hermes_proto::registry_client::RegistryClient::new(channel);
                if let Ok(reply) = registry.list_agents(hermes_proto::ListAgentsRequest {}).await {
                    let live = reply
                        .into_inner()
                        .agents
                        .iter()
                        .filter(|a| a.heartbeat.as_ref().is_some_and(|h| !h.draining))
                        .count();
                    if live >= n {
                        return;
                    }
                }
            }
            assert!(Instant::now() < deadline, "the agents did not register");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Submits goals that nap, then append their tag; returns (tag, goal id).
    async fn submit(&self, scenario: &str, n: usize, nap_ms: u64) -> Vec<(String, String)> {
        self.submit_with(scenario, n, nap_ms, Vec::new()).await
    }

    /// [`Cluster::submit`], each goal naming `callbacks`.
    async fn submit_with(
        &self,
        scenario: &str,
        n: usize,
        nap_ms: u64,
        callbacks: Vec<hermes_proto::Callback>,
    ) -> Vec<(String, String)> {
        let mut client = self.client().await;
        let mut out = Vec::new();
        for i in 0..n {
            let tag = format!("{scenario}-{i}-{}", hermes_core::now_unix_ms());
            let plan = TaskPlan {
                nodes: vec![
                    TaskNode {
                        id: "nap".into(),
                        task_type: "time.sleep".into(),
                        inputs_json: format!(r#"{{"ms": {nap_ms}}}"#),
                        ..Default::default()
                    },
                    TaskNode {
                        id: "write".into(),
                        task_type: "fs.write".into(),
                        inputs_json: serde_json::json!({"path": EFFECTS, "content": format!("{tag}\n"), "append": true})
                            .to_string(),
                        depends_on: vec!["nap".into()],
                        ..Default::default()
                    },
                ],
                ..Default::default()
            };
            let spec = GoalSpec {
                plan: Some(plan),
                idempotency_key: tag.clone(),
                timeout_ms: 120_000,
                callbacks: callbacks.clone(),
                ..Default::default()
            };
            let goal_id = client
                .submit_goal(SubmitGoalRequest { spec: Some(spec) })
                .await
                .unwrap()
                .into_inner()
                .goal_id;
            out.push((tag, goal_id));
        }
        out
    }

    /// Polls until every goal has ended (or `limit` passes); returns the goals that completed.
    async fn wait_all(&self, goals: &[(String, String)], limit: Duration) -> Vec<String> {
        let deadline = Instant::now() + limit;
        let mut done: HashMap<String, i32> = HashMap::new();
        while done.len() < goals.len() && Instant::now() < deadline {
            let mut client = self.client().await;
            for (_, goal_id) in goals {
                if done.contains_key(goal_id) {
                    continue;
                }
                if let Ok(goal) = client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await {
                    let goal = goal.into_inner();
                    let status = goal.status;
                    let ended = [GoalStatus::Completed, GoalStatus::Failed, GoalStatus::Cancelled]
                        .iter()
                        .any(|s| *s as i32 == status);
                    if ended {
                        if status != GoalStatus::Completed as i32 {
                            // What a lost goal died of, for the report.
                            let nodes: Vec<String> = goal
                                .nodes
                                .iter()
                                .map(|n| format!("{}:{}#{}@{}", n.node_id, n.status, n.attempt, n.agent_id))
                                .collect();
                            println!("goal {goal_id} ended {status} (nodes {nodes:?}): {:?}", goal.error);
                        }
                        done.insert(goal_id.clone(), status);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        for (_, goal_id) in goals.iter().filter(|(_, g)| !done.contains_key(g)) {
            println!("goal {goal_id} did not end within {limit:?}");
        }
        done.into_iter().filter(|(_, s)| *s == GoalStatus::Completed as i32).map(|(g, _)| g).collect()
    }

    fn effects(&self) -> HashMap<String, usize> {
        let text = std::fs::read_to_string(self.workspace.path().join(EFFECTS)).unwrap_or_default();
        let mut counts = HashMap::new();
        for line in text.lines() {
            *counts.entry(line.to_owned()).or_default() += 1;
        }
        counts
    }
}

/// `HERMES_CHAOS_LOGS=DIR` keeps the agents' and `hermes up`s' logs there, for debugging a loss.
fn logs_dir() -> Option<PathBuf> {
    let dir = PathBuf::from(std::env::var_os("HERMES_CHAOS_LOGS")?);
    std::fs::create_dir_all(&dir).expect("HERMES_CHAOS_LOGS");
    Some(dir)
}

fn start_up(nats_url: &str, replicas: &str, data: &Path) -> HermesUp {
    // Text goals are accepted; planners, when a scenario wants them, run as their own processes.
    let mut up = HermesUp::builder(hermes_bin(), data)
        .nats_url(nats_url)
        .env("HERMES_NATS_REPLICAS", replicas)
        // Webhooks to the scenario's local receiver, tried every second for a minute.
        .env("HERMES_DISPATCHER__WEBHOOKS__ALLOW", "127.0.0.1")
        .env("HERMES_DISPATCHER__WEBHOOKS__SCHEDULE", format!("0s{}", ",1s".repeat(60)))
        .args(["--agents", "0", "--no-memory", "--external-planner", "--heartbeat-ttl-secs", "1"]);
    // Its log goes to its data dir (a `hermes up` that exits at start shows it), or to
    // HERMES_CHAOS_LOGS with every event.
    up = match logs_dir() {
        Some(dir) => {
            let name = format!("up-{}.log", data.file_name().unwrap_or_default().to_string_lossy());
            up.env("RUST_LOG", "info").stderr_file(&dir.join(name))
        }
        None => up.stderr_file(&data.join("up.log")),
    };
    up.start()
}

/// One row of the table.
#[derive(Default)]
struct Row {
    scenario: &'static str,
    trials: usize,
    goals: usize,
    completed: usize,
    duplicates: usize,
    lost: usize,
    recovery_ms: Vec<f64>,
}

impl Row {
    fn count(&mut self, cluster: &Cluster, goals: &[(String, String)], completed: &[String]) {
        let effects = cluster.effects();
        self.goals += goals.len();
        self.completed += completed.len();
        for (tag, goal_id) in goals {
            match effects.get(tag).copied().unwrap_or(0) {
                0 => self.lost += 1,
                1 if completed.contains(goal_id) => {}
                1 => self.lost += 1,
                _ => self.duplicates += 1,
            }
        }
    }

    fn print(&self) {
        let mut r = self.recovery_ms.clone();
        r.sort_by(f64::total_cmp);
        let pct =
            |p: f64| if r.is_empty() { f64::NAN } else { r[((r.len() - 1) as f64 * p).round() as usize] };
        println!(
            "{:<44} {:>6} {:>6} {:>9} {:>10} {:>5} {:>10.0} {:>10.0}",
            self.scenario,
            self.trials,
            self.goals,
            self.completed,
            self.duplicates,
            self.lost,
            pct(0.5),
            pct(0.99)
        );
    }
}

fn full() -> bool {
    std::env::var("HERMES_CHAOS_SCALE").is_ok_and(|s| s == "full")
}

async fn kill_an_agent_mid_task(trials: usize) -> Row {
    let mut row = Row { scenario: "1 kill -9 an agent mid-task", ..Default::default() };
    let mut cluster = Cluster::start(&["a1", "a2"]).await;
    for trial in 0..trials {
        let goals = cluster.submit(&format!("s1t{trial}"), 6, 1500).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let victim = if trial % 2 == 0 { "a1" } else { "a2" };
        let killed = Instant::now();
        cluster.agents.get_mut(victim).unwrap().kill9();
        cluster.start_agent(&format!("{victim}-r{trial}"));
        let completed = cluster.wait_all(&goals, Duration::from_secs(90)).await;
        row.recovery_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
        row.trials += 1;
        row.count(&cluster, &goals, &completed);
    }
    row
}

async fn kill_the_dispatcher(trials: usize, goals_per_trial: usize) -> Row {
    let mut row = Row { scenario: "2 kill -9 the dispatcher, restart", ..Default::default() };
    let mut cluster = Cluster::start(&["a1", "a2"]).await;
    for trial in 0..trials {
        let goals = cluster.submit(&format!("s2t{trial}"), goals_per_trial, 300).await;
        let killed = Instant::now();
        cluster.restart_up(0);
        let completed = cluster.wait_all(&goals, Duration::from_secs(90)).await;
        row.recovery_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
        row.trials += 1;
        row.count(&cluster, &goals, &completed);
    }
    row
}

/// Every goal names a webhook whose receiver is down (503) while the goals run: the dispatcher is
/// killed once while the goals run and their deliveries are published, and again while the
/// deliveries wait out their back-off; then the receiver comes up. Each completed goal's
/// `goal.completed` must reach it (a delivery may come twice: at least once), else the goal
/// counts as lost. Recovery: from the first kill to the last webhook delivered.
async fn webhooks_through_kills(trials: usize, goals_per_trial: usize) -> Row {
    let mut row = Row { scenario: "13 webhooks: receiver down, kill -9 dispatcher", ..Default::default() };
    let mut cluster = Cluster::start(&["a1", "a2"]).await;
    let receiver = hermes_test_util::receiver::Receiver::start().await;
    for trial in 0..trials {
        receiver.set_down(true);
        let callback = hermes_proto::Callback { url: receiver.url.clone(), ..Default::default() };
        let goals = cluster.submit_with(&format!("s13t{trial}"), goals_per_trial, 300, vec![callback]).await;
        let killed = Instant::now();
        cluster.restart_up(0);
        let completed = cluster.wait_all(&goals, Duration::from_secs(90)).await;
        cluster.restart_up(0);
        tokio::time::sleep(Duration::from_secs(2)).await;
        receiver.set_down(false);
        let delivered =
            |receiver: &hermes_test_util::receiver::Receiver| -> std::collections::HashSet<String> {
                let got = receiver.got.lock().unwrap().clone();
                got.iter()
                    .filter(|r| r.answered == 200 && r.event_type() == "goal.completed")
                    .filter_map(|r| r.json()["data"]["goal_id"].as_str().map(str::to_owned))
                    .collect()
            };
        let deadline = Instant::now() + Duration::from_secs(60);
        while completed.iter().any(|g| !delivered(&receiver).contains(g)) && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        row.recovery_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
        row.trials += 1;
        row.count(&cluster, &goals, &completed);
        let arrived = delivered(&receiver);
        for goal_id in completed.iter().filter(|g| !arrived.contains(*g)) {
            println!("goal {goal_id}: its goal.completed webhook never arrived");
            row.lost += 1;
        }
    }
    drop(cluster);
    webhooks_in_order_through_a_kill(&mut row, goals_per_trial / 3).await;
    row
}

/// Goals that each make three webhooks (an approval waits, it expires, the goal fails), sent to
/// a receiver that is down until the dispatcher has been killed and restarted with the deliveries
/// in back-off: every webhook arrives, and for each goal none is sent before the one before it
/// was delivered. A goal missing one counts as lost.
async fn webhooks_in_order_through_a_kill(row: &mut Row, goals: usize) {
    const KINDS: [&str; 3] = ["goal.needs_input", "approval.expired", "goal.failed"];
    let mut cluster = Cluster::start(&[]).await;
    cluster.start_agent_with(
        "c1",
        &[("HERMES_AGENT_CONFIRM", "fs.write"), ("HERMES_AGENT_APPROVAL_TIMEOUT_SECS", "1")],
    );
    cluster.wait_ready(1).await;
    let receiver = hermes_test_util::receiver::Receiver::start().await;
    receiver.set_down(true);
    let callback = hermes_proto::Callback { url: receiver.url.clone(), ..Default::default() };
    let submitted = cluster.submit_with("s13order", goals, 100, vec![callback]).await;
    // Each goal fails once its approval expires.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut client = cluster.client().await;
    for (_, goal_id) in &submitted {
        loop {
            let goal =
                client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await.unwrap().into_inner();
            if goal.status == GoalStatus::Failed as i32 {
                break;
            }
            assert!(Instant::now() < deadline, "goal {goal_id} did not fail on its expired approval");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let killed = Instant::now();
    cluster.restart_up(0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    receiver.set_down(false);
    let delivered_all = |goal_id: &str| {
        let got = receiver.got.lock().unwrap().clone();
        KINDS.iter().all(|kind| {
            got.iter().any(|r| {
                r.answered == 200 && r.event_type() == *kind && r.json()["data"]["goal_id"] == goal_id
            })
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while submitted.iter().any(|(_, g)| !delivered_all(g)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    row.recovery_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
    row.trials += 1;
    row.goals += submitted.len();
    let got = receiver.got.lock().unwrap().clone();
    for (_, goal_id) in &submitted {
        if !delivered_all(goal_id) {
            println!("goal {goal_id}: a webhook never arrived");
            row.lost += 1;
            continue;
        }
        let mine: Vec<_> = got.iter().filter(|r| r.json()["data"]["goal_id"] == goal_id.as_str()).collect();
        let first_ok = |kind: &str| mine.iter().position(|r| r.answered == 200 && r.event_type() == kind);
        let first_sent = |kind: &str| mine.iter().position(|r| r.event_type() == kind);
        for pair in KINDS.windows(2) {
            if first_sent(pair[1]) < first_ok(pair[0]) {
                println!("goal {goal_id}: {} was sent before {} was delivered", pair[1], pair[0]);
                row.lost += 1;
            }
        }
        row.completed += 1;
    }
}

async fn kill_nats(trials: usize, goals_per_trial: usize) -> Row {
    let mut row = Row { scenario: "4 kill -9 nats-server, restart (recon. ms)", ..Default::default() };
    let mut cluster = Cluster::start(&["a1", "a2"]).await;
    for trial in 0..trials {
        let goals = cluster.submit(&format!("s4t{trial}"), goals_per_trial, 500).await;
        cluster.nats.one().kill();
        tokio::time::sleep(Duration::from_millis(500)).await;
        cluster.nats.one().restart();
        let restarted = Instant::now();
        // Reconnect time: until the API answers for a goal again.
        let mut client = cluster.client().await;
        while client.get_goal(GetGoalRequest { goal_id: goals[0].1.clone() }).await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
            client = cluster.client().await;
        }
        row.recovery_ms.push(restarted.elapsed().as_secs_f64() * 1000.0);
        let completed = cluster.wait_all(&goals, Duration::from_secs(120)).await;
        row.trials += 1;
        row.count(&cluster, &goals, &completed);
    }
    row
}

async fn stop_an_agent_past_ack_wait(trials: usize) -> Row {
    let mut row = Row { scenario: "5 SIGSTOP an agent past AckWait, SIGCONT", ..Default::default() };
    let cluster = Cluster::start(&["a1", "a2"]).await;
    for trial in 0..trials {
        let goals = cluster.submit(&format!("s5t{trial}"), 6, 1000).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let victim = &cluster.agents[if trial % 2 == 0 { "a1" } else { "a2" }];
        let stopped = Instant::now();
        victim.sigstop();
        // Past AckWait (3 s) and the heartbeat TTL (1 s): its work moves to the other agent.
        tokio::time::sleep(Duration::from_secs(5)).await;
        victim.sigcont();
        let completed = cluster.wait_all(&goals, Duration::from_secs(90)).await;
        row.recovery_ms.push(stopped.elapsed().as_secs_f64() * 1000.0);
        // Let the resumed agent finish whatever it held, then count.
        tokio::time::sleep(Duration::from_secs(2)).await;
        row.trials += 1;
        row.count(&cluster, &goals, &completed);
    }
    row
}

fn start_planner(nats_url: &str, llm_url: &str) -> HermesProcess {
    HermesProcess::start(
        hermes_bin(),
        &[
            "planner",
            "--nats-url",
            nats_url,
            "--ack-wait-secs",
            "2",
            "--llm-base-url",
            llm_url,
            "--llm-model",
            "planner-model",
        ],
    )
}

/// The planner is killed while its model works on a plan; another planner gets the request
/// again, and the goal gets exactly one plan and completes.
async fn kill_the_planner(trials: usize) -> Row {
    use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
    let mut row = Row { scenario: "3 kill -9 the planner mid-plan", ..Default::default() };
    let llm = ScriptedLlm::start().await;
    let cluster = Cluster::start(&["a1", "a2"]).await;
    for trial in 0..trials {
        let tag = format!("s3t{trial}-{}", hermes_core::now_unix_ms());
        let plan = serde_json::json!({"nodes": [
            {"id": "nap", "task_type": "time.sleep", "inputs": {"ms": 100}},
            {"id": "write", "task_type": "fs.write", "inputs": {"path": EFFECTS, "content": format!("{tag}\n"), "append": true}, "depends_on": ["nap"]}
        ]})
        .to_string();
        // The first planner asks and dies while the model "thinks"; the second gets the answer.
        llm.push("planner-model", ScriptedResponse::content(plan.clone()).with_delay(Duration::from_secs(3)));
        llm.push("planner-model", ScriptedResponse::content(plan));
        let asked = llm.requests_for("planner-model").len();
        let mut first = start_planner(&cluster.nats.url(), &llm.base_url());
        let mut client = cluster.client().await;
        let spec = GoalSpec {
            text: format!("Append the tag {tag} to the effects file"),
            idempotency_key: tag.clone(),
            ..Default::default()
        };
        let goal_id =
            client.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await.unwrap().into_inner().goal_id;
        let deadline = Instant::now() + Duration::from_secs(20);
        while llm.requests_for("planner-model").len() == asked {
            assert!(Instant::now() < deadline, "the first planner never asked its model");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let killed = Instant::now();
        first.kill9();
        let mut second = start_planner(&cluster.nats.url(), &llm.base_url());
        let goals = vec![(tag, goal_id.clone())];
        let completed = cluster.wait_all(&goals, Duration::from_secs(60)).await;
        row.recovery_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
        row.trials += 1;
        row.count(&cluster, &goals, &completed);
        // Exactly one plan.
        let events = client
            .watch_goal(hermes_proto::WatchGoalRequest { goal_id, after_seq: 0 })
            .await
            .unwrap()
            .into_inner();
        use futures::StreamExt;
        let events: Vec<_> = tokio::time::timeout(Duration::from_secs(10), events.collect::<Vec<_>>())
            .await
            .unwrap_or_default();
        let plans = events
            .iter()
            .filter(|e| {
                matches!(
                    e.as_ref().ok().and_then(|e| e.kind.as_ref()),
                    Some(hermes_proto::event::Kind::PlanCreated(_))
                )
            })
            .count();
        if plans != 1 {
            println!("planner trial {trial}: {plans} plans");
            row.duplicates += 1;
        }
        second.kill9();
    }
    row
}

/// A task no agent can ever finish: exactly MaxDeliver deliveries, one DLQ entry, its node fails
/// with POISON_MESSAGE, and the goals around it are unaffected.
async fn poison_task(trials: usize) -> Row {
    use async_nats::jetstream::consumer::{AckPolicy, pull};
    use futures::StreamExt;
    use prost::Message as _;
    let mut row = Row { scenario: "6 a poison task among healthy goals", ..Default::default() };
    let cluster = Cluster::start(&["a1", "a2"]).await;
    let bus = hermes_core::Bus::connect(hermes_core::BusConfig::new(cluster.nats.url())).await.unwrap();
    let topology = bus.topology().clone();
    for trial in 0..trials {
        let goals = cluster.submit(&format!("s6t{trial}"), 10, 300).await;
        // The poison: a goal whose node's task goes to a consumer that never acks.
        let goal_id = format!("chaos-poison-{trial}");
        let now = hermes_core::now_unix_ms();
        let state = hermes_proto::GoalState {
            goal_id: goal_id.clone(),
            status: GoalStatus::Running as i32,
            plan: Some(TaskPlan {
                nodes: vec![TaskNode {
                    id: "p".into(),
                    task_type: "time.sleep".into(),
                    inputs_json: r#"{"ms": 1}"#.into(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
            nodes: vec![hermes_proto::NodeState {
                node_id: "p".into(),
                status: hermes_proto::NodeStatus::Dispatched as i32,
                attempt: 1,
                task_id: format!("{goal_id}.p.1"),
                dispatched_unix_ms: now,
                ..Default::default()
            }],
            created_unix_ms: now,
            deadline_unix_ms: now + 120_000,
            spec: Some(GoalSpec::default()),
            ..Default::default()
        };
        bus.goals().put(&goal_id, state.encode_to_vec().into()).await.unwrap();
        let ghost = format!("ghost{trial}");
        let subject = topology.direct_task(&ghost, "time.sleep");
        let stream = bus.jetstream().get_stream(topology.tasks_stream()).await.unwrap();
        let consumer = stream
            .create_consumer(pull::Config {
                durable_name: Some(topology.agent_consumer(&ghost)),
                filter_subject: subject.clone(),
                ack_policy: AckPolicy::Explicit,
                ack_wait: Duration::from_millis(300),
                max_deliver: 3,
                ..Default::default()
            })
            .await
            .unwrap();
        let task = hermes_proto::TaskMessage {
            goal_id: goal_id.clone(),
            node_id: "p".into(),
            task_id: format!("{goal_id}.p.1"),
            attempt: 1,
            task_type: "time.sleep".into(),
            inputs_json: r#"{"ms": 1}"#.into(),
            ..Default::default()
        };
        bus.publish(subject, &task, &task.task_id, None).await.unwrap();
        let mut messages = consumer.messages().await.unwrap();
        let mut deliveries = 0;
        while let Ok(Some(Ok(_))) = tokio::time::timeout(Duration::from_secs(3), messages.next()).await {
            deliveries += 1;
        }
        let completed = cluster.wait_all(&goals, Duration::from_secs(60)).await;
        row.trials += 1;
        row.count(&cluster, &goals, &completed);
        // The poison goal failed with POISON_MESSAGE after exactly MaxDeliver deliveries.
        let mut client = cluster.client().await;
        let poisoned =
            client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await.unwrap().into_inner();
        let dlq = client
            .list_dead_letters(hermes_proto::ListDeadLettersRequest { limit: 0 })
            .await
            .unwrap()
            .into_inner();
        let entries = dlq.dead_letters.iter().filter(|d| d.origin.starts_with("HERMES_TASKS")).count();
        if poisoned.error.as_ref().is_none_or(|e| e.code != "POISON_MESSAGE")
            || deliveries != 3
            || entries != trial + 1
        {
            println!(
                "poison trial {trial}: deliveries {deliveries}, dlq entries {entries}, goal {:?}",
                poisoned.error
            );
            row.lost += 1;
        }
    }
    row
}

/// Two dispatchers and three agents, with one of them killed (and restarted) every couple of
/// seconds while goals keep coming, through whichever dispatcher is up.
async fn random_kills(duration: Duration) -> Row {
    let mut row = Row { scenario: "7 2 dispatchers + 3 agents, random kills", ..Default::default() };
    let mut cluster = Cluster::start_with(2, &["a1", "a2", "a3"]).await;
    let mut rng = hermes_core::now_unix_ms() | 1;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let started = Instant::now();
    let mut goals = Vec::new();
    let mut round = 0;
    let mut restarts = 0;
    while started.elapsed() < duration {
        cluster.current = (next() % 2) as usize;
        goals.extend(cluster.submit(&format!("s7r{round}"), 8, 400).await);
        let victim = (next() % 5) as usize;
        if victim < 2 {
            cluster.restart_up(victim);
        } else {
            let ids: Vec<String> = cluster.agents.keys().cloned().collect();
            let id = ids[(next() as usize) % ids.len()].clone();
            if let Some(mut agent) = cluster.agents.remove(&id) {
                agent.kill9();
            }
            restarts += 1;
            cluster.start_agent(&format!("a-r{restarts}"));
        }
        round += 1;
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    let settle = Instant::now();
    let completed = cluster.wait_all(&goals, Duration::from_secs(120)).await;
    row.recovery_ms.push(settle.elapsed().as_secs_f64() * 1000.0);
    let mut client = cluster.client().await;
    for (tag, goal_id) in goals.iter().filter(|(_, g)| !completed.contains(g)) {
        if let Ok(goal) = client.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await {
            let goal = goal.into_inner();
            let nodes: Vec<String> = goal
                .nodes
                .iter()
                .map(|n| format!("{}:{}:a{}@{}", n.node_id, n.status, n.attempt, n.agent_id))
                .collect();
            let written = cluster.effects().get(tag).copied().unwrap_or(0);
            println!("unfinished {tag} {goal_id}: written {written} status {} nodes {nodes:?}", goal.status);
        }
    }
    if completed.len() < goals.len() {
        let bus = hermes_core::Bus::connect(hermes_core::BusConfig::new(cluster.nats.url())).await.unwrap();
        let stream = bus.jetstream().get_stream(bus.topology().tasks_stream()).await.unwrap();
        let mut subjects = stream.info_with_subjects(">").await.unwrap();
        while let Some(Ok((subject, count))) = futures::StreamExt::next(&mut subjects).await {
            println!("left in the tasks stream: {subject} x{count}");
        }
        let results = bus.jetstream().get_stream(bus.topology().results_stream()).await.unwrap();
        let mut left = results.info_with_subjects(">").await.unwrap();
        while let Some(Ok((subject, count))) = futures::StreamExt::next(&mut left).await {
            println!("left in the results stream: {subject} x{count}");
        }
        let mut consumers = stream.consumer_names();
        while let Some(Ok(name)) = futures::StreamExt::next(&mut consumers).await {
            println!("consumer {name}");
        }
    }
    row.trials = round;
    row.count(&cluster, &goals, &completed);
    row
}

/// The streams whose leaders and replicas the cluster scenarios watch.
const CLUSTER_STREAMS: &[&str] = &["HERMES_TASKS", "HERMES_RESULTS", "HERMES_EVENTS", "KV_hermes_goals"];

/// The leader of `stream`, by its server name, as the cluster reports it now.
async fn stream_leader(urls: &str, stream: &str) -> Option<String> {
    let client = async_nats::connect(hermes_core::bus::server_urls(urls)).await.ok()?;
    let js = async_nats::jetstream::new(client);
    let mut stream = js.get_stream(stream).await.ok()?;
    stream.info().await.ok()?.cluster.clone()?.leader
}

/// Waits until every stream of [`CLUSTER_STREAMS`] has a leader and all its replicas are current
/// (after a server came back), so the next fault does not land on a group still catching up.
async fn wait_streams_current(urls: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    let client = async_nats::connect(hermes_core::bus::server_urls(urls)).await.unwrap();
    let js = async_nats::jetstream::new(client);
    'wait: loop {
        assert!(Instant::now() < deadline, "the cluster's streams did not catch up within {timeout:?}");
        for name in CLUSTER_STREAMS {
            let Ok(mut stream) = js.get_stream(*name).await else {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue 'wait;
            };
            let current = match stream.info().await {
                Ok(info) => info.cluster.as_ref().is_some_and(|c| {
                    c.leader.is_some()
                        && c.replicas.len() == 2
                        && c.replicas.iter().all(|r| r.current && !r.offline)
                }),
                Err(_) => false,
            };
            if !current {
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue 'wait;
            }
        }
        return;
    }
}

/// Which server a cluster scenario faults.
#[derive(Clone, Copy)]
enum Victim {
    /// The leader of `HERMES_TASKS`.
    TasksLeader,
    /// The JetStream meta leader.
    MetaLeader,
}

impl Cluster {
    fn victim(&self, victim: Victim, tasks_leader: Option<String>) -> usize {
        let Nats::Three(nats) = &self.nats else { panic!("a cluster scenario on one server") };
        let name = match victim {
            Victim::TasksLeader => tasks_leader.expect("HERMES_TASKS has a leader"),
            Victim::MetaLeader => nats.meta_leader().expect("the cluster has a meta leader"),
        };
        nats.index_of(&name).unwrap_or_else(|| panic!("no server named {name}"))
    }
}

impl Cluster {
    /// One trial of 8, 9 and 12: `kill -9` the `victim` server while `goals` run, count them into
    /// `row` once they end, then restart it and wait until every stream has caught up.
    async fn kill_a_server_under(&mut self, victim: Victim, goals: &[(String, String)], row: &mut Row) {
        let urls = self.nats.url();
        tokio::time::sleep(Duration::from_millis(200)).await;
        let leader = stream_leader(&urls, "HERMES_TASKS").await;
        let i = self.victim(victim, leader);
        let killed = Instant::now();
        self.nats.three().kill(i);
        let completed = self.wait_all(goals, Duration::from_secs(120)).await;
        row.recovery_ms.push(killed.elapsed().as_secs_f64() * 1000.0);
        row.trials += 1;
        row.count(self, goals, &completed);
        self.nats.three().restart(i);
        wait_streams_current(&urls, Duration::from_secs(60)).await;
    }
}

/// 8 and 9: `kill -9` one server of the three mid-load (the tasks stream's leader, or the meta
/// leader), let the goals finish on the other two, then restart it.
async fn kill_a_cluster_server(victim: Victim, trials: usize, goals_per_trial: usize) -> Row {
    let scenario = match victim {
        Victim::TasksLeader => "8 cluster: kill -9 HERMES_TASKS's leader",
        Victim::MetaLeader => "9 cluster: kill -9 the meta leader",
    };
    let mut row = Row { scenario, ..Default::default() };
    let mut cluster = Cluster::start_clustered(1, &["a1", "a2", "a3"]).await;
    for trial in 0..trials {
        let goals = cluster.submit(&format!("s8t{trial}"), goals_per_trial, 300).await;
        cluster.kill_a_server_under(victim, &goals, &mut row).await;
    }
    row
}

/// 10: SIGSTOP the tasks stream's leader past the cluster's heartbeats (a new leader is elected
/// while it is frozen), then SIGCONT it; goals submitted before the freeze finish.
async fn freeze_a_cluster_server(trials: usize, goals_per_trial: usize, frozen: Duration) -> Row {
    let mut row = Row { scenario: "10 cluster: SIGSTOP a server, SIGCONT", ..Default::default() };
    let mut cluster = Cluster::start_clustered(1, &["a1", "a2", "a3"]).await;
    let urls = cluster.nats.url();
    for trial in 0..trials {
        let goals = cluster.submit(&format!("s10t{trial}"), goals_per_trial, 300).await;
        let leader = stream_leader(&urls, "HERMES_TASKS").await;
        let i = cluster.victim(Victim::TasksLeader, leader);
        let stopped = Instant::now();
        cluster.nats.three().freeze(i);
        tokio::time::sleep(frozen).await;
        cluster.nats.three().thaw(i);
        let completed = cluster.wait_all(&goals, Duration::from_secs(120)).await;
        row.recovery_ms.push(stopped.elapsed().as_secs_f64() * 1000.0);
        row.trials += 1;
        row.count(&cluster, &goals, &completed);
        wait_streams_current(&urls, Duration::from_secs(60)).await;
    }
    row
}

/// 11: a rolling restart of all three servers (each `kill -9`ed, restarted and caught up before
/// the next), with goals submitted before and during it.
async fn rolling_restart(trials: usize, goals_per_step: usize) -> Row {
    let mut row = Row { scenario: "11 cluster: rolling restart of all three", ..Default::default() };
    let mut cluster = Cluster::start_clustered(1, &["a1", "a2", "a3"]).await;
    let urls = cluster.nats.url();
    for trial in 0..trials {
        let started = Instant::now();
        let mut goals = Vec::new();
        for i in 0..cluster.nats.three().size() {
            goals.extend(cluster.submit(&format!("s11t{trial}n{i}"), goals_per_step, 300).await);
            cluster.nats.three().restart(i);
            wait_streams_current(&urls, Duration::from_secs(60)).await;
        }
        let completed = cluster.wait_all(&goals, Duration::from_secs(120)).await;
        row.recovery_ms.push(started.elapsed().as_secs_f64() * 1000.0);
        row.trials += 1;
        row.count(&cluster, &goals, &completed);
    }
    row
}

impl Cluster {
    /// The production shape on a three-node cluster, every service its own binary and given the
    /// three URLs: two `hermes-dispatcher`s, a `hermes-registry`, a `hermes-planner` (planning
    /// with `llm`), a `hermes-memory` and three `hermes-executor`s.
    async fn start_production_shape(llm: &ScriptedLlm) -> Cluster {
        let nats = Nats::Three(hermes_test_util::NatsCluster::start(3));
        let urls = nats.url();
        let workspace = tempfile::tempdir().unwrap();
        let logs = logs_dir().unwrap_or_else(|| workspace.path().join("logs"));
        std::fs::create_dir_all(&logs).unwrap();
        let start = |binary: &str, name: &str, args: &[&str]| {
            let mut all = vec!["--nats-url", &urls, "--nats-replicas", "3"];
            all.extend_from_slice(args);
            let log = logs.join(format!("{name}.log"));
            HermesProcess::start_logged(hermes_test_util::process::built_binary(binary), &all, &log)
        };
        // A dispatcher first: it creates the streams and buckets the others look up.
        let ups: Vec<Up> = (0..2)
            .map(|i| {
                let grpc = format!("127.0.0.1:{}", hermes_test_util::free_port());
                let args = [
                    "--grpc-listen",
                    &grpc,
                    "--dispatcher-http-listen",
                    "off",
                    "--dispatcher-planner-service",
                    "true",
                    "--llm-provider",
                    "none",
                ];
                let proc = start("hermes-dispatcher", &format!("dispatcher-{i}"), &args);
                Up { proc, grpc, _data: None }
            })
            .collect();
        let registry = format!("127.0.0.1:{}", hermes_test_util::free_port());
        let mut services = vec![
            start("hermes-registry", "registry", &["--grpc-listen", &registry, "--heartbeat-ttl-secs", "1"]),
            start(
                "hermes-planner",
                "planner",
                &[
                    "--llm-provider",
                    "openai",
                    "--llm-base-url",
                    &llm.base_url(),
                    "--llm-planner-model",
                    "planner-model",
                ],
            ),
            start(
                "hermes-memory",
                "memory",
                &["--grpc-listen", &format!("127.0.0.1:{}", hermes_test_util::free_port())],
            ),
        ];
        let dir = workspace.path().to_str().unwrap().to_owned();
        for i in 1..=3 {
            let id = format!("e{i}");
            let args = [
                "--agent-id",
                &id,
                "--agent-tools",
                "fs.write,time.sleep",
                "--agent-workspace",
                &dir,
                "--agent-heartbeat-ms",
                "200",
                "--agent-ack-wait-secs",
                "3",
                "--agent-max-concurrency",
                "64",
            ];
            services.push(start("hermes-executor", &format!("executor-{id}"), &args));
        }
        let cluster =
            Cluster { nats, workspace, ups, current: 0, agents: HashMap::new(), registry, services };
        cluster.wait_ready(3).await;
        cluster
    }

    /// Submits a text goal that the planner plans (with the scripted `llm`) into one append of
    /// its tag to the effects file; returns (tag, goal id).
    async fn submit_text(&self, llm: &ScriptedLlm, tag: &str) -> (String, String) {
        let plan = serde_json::json!({
            "reasoning": "one append",
            "nodes": [{"id": "write", "task_type": "fs.write",
                       "inputs": {"path": EFFECTS, "content": format!("{tag}\n"), "append": true}}]
        });
        llm.push("planner-model", ScriptedResponse::content(plan.to_string()));
        let spec = GoalSpec {
            text: format!("Append {tag} to the effects file"),
            idempotency_key: tag.to_owned(),
            timeout_ms: 120_000,
            ..Default::default()
        };
        let goal_id = self
            .client()
            .await
            .submit_goal(SubmitGoalRequest { spec: Some(spec) })
            .await
            .unwrap()
            .into_inner()
            .goal_id;
        (tag.to_owned(), goal_id)
    }
}

/// 12: the production shape (every service its own binary, two dispatchers) on the cluster: goals
/// through both dispatchers and one planned from text, while the tasks stream's leader is killed.
async fn production_shape(trials: usize, goals_per_trial: usize) -> Row {
    let mut row = Row { scenario: "12 cluster: own binaries, kill -9 a leader", ..Default::default() };
    let llm = ScriptedLlm::start().await;
    let mut cluster = Cluster::start_production_shape(&llm).await;
    for trial in 0..trials {
        let mut goals = Vec::new();
        for half in 0..2 {
            cluster.current = half;
            goals.extend(cluster.submit(&format!("s12t{trial}d{half}"), goals_per_trial / 2, 300).await);
        }
        let tag = format!("s12t{trial}-text-{}", hermes_core::now_unix_ms());
        goals.push(cluster.submit_text(&llm, &tag).await);
        cluster.kill_a_server_under(Victim::TasksLeader, &goals, &mut row).await;
    }
    assert!(cluster.services.iter_mut().all(|s| s.alive()), "a service of the production shape exited");
    row
}

/// Prints the table of `rows` and fails on any loss or duplicate.
fn report(rows: &[Row], recovery: &str) {
    println!(
        "\n{:<44} {:>6} {:>6} {:>9} {:>10} {:>5} {:>10} {:>10}",
        "scenario", "trials", "goals", "completed", "duplicates", "lost", "recov p50", "recov p99"
    );
    for row in rows {
        row.print();
    }
    println!("{recovery}\n");
    for row in rows {
        assert_eq!(row.duplicates, 0, "{}: duplicated side effects", row.scenario);
        assert_eq!(row.lost, 0, "{}: lost goals", row.scenario);
        assert_eq!(row.completed, row.goals, "{}: goals that did not complete", row.scenario);
    }
}

/// Hermes on a three-node JetStream cluster (R3), every service given the three URLs: servers
/// killed, frozen and restarted one at a time under load. `make test` runs one trial of each,
/// `make chaos` the full table.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cluster_chaos() {
    let full = full();
    let (trials, goals) = if full { (3, 60) } else { (1, 12) };
    // `HERMES_CLUSTER_ONLY=8` runs one scenario, for debugging.
    if let Ok(only) = std::env::var("HERMES_CLUSTER_ONLY") {
        let row = match only.as_str() {
            "8" => kill_a_cluster_server(Victim::TasksLeader, trials, goals).await,
            "9" => kill_a_cluster_server(Victim::MetaLeader, trials, goals).await,
            "10" => freeze_a_cluster_server(trials, goals, Duration::from_secs(6)).await,
            "11" => rolling_restart(1, goals / 3).await,
            "12" => production_shape(trials, goals).await,
            _ => panic!("HERMES_CLUSTER_ONLY: 8, 9, 10, 11 or 12"),
        };
        return report(&[row], "");
    }
    let rows = vec![
        kill_a_cluster_server(Victim::TasksLeader, trials, goals).await,
        kill_a_cluster_server(Victim::MetaLeader, trials, goals).await,
        freeze_a_cluster_server(trials, goals, Duration::from_secs(6)).await,
        rolling_restart(if full { 2 } else { 1 }, goals / 3).await,
        production_shape(trials, goals).await,
    ];
    report(
        &rows,
        "recovery: ms from the fault (11: from the first restart) to every goal of the trial ended",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn chaos() {
    let full = full();
    // `HERMES_CHAOS_ONLY=7` runs one scenario, for debugging.
    if let Ok(only) = std::env::var("HERMES_CHAOS_ONLY") {
        let row = match only.as_str() {
            "2" => kill_the_dispatcher(if full { 3 } else { 1 }, if full { 100 } else { 30 }).await,
            "7" => random_kills(Duration::from_secs(8)).await,
            "5" => stop_an_agent_past_ack_wait(1).await,
            "3" => kill_the_planner(1).await,
            "13" => webhooks_through_kills(1, if full { 60 } else { 15 }).await,
            _ => panic!("HERMES_CHAOS_ONLY: 2, 3, 5, 7 or 13"),
        };
        row.print();
        return;
    }
    let rows = vec![
        kill_an_agent_mid_task(if full { 10 } else { 2 }).await,
        kill_the_dispatcher(if full { 3 } else { 1 }, if full { 100 } else { 30 }).await,
        kill_the_planner(if full { 3 } else { 1 }).await,
        kill_nats(if full { 2 } else { 1 }, if full { 200 } else { 40 }).await,
        stop_an_agent_past_ack_wait(if full { 4 } else { 1 }).await,
        poison_task(if full { 3 } else { 1 }).await,
        random_kills(Duration::from_secs(if full { 45 } else { 8 })).await,
        webhooks_through_kills(if full { 2 } else { 1 }, if full { 60 } else { 15 }).await,
    ];
    report(
        &rows,
        "recovery: ms from the fault to every goal of the trial ended (scenario 4: to the API answering again)",
    );
}
