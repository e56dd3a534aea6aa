//! Routing and failover against a real nats-server: load follows capacity, a killed agent's work
//! moves on, a draining agent finishes its work, a restarted registry routes at once, and a task
//! type nobody serves fails with NO_CAPABLE_AGENT.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hermes_executor::AgentConfig;
use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::event::Kind;
use hermes_proto::registry_client::RegistryClient;
use hermes_proto::{
    AgentChange, Event, GetGoalRequest, GoalSpec, SubmitGoalRequest, TaskPlan, WatchGoalRequest,
};
use hermes_test_util::process::HermesAgent;
use hermes_tests::{Sandbox, hermes_bin, node, repo_root};
use tonic::transport::Channel;

fn agent(id: &str, max_concurrency: u32, tools: &[&str]) -> AgentConfig {
    let mut config = AgentConfig::new(id, repo_root());
    config.max_concurrency = max_concurrency;
    config.tools = tools.iter().map(|t| t.to_string()).collect();
    config.heartbeat_interval = Duration::from_millis(200);
    config
}

struct Harness {
    sandbox: Sandbox,
    nats_url: String,
    client: DispatcherClient<Channel>,
    registry: RegistryClient<Channel>,
}

/// A sandbox with exactly `agents`, the registry's heartbeat TTL and the no-capable-agent wait.
async fn start(agents: Vec<AgentConfig>, ttl: Duration, no_agent_wait: Duration) -> Harness {
    let mut builder = Sandbox::builder().agents(0).heartbeat_ttl(ttl).no_agent_wait(no_agent_wait);
    for agent in agents {
        builder = builder.agent(agent);
    }
    Harness::on(builder.start().await).await
}

fn sleeps(n: usize, ms: u64) -> TaskPlan {
    TaskPlan {
        nodes: (0..n)
            .map(|i| node(&format!("n{i}"), "time.sleep", serde_json::json!({"ms": ms}), &[]))
            .collect(),
        ..Default::default()
    }
}

impl Harness {
    async fn on(sandbox: Sandbox) -> Harness {
        let registry = sandbox.registry_client().await;
        Harness { nats_url: sandbox.nats.url(), client: sandbox.client.clone(), registry, sandbox }
    }

    async fn submit(&mut self, plan: TaskPlan) -> String {
        let spec = GoalSpec { plan: Some(plan), ..Default::default() };
        self.client.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await.unwrap().into_inner().goal_id
    }

    /// Every event of the goal until it ends, with the time each was received.
    async fn events(&mut self, goal_id: &str, within: Duration) -> Vec<(Instant, Event)> {
        let stream = self
            .client
            .watch_goal(WatchGoalRequest { goal_id: goal_id.into(), after_seq: 0 })
            .await
            .unwrap()
            .into_inner();
        tokio::time::timeout(within, stream.map(|e| (Instant::now(), e.unwrap())).collect::<Vec<_>>())
            .await
            .expect("goal ends in time")
    }

    /// Nodes per agent that ran them, from the goal's final state.
    async fn nodes_per_agent(&mut self, goal_id: &str) -> HashMap<String, usize> {
        let goal =
            self.client.get_goal(GetGoalRequest { goal_id: goal_id.into() }).await.unwrap().into_inner();
        let mut counts = HashMap::new();
        for n in goal.nodes {
            *counts.entry(n.agent_id).or_insert(0) += 1;
        }
        counts
    }
}

fn completed(events: &[(Instant, Event)]) -> bool {
    matches!(events.last().map(|(_, e)| &e.kind), Some(Some(Kind::GoalCompleted(_))))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn equal_agents_share_300_tasks_evenly() {
    let agents = (1..=3).map(|i| agent(&format!("eq-{i}"), 8, &["time.sleep"])).collect();
    let mut h = start(agents, Duration::from_secs(5), Duration::from_secs(5)).await;
    let goal = h.submit(sleeps(300, 20)).await;
    let events = h.events(&goal, Duration::from_secs(60)).await;
    assert!(completed(&events));
    let counts = h.nodes_per_agent(&goal).await;
    for id in ["eq-1", "eq-2", "eq-3"] {
        let n = counts.get(id).copied().unwrap_or(0);
        assert!((80..=120).contains(&n), "{id} ran {n} of 300: {counts:?}");
    }
    // Every dispatch names its decision.
    let directed = events
        .iter()
        .filter_map(|(_, e)| match &e.kind {
            Some(Kind::TaskDispatched(d)) => Some(d.clone()),
            _ => None,
        })
        .filter(|d| !d.agent_id.is_empty())
        .collect::<Vec<_>>();
    assert!(!directed.is_empty());
    assert!(
        directed.iter().all(|d| d.score > 0.0 && d.reason.contains("speed") && d.reason.contains("busy")),
        "{:?}",
        directed[0]
    );
    h.sandbox.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn share_follows_capacity() {
    let agents = vec![
        agent("small", 1, &["time.sleep"]),
        agent("big-1", 8, &["time.sleep"]),
        agent("big-2", 8, &["time.sleep"]),
    ];
    let mut h = start(agents, Duration::from_secs(5), Duration::from_secs(5)).await;
    let goal = h.submit(sleeps(170, 20)).await;
    assert!(completed(&h.events(&goal, Duration::from_secs(60)).await));
    let counts = h.nodes_per_agent(&goal).await;
    let share = |id: &str| counts.get(id).copied().unwrap_or(0) as f64 / 170.0;
    assert!(share("small") < 0.15, "{counts:?}");
    assert!(share("big-1") > 0.35 && share("big-2") > 0.35, "{counts:?}");
    h.sandbox.stop().await;
}

/// `hermes agent` as a child process serving `time.sleep`, once it serves.
fn spawn_agent_process(nats_url: &str, id: &str, max_concurrency: u32) -> HermesAgent {
    spawn_agent_process_with(nats_url, id, max_concurrency, &[])
}

fn spawn_agent_process_with(nats_url: &str, id: &str, max_concurrency: u32, extra: &[&str]) -> HermesAgent {
    HermesAgent::builder(hermes_bin(), nats_url, id)
        .args([
            "--tools",
            "time.sleep",
            "--max-concurrency",
            &max_concurrency.to_string(),
            "--heartbeat-ms",
            "200",
        ])
        .args(extra)
        .start()
}

async fn wait_for_agent(registry: &mut RegistryClient<Channel>, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(15);
    while Instant::now() < deadline {
        let agents =
            registry.list_agents(hermes_proto::ListAgentsRequest {}).await.unwrap().into_inner().agents;
        if agents.iter().any(|a| a.heartbeat.as_ref().is_some_and(|h| h.agent_id == id)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("agent {id} did not register");
}

fn dispatched_to(events: &[(Instant, Event)]) -> Vec<(Instant, String, String)> {
    events
        .iter()
        .filter_map(|(at, e)| match &e.kind {
            Some(Kind::TaskDispatched(d)) => Some((*at, d.node_id.clone(), d.agent_id.clone())),
            _ => None,
        })
        .collect()
}

fn successes_per_node(events: &[(Instant, Event)]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (_, e) in events {
        if let Some(Kind::TaskSucceeded(s)) = &e.kind {
            *counts.entry(s.node_id.clone()).or_insert(0) += 1;
        }
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_killed_agent_goes_offline_and_its_tasks_finish_elsewhere() {
    let ttl = Duration::from_secs(1);
    let mut h = start(vec![agent("survivor", 8, &["time.sleep"])], ttl, Duration::from_secs(5)).await;
    let mut doomed = spawn_agent_process(&h.nats_url, "doomed", 8);
    wait_for_agent(&mut h.registry, "doomed").await;
    let mut changes =
        h.registry.watch_agents(hermes_proto::WatchAgentsRequest {}).await.unwrap().into_inner();

    let goal = h.submit(sleeps(8, 1500)).await;
    let mut client = h.client.clone();
    let watch = tokio::spawn({
        let goal = goal.clone();
        async move {
            let stream = client
                .watch_goal(WatchGoalRequest { goal_id: goal, after_seq: 0 })
                .await
                .unwrap()
                .into_inner();
            stream.map(|e| (Instant::now(), e.unwrap())).collect::<Vec<_>>().await
        }
    });
    // Let the doomed agent start its share, then kill it without a chance to deregister.
    tokio::time::sleep(Duration::from_millis(400)).await;
    doomed.kill9();
    let killed_at = Instant::now();

    let offline_at = tokio::time::timeout(ttl + Duration::from_secs(2), async {
        while let Some(Ok(change)) = changes.next().await {
            let id = change.agent.as_ref().and_then(|a| a.heartbeat.as_ref()).map(|h| h.agent_id.clone());
            if change.change == AgentChange::Offline as i32 && id.as_deref() == Some("doomed") {
                return Instant::now();
            }
        }
        panic!("watch ended");
    })
    .await
    .expect("offline within TTL + 2 s");
    assert!(offline_at.duration_since(killed_at) <= ttl + Duration::from_secs(2));

    let events = tokio::time::timeout(Duration::from_secs(30), watch).await.unwrap().unwrap();
    assert!(completed(&events), "goal did not complete");
    let dispatches = dispatched_to(&events);
    let on_doomed: Vec<_> = dispatches.iter().filter(|(_, _, a)| a == "doomed").collect();
    assert!(!on_doomed.is_empty(), "the doomed agent got no work, so nothing was tested: {dispatches:?}");
    assert!(on_doomed.iter().all(|(at, _, _)| *at <= offline_at), "routed to doomed after it went offline");
    // Every node has exactly one accepted result, and the doomed agent's nodes finished on the survivor.
    let successes = successes_per_node(&events);
    assert_eq!(successes.len(), 8);
    assert!(successes.values().all(|&n| n == 1), "{successes:?}");
    let per_agent = h.nodes_per_agent(&goal).await;
    assert_eq!(per_agent.get("survivor"), Some(&8), "{per_agent:?}");
    // The dead agent's consumer, and the one used to drain it, are gone.
    let tasks = h.sandbox.bus.jetstream().get_stream("HERMES_TASKS").await.unwrap();
    let topology = h.sandbox.bus.topology().clone();
    assert!(tasks.consumer_info(topology.agent_consumer("doomed")).await.is_err());
    assert!(tasks.consumer_info(topology.reassign_consumer("doomed")).await.is_err());
    h.sandbox.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_graceful_shutdown_drains_then_deregisters() {
    let mut h =
        start(vec![agent("stayer", 4, &["time.sleep"])], Duration::from_secs(5), Duration::from_secs(5))
            .await;
    // A long ack wait: a task it pulled but did not start is only redelivered soon if it is
    // handed back (nak'ed) at shutdown.
    let drain = ["--drain-timeout-secs", "10", "--agent-ack-wait-secs", "60"];
    let mut leaver = spawn_agent_process_with(&h.nats_url, "leaver", 4, &drain);
    wait_for_agent(&mut h.registry, "leaver").await;
    let goal = h.submit(sleeps(16, 1000)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    // SIGTERM: the agent stops taking work at once, finishes what it runs, then leaves.
    let term_at = Instant::now();
    leaver.sigterm();
    // It stays listed while it drains, marked so nothing new is routed to it.
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let agents =
            h.registry.list_agents(hermes_proto::ListAgentsRequest {}).await.unwrap().into_inner().agents;
        let leaver_hb = agents.iter().filter_map(|a| a.heartbeat.clone()).find(|hb| hb.agent_id == "leaver");
        if leaver_hb.is_some_and(|hb| hb.draining) {
            break;
        }
        assert!(Instant::now() < deadline, "the agent was not seen draining");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let status = tokio::task::spawn_blocking(move || leaver.wait_exit(Duration::from_secs(30)))
        .await
        .unwrap()
        .expect("the agent exits");
    assert!(status.success(), "agent exit: {status:?}");
    assert!(
        term_at.elapsed() < Duration::from_secs(10),
        "exited after {:?}, past its drain timeout",
        term_at.elapsed()
    );
    let events = h.events(&goal, Duration::from_secs(30)).await;
    let last: Vec<_> = events.iter().rev().take(3).map(|(_, e)| e.kind.clone()).collect();
    assert!(completed(&events), "{last:?}");
    // Well before the 60 s ack wait: nothing it held waited for redelivery.
    assert!(term_at.elapsed() < Duration::from_secs(30), "the goal took {:?}", term_at.elapsed());
    // In-flight work finished where it was (what it held but had not started moved on), and
    // each node ran once.
    assert!(successes_per_node(&events).values().all(|n| *n == 1), "{:?}", successes_per_node(&events));
    let per_agent = h.nodes_per_agent(&goal).await;
    assert!(per_agent.get("leaver").copied().unwrap_or(0) > 0, "{per_agent:?}");
    assert_eq!(per_agent.values().sum::<usize>(), 16);
    // And it left the registry.
    let agents =
        h.registry.list_agents(hermes_proto::ListAgentsRequest {}).await.unwrap().into_inner().agents;
    assert!(!agents.iter().any(|a| a.heartbeat.as_ref().is_some_and(|hb| hb.agent_id == "leaver")));
    h.sandbox.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restarted_registry_routes_at_once_from_kv() {
    // Heartbeats every 10 s: within this test only the KV mirror can tell the new registry.
    let mut slow = agent("steady", 8, &["math.evaluate"]);
    slow.heartbeat_interval = Duration::from_secs(10);
    let mut h = start(vec![slow], Duration::from_secs(30), Duration::from_secs(5)).await;
    h.sandbox.stack().restart_registry().await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let query = hermes_proto::RouteQuery { task_type: "math.evaluate".into(), ..Default::default() };
    let decisions =
        hermes_clients::registry::route(&h.sandbox.bus, vec![query], Duration::from_secs(2)).await.unwrap();
    assert_eq!(decisions[0].agent_id, "steady", "routed to the pool instead: {decisions:?}");
    h.sandbox.stop().await;
}

/// Each dispatcher routes from its own view of the agents: no route request goes to the registry,
/// and with the registry down tasks still go to the live agent directly, with a reason, instead of
/// waiting for an answer and falling back to the pool. (Submits still check plans against the
/// registry's catalogue, cached for `catalog_ttl`.)
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dispatcher_routes_from_its_own_view_while_the_registry_is_down() {
    // The catalogue is cached long enough for both submits, however slow the machine.
    let builder = Sandbox::builder()
        .agents(0)
        .heartbeat_ttl(Duration::from_secs(30))
        .catalog_ttl(Duration::from_secs(600))
        .agent(agent("steady", 8, &["math.evaluate"]));
    let mut h = Harness::on(builder.start().await).await;
    let nats = async_nats::connect(&h.nats_url).await.unwrap();
    let mut route_requests = nats.subscribe(h.sandbox.bus.topology().route()).await.unwrap();
    nats.flush().await.unwrap();
    let plan = || TaskPlan {
        nodes: vec![
            node("a", "math.evaluate", serde_json::json!({"expression": "1+1"}), &[]),
            node("b", "math.evaluate", serde_json::json!({"expression": "2+2"}), &["a"]),
        ],
        ..Default::default()
    };
    let warm = h.submit(plan()).await;
    assert!(completed(&h.events(&warm, Duration::from_secs(10)).await));
    h.sandbox.stack().stop_registry().await;
    let started = Instant::now();
    let goal = h.submit(plan()).await;
    let events = h.events(&goal, Duration::from_secs(10)).await;
    assert!(completed(&events));
    // Asking a registry that is down took 2 s per dispatch before each task went to its pool.
    assert!(
        started.elapsed() < Duration::from_millis(3900),
        "routing waited for the registry: {:?}",
        started.elapsed()
    );
    for (_, event) in &events {
        if let Some(Kind::TaskDispatched(d)) = &event.kind {
            assert_eq!(d.agent_id, "steady", "routed to the pool instead: {d:?}");
            assert!(d.reason.starts_with("capability"), "{d:?}");
        }
    }
    let asked = tokio::time::timeout(Duration::from_millis(200), route_requests.next()).await;
    assert!(asked.is_err(), "a route request went to the registry: {asked:?}");
    h.sandbox.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn malformed_and_spoofed_heartbeats_do_not_register() {
    let mut h =
        start(vec![agent("real", 4, &["math.evaluate"])], Duration::from_secs(5), Duration::from_secs(5))
            .await;
    let nats = async_nats::connect(&h.nats_url).await.unwrap();
    nats.publish("hermes.registry.heartbeat.ghost", "not protobuf".into()).await.unwrap();
    let spoof = hermes_proto::AgentHeartbeat {
        agent_id: "real".into(),
        task_types: vec!["math.evaluate".into()],
        max_concurrency: 1000,
        ..Default::default()
    };
    nats.publish("hermes.registry.heartbeat.intruder", prost::Message::encode_to_vec(&spoof).into())
        .await
        .unwrap();
    let bad_type = hermes_proto::AgentHeartbeat {
        agent_id: "bad".into(),
        task_types: vec!["hermes.>".into()],
        max_concurrency: 1,
        ..Default::default()
    };
    nats.publish("hermes.registry.heartbeat.bad", prost::Message::encode_to_vec(&bad_type).into())
        .await
        .unwrap();
    nats.flush().await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let agents =
        h.registry.list_agents(hermes_proto::ListAgentsRequest {}).await.unwrap().into_inner().agents;
    let ids: Vec<String> =
        agents.iter().filter_map(|a| a.heartbeat.as_ref()).map(|hb| hb.agent_id.clone()).collect();
    assert_eq!(ids, vec!["real"]);
    assert_eq!(
        agents[0].heartbeat.as_ref().unwrap().max_concurrency,
        4,
        "the spoof overwrote the real agent"
    );
    h.sandbox.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_task_type_nobody_serves_any_more_fails_with_no_capable_agent() {
    let agents = vec![agent("sleeper", 4, &["time.sleep"]), agent("clock", 4, &["time.now"])];
    let mut h = start(agents, Duration::from_secs(5), Duration::from_secs(1)).await;
    let plan = TaskPlan {
        nodes: vec![
            node("wait", "time.sleep", serde_json::json!({"ms": 800}), &[]),
            node("now", "time.now", serde_json::json!({}), &["wait"]),
        ],
        ..Default::default()
    };
    let goal = h.submit(plan).await;
    h.sandbox.stack().stop_agent("clock").await;
    let events = h.events(&goal, Duration::from_secs(15)).await;
    let Some(Kind::GoalFailed(failed)) = &events.last().unwrap().1.kind else { panic!("goal should fail") };
    let error = failed.error.clone().unwrap();
    assert_eq!(error.code, "NO_CAPABLE_AGENT");
    assert_eq!(error.node_id, "now");
    assert!(error.message.contains("`time.now`"), "{}", error.message);
    h.sandbox.stop().await;
}
