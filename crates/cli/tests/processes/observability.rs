//! Observability across real processes: `hermes up` (dispatcher, registry, memory), `hermes
//! planner` and `hermes agent`, each exporting spans over OTLP/gRPC to a receiver this test runs
//! (the `opentelemetry-proto` service under tonic), with models from the scripted server.
//!
//! One goal runs a plan from the planner whose one node is an `agent.run` loop that writes a
//! file with a secret in its arguments and reads a file with a secret in its output. The tests
//! check that the goal is one trace, that the secrets reach no log, span, event or dead letter,
//! and that the metrics endpoints counted what happened.

use crate::repo_root;
use std::collections::{HashMap, HashSet};
use std::io::Read as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{
    TraceService, TraceServiceServer,
};
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use serde_json::json;

const PLANNER_MODEL: &str = "planner-m";
const AGENT_MODEL: &str = "agent-m";
const ARGS_CANARY: &str = "hermes-canary-args-7Q2xK";
const OUTPUT_CANARY: &str = "hermes-canary-output-9Z4wP";
/// The trace the client starts; every span of the goal must belong to it.
const TRACE_ID: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// One exported span, flattened.
#[derive(Debug, Clone)]
struct Span {
    service: String,
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    attributes: HashMap<String, String>,
}

#[derive(Default, Clone)]
struct Receiver {
    spans: Arc<Mutex<Vec<Span>>>,
    /// Every request as received, for the secret scan.
    raw: Arc<Mutex<Vec<String>>>,
}

fn any_value(value: &Option<opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
    match value.as_ref().and_then(|v| v.value.as_ref()) {
        Some(AnyValue::StringValue(s)) => s.clone(),
        Some(AnyValue::IntValue(i)) => i.to_string(),
        Some(AnyValue::DoubleValue(d)) => d.to_string(),
        Some(AnyValue::BoolValue(b)) => b.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

#[tonic::async_trait]
impl TraceService for Receiver {
    async fn export(
        &self,
        request: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let request = request.into_inner();
        self.raw.lock().unwrap().push(format!("{request:?}"));
        let mut spans = self.spans.lock().unwrap();
        for resource in request.resource_spans {
            let service = resource
                .resource
                .iter()
                .flat_map(|r| r.attributes.iter())
                .find(|kv| kv.key == "service.name")
                .map(|kv| any_value(&kv.value))
                .unwrap_or_default();
            for scope in resource.scope_spans {
                for span in scope.spans {
                    spans.push(Span {
                        service: service.clone(),
                        name: span.name.clone(),
                        trace_id: hex(&span.trace_id),
                        span_id: hex(&span.span_id),
                        parent: hex(&span.parent_span_id),
                        attributes: span
                            .attributes
                            .iter()
                            .map(|kv| (kv.key.clone(), any_value(&kv.value)))
                            .collect(),
                    });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A process whose stderr is kept in a file for the log checks; killed on drop.
struct Proc {
    child: Child,
    log: PathBuf,
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Proc {
    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

struct Run {
    _nats: hermes_test_util::NatsServer,
    nats_url: String,
    runtime: tokio::runtime::Runtime,
    receiver: Receiver,
    llm: ScriptedLlm,
    procs: Vec<Proc>,
    server: String,
    workspace: tempfile::TempDir,
    logs: tempfile::TempDir,
    metrics: HashMap<&'static str, String>,
    goal_id: String,
    submit: Output,
}

fn spawn(name: &str, args: &[&str], env: &[(&str, String)], logs: &Path) -> Proc {
    let log = logs.join(format!("{name}.log"));
    let mut command = Command::new(env!("CARGO_BIN_EXE_hermes"));
    command
        .args(args)
        .current_dir(repo_root())
        .env(
            "RUST_LOG",
            "debug,async_nats=info,h2=info,hyper=info,tower=info,reqwest=info,opentelemetry=info",
        )
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    for (k, v) in env {
        command.env(k, v);
    }
    Proc { child: command.spawn().unwrap(), log }
}

fn hermes(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_hermes"));
    command.args(args).current_dir(repo_root());
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

fn wait_for(what: &str, timeout: Duration, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if ready() {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("timed out waiting for {what}");
}

fn scrape(addr: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    use std::io::Write as _;
    write!(stream, "GET /metrics HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut body = String::new();
    stream.read_to_string(&mut body).unwrap();
    body
}

/// The value of one series in a scrape, `None` when absent. `series` is the name with its
/// labels in the order they are written.
fn series(scrape: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    scrape.lines().find_map(|line| {
        let (key, value) = line.rsplit_once(' ')?;
        let (metric, rest) = key.split_once('{').unwrap_or((key, ""));
        if metric != name {
            return None;
        }
        let all = labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\"")));
        all.then(|| value.parse().ok()).flatten()
    })
}

/// Starts the three processes, runs the goal to its end and returns everything to check.
fn run_goal() -> Run {
    let nats = hermes_test_util::NatsServer::start();
    let nats_url = nats.url();
    let runtime = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let receiver = Receiver::default();
    let otlp = runtime.block_on(async {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let service = TraceServiceServer::new(receiver.clone());
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(service)
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        addr
    });
    let llm = runtime.block_on(ScriptedLlm::start());
    let plan = json!({
        "reasoning": "one agent step",
        "nodes": [{"id": "notes", "task_type": "agent.run",
                   "inputs": {"instruction": "Save the notes, then read the secret file", "tools": ["fs.write", "fs.read"]}}],
        "output_node": "notes"
    });
    llm.push(PLANNER_MODEL, ScriptedResponse::content(plan.to_string()).with_usage(100, 20));
    let write = json!({"path": "notes.txt", "content": format!("api_key={ARGS_CANARY}")}).to_string();
    llm.push(AGENT_MODEL, ScriptedResponse::tool_call("fs__write", &write).with_usage(11, 3));
    llm.push(
        AGENT_MODEL,
        ScriptedResponse::tool_call("fs__read", r#"{"path": "secret.txt"}"#).with_usage(13, 4),
    );
    llm.push(AGENT_MODEL, ScriptedResponse::content("Saved the notes and read the file.").with_usage(17, 5));

    let workspace = tempfile::tempdir().unwrap();
    std::fs::write(workspace.path().join("secret.txt"), format!("db password: {OUTPUT_CANARY}\n")).unwrap();
    let logs = tempfile::tempdir().unwrap();
    let data = tempfile::tempdir().unwrap();
    let otel = format!("http://{otlp}");
    let port = || format!("127.0.0.1:{}", hermes_test_util::free_port());
    let metrics = HashMap::from([("up", port()), ("planner", port()), ("agent", port())]);
    let server = port();
    let mut procs = vec![spawn(
        "up",
        &[
            "up",
            "--grpc-listen",
            &server,
            "--http-listen",
            "127.0.0.1:0",
            "--nats-url",
            &nats_url,
            "--agents",
            "0",
            "--external-planner",
            "--metrics-listen",
            &metrics["up"],
            "--data-dir",
            data.path().to_str().unwrap(),
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otel.clone())],
        logs.path(),
    )];
    procs.push(spawn(
        "planner",
        &[
            "planner",
            "--nats-url",
            &nats_url,
            "--llm-base-url",
            &llm.base_url(),
            "--llm-model",
            PLANNER_MODEL,
            "--metrics-listen",
            &metrics["planner"],
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otel.clone())],
        logs.path(),
    ));
    procs.push(spawn(
        "agent",
        &[
            "agent",
            "--nats-url",
            &nats_url,
            "--agent-id",
            "obs-1",
            "--tools",
            "fs.write,fs.read",
            "--workspace",
            workspace.path().to_str().unwrap(),
            "--llm-base-url",
            &llm.base_url(),
            "--llm-model",
            AGENT_MODEL,
            "--heartbeat-ms",
            "500",
            "--metrics-listen",
            &metrics["agent"],
        ],
        &[("OTEL_EXPORTER_OTLP_ENDPOINT", otel)],
        logs.path(),
    ));
    wait_for("the agent to register", Duration::from_secs(60), || {
        let out = hermes(&["agents", "--server", &server], &[]);
        out.status.success() && text(&out).contains("obs-1")
    });
    let traceparent = format!("00-{TRACE_ID}-{CLIENT_SPAN}-01");
    let submit = hermes(
        &["submit", "Save my notes and read the secret file", "--watch", "--server", &server],
        &[("TRACEPARENT", &traceparent)],
    );
    assert!(
        submit.status.success(),
        "{}\n{}",
        text(&submit),
        procs.iter().map(Proc::logs).collect::<String>()
    );
    let goal_id = text(&submit)
        .split_whitespace()
        .find(|w| w.starts_with("g-"))
        .map(str::to_owned)
        .unwrap_or_else(|| panic!("no goal id in {}", text(&submit)));
    let run = Run {
        _nats: nats,
        nats_url,
        runtime,
        receiver,
        llm,
        procs,
        server,
        workspace,
        logs,
        metrics: metrics.into_iter().collect(),
        goal_id,
        submit,
    };
    // The secrets really went through the system, or the secret checks below prove nothing.
    let notes = std::fs::read_to_string(run.workspace.path().join("notes.txt")).unwrap();
    assert!(notes.contains(ARGS_CANARY));
    let requests = serde_json::to_string(&run.llm.requests_for(AGENT_MODEL)).unwrap();
    assert!(requests.contains(OUTPUT_CANARY), "the model saw the file it read");
    assert_eq!(run.llm.remaining(AGENT_MODEL), 0);
    run
}

impl Run {
    /// Waits until the spans of every stage have arrived (the exporters batch every 100 ms).
    fn spans(&self) -> Vec<Span> {
        let wanted = [
            "SubmitGoal",
            "plan",
            "chat planner-m",
            "apply_plan",
            "dispatch agent.run",
            "task agent.run",
            "execute_tool fs.write",
            "execute_tool fs.read",
            "chat agent-m",
            "apply_results",
        ];
        let mut missing = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            let spans = self.receiver.spans.lock().unwrap().clone();
            let names: HashSet<&str> = spans.iter().map(|s| s.name.as_str()).collect();
            missing = wanted.iter().filter(|w| !names.contains(*w)).copied().collect();
            if missing.is_empty() {
                // One more batch interval for stragglers.
                std::thread::sleep(Duration::from_millis(500));
                return self.receiver.spans.lock().unwrap().clone();
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        panic!("spans never arrived: {missing:?}");
    }

    /// Every message in a stream, as raw bytes.
    fn stream_messages(&self, stream: &str) -> Vec<Vec<u8>> {
        let url = self.nats_url.clone();
        let stream = stream.to_owned();
        self.runtime.block_on(async move {
            let client = async_nats::connect(url).await.unwrap();
            let js = async_nats::jetstream::new(client);
            let mut stream = js.get_stream(&stream).await.unwrap();
            let info = stream.info().await.unwrap().state.clone();
            let mut out = Vec::new();
            for seq in info.first_sequence..=info.last_sequence {
                if let Ok(msg) = stream.get_raw_message(seq).await {
                    out.push(msg.payload.to_vec());
                }
            }
            out
        })
    }
}

#[test]
fn one_goal_is_one_trace_across_every_service() {
    let run = run_goal();
    let spans = run.spans();
    let by_id: HashMap<&str, &Span> = spans.iter().map(|s| (s.span_id.as_str(), s)).collect();

    // All spans share the client's trace id.
    let foreign: Vec<_> = spans.iter().filter(|s| s.trace_id != TRACE_ID).map(|s| &s.name).collect();
    assert!(foreign.is_empty(), "spans outside the goal's trace: {foreign:?}");

    // One tree: a single root, the SubmitGoal span whose parent is the client's span, and every
    // other span reaches it through spans that were exported.
    let roots: Vec<&Span> = spans.iter().filter(|s| !by_id.contains_key(s.parent.as_str())).collect();
    assert_eq!(roots.len(), 1, "roots: {:?}", roots.iter().map(|s| &s.name).collect::<Vec<_>>());
    assert_eq!(roots[0].name, "SubmitGoal");
    assert_eq!(roots[0].parent, CLIENT_SPAN);
    let ancestry = |span: &Span| -> Vec<String> {
        let mut names = vec![span.name.clone()];
        let mut at = span;
        while let Some(parent) = by_id.get(at.parent.as_str()) {
            names.push(parent.name.clone());
            at = parent;
            assert!(names.len() < 64, "a cycle in the parent links");
        }
        names
    };
    // The chain the issue names: SubmitGoal → plan → dispatch node → agent task → tool / LLM call.
    for leaf in ["execute_tool fs.read", "chat agent-m"] {
        let span = spans.iter().find(|s| s.name == leaf).unwrap();
        let chain = ancestry(span);
        let expected = ["task agent.run", "dispatch agent.run", "apply_plan", "plan", "SubmitGoal"];
        let mut at = 0;
        for name in &chain {
            if at < expected.len() && name == expected[at] {
                at += 1;
            }
        }
        assert_eq!(at, expected.len(), "{leaf} descends from {chain:?}");
    }
    // The result was applied under the agent's task span.
    let applied = spans.iter().find(|s| s.name == "apply_results").unwrap();
    assert!(ancestry(applied).contains(&"task agent.run".to_owned()), "{:?}", ancestry(applied));

    // Each service exported its own part.
    let services: HashMap<&str, HashSet<&str>> = spans.iter().fold(HashMap::new(), |mut acc, s| {
        acc.entry(s.name.as_str()).or_default().insert(s.service.as_str());
        acc
    });
    assert_eq!(services["SubmitGoal"], HashSet::from(["hermes"]));
    assert_eq!(services["plan"], HashSet::from(["hermes-planner"]));
    assert_eq!(services["chat planner-m"], HashSet::from(["hermes-planner"]));
    assert_eq!(services["task agent.run"], HashSet::from(["hermes-agent"]));
    assert_eq!(services["execute_tool fs.write"], HashSet::from(["hermes-agent"]));

    // GenAI attributes on model calls; the agent's three calls add up to what the model reported.
    let chats: Vec<&Span> = spans.iter().filter(|s| s.name == "chat agent-m").collect();
    assert_eq!(chats.len(), 3);
    let sum = |key: &str| chats.iter().map(|s| s.attributes[key].parse::<u64>().unwrap()).sum::<u64>();
    assert_eq!(sum("gen_ai.usage.input_tokens"), 11 + 13 + 17);
    assert_eq!(sum("gen_ai.usage.output_tokens"), 3 + 4 + 5);
    for chat in &chats {
        assert_eq!(chat.attributes["gen_ai.provider.name"], "openai");
        assert_eq!(chat.attributes["gen_ai.request.model"], AGENT_MODEL);
        assert_eq!(chat.attributes["gen_ai.operation.name"], "chat");
        assert!(["tool_calls", "stop"].contains(&chat.attributes["gen_ai.response.finish_reasons"].as_str()));
    }
    let planner_chat = spans.iter().find(|s| s.name == "chat planner-m").unwrap();
    assert_eq!(planner_chat.attributes["gen_ai.usage.input_tokens"], "100");
    // Tool spans carry name, status and duration.
    let tool = spans.iter().find(|s| s.name == "execute_tool fs.read").unwrap();
    assert_eq!(tool.attributes["gen_ai.tool.name"], "fs.read");
    assert_eq!(tool.attributes["hermes.tool.status"], "ok");
    assert!(tool.attributes.contains_key("hermes.tool.duration_ms"));

    // `hermes trace` tells the same story from the events, without a tracing backend.
    let out = hermes(&["trace", &run.goal_id, "--server", &run.server], &[]);
    let timeline = text(&out);
    assert!(out.status.success(), "{timeline}");
    assert!(timeline.contains("COMPLETED") && timeline.contains("planning"), "{timeline}");
    assert!(timeline.contains("dispatched  agent.run attempt 1 -> obs-1"), "{timeline}");
    assert!(timeline.contains("tool fs.write step 1: ok"), "{timeline}");
    assert!(timeline.contains("tool fs.read step 2: ok"), "{timeline}");
    let node = timeline.lines().find(|l| l.starts_with("notes ")).expect(&timeline);
    assert!(node.contains("SUCCEEDED") && node.contains("obs-1") && node.contains("41/12"), "{node}");
}

#[test]
fn secrets_in_tool_arguments_and_outputs_reach_no_log_span_event_or_dead_letter() {
    let run = run_goal();
    let _ = run.spans();
    let canaries = [ARGS_CANARY, OUTPUT_CANARY];
    let check = |sink: &str, text: &str| {
        for canary in canaries {
            assert!(!text.contains(canary), "{canary} leaked into {sink}");
        }
    };
    // Logs, at debug level, of every process and of the client.
    for proc in &run.procs {
        let logs = proc.logs();
        assert!(logs.contains("\"goal_id\""), "JSON log lines with goal ids: {}", proc.log.display());
        check(&proc.log.display().to_string(), &logs);
    }
    check("the submit output", &text(&run.submit));
    // Every exported span, attributes and events included.
    check("exported spans", &run.receiver.raw.lock().unwrap().join("\n"));
    let tool_span =
        run.receiver.spans.lock().unwrap().iter().find(|s| s.name == "execute_tool fs.write").cloned();
    let args = &tool_span.expect("the write was traced").attributes["hermes.tool.arguments"];
    assert!(args.contains("notes.txt") && args.contains("api_key=[REDACTED]\""), "{args}");
    // Every event of every goal, and every dead letter.
    let topology = hermes_core::Topology::default();
    let events = run.stream_messages(&topology.events_stream());
    let decoded: usize = events.iter().map(|m| hermes_core::events::decode(m).map_or(0, |e| e.len())).sum();
    assert!(decoded >= 6, "the goal's events are there to check");
    for (i, event) in events.iter().enumerate() {
        check(&format!("event {i}"), &String::from_utf8_lossy(event));
    }
    for (i, letter) in run.stream_messages(&topology.dlq_stream()).iter().enumerate() {
        check(&format!("dead letter {i}"), &String::from_utf8_lossy(letter));
    }
    // The JSON log lines carry the goal's fields.
    let agent_logs = run.procs[2].logs();
    let line = agent_logs
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|l| l["event"] == "task_succeeded")
        .expect("a task_succeeded line");
    assert_eq!(line["goal_id"], run.goal_id.as_str());
    assert_eq!(line["node_id"], "notes");
    assert_eq!(line["agent"], "obs-1");
    assert_eq!(line["trace_id"], TRACE_ID);
    let _ = &run.logs;
}

#[test]
fn metrics_endpoints_count_what_the_goal_did() {
    let run = run_goal();
    let up = scrape(&run.metrics["up"]);
    let planner = scrape(&run.metrics["planner"]);
    let agent = scrape(&run.metrics["agent"]);
    let get = |s: &str, name: &str, labels: &[(&str, &str)]| {
        series(s, name, labels).unwrap_or_else(|| panic!("{name}{labels:?} missing:\n{s}"))
    };
    // Dispatcher: one goal accepted and completed, one node attempt succeeded.
    assert_eq!(get(&up, "hermes_goals_total", &[("status", "accepted")]), 1.0);
    assert_eq!(get(&up, "hermes_goals_total", &[("status", "completed")]), 1.0);
    assert_eq!(
        get(
            &up,
            "hermes_node_duration_seconds_count",
            &[("task_type", "agent.run"), ("status", "succeeded")]
        ),
        1.0
    );
    assert_eq!(series(&up, "hermes_task_retries_total", &[]), None, "nothing was retried");
    // Registry: the agent is online for each of its task types.
    for task_type in ["agent.run", "fs.read", "fs.write"] {
        assert_eq!(get(&up, "hermes_agents_online", &[("task_type", task_type)]), 1.0);
    }
    assert_eq!(get(&up, "hermes_pool_agents", &[("pool", "default")]), 1.0);
    // The dispatcher reads queue depth from the server every few seconds: the agent's directed
    // consumer and the pool consumers show up, with nothing left waiting.
    wait_for("queue depth series", Duration::from_secs(10), || {
        series(&scrape(&run.metrics["up"]), "hermes_queue_pending", &[("consumer", "obs-1")]).is_some()
    });
    let up = scrape(&run.metrics["up"]);
    assert_eq!(get(&up, "hermes_queue_pending", &[("consumer", "obs-1"), ("task_type", "*")]), 0.0);
    assert_eq!(get(&up, "hermes_queue_ack_pending", &[("consumer", "obs-1")]), 0.0);
    // Planner: one model call with the tokens the model reported.
    let planner_labels = [("model", PLANNER_MODEL), ("direction", "input")];
    assert_eq!(get(&planner, "hermes_llm_tokens_total", &planner_labels), 100.0);
    assert_eq!(get(&planner, "hermes_llm_calls_total", &[("model", PLANNER_MODEL), ("outcome", "ok")]), 1.0);
    // Agent: three model calls, two tool calls, one task, nothing left in flight.
    assert_eq!(get(&agent, "hermes_llm_calls_total", &[("model", AGENT_MODEL), ("outcome", "ok")]), 3.0);
    assert_eq!(
        get(&agent, "hermes_llm_tokens_total", &[("model", AGENT_MODEL), ("direction", "input")]),
        41.0
    );
    assert_eq!(
        get(&agent, "hermes_llm_tokens_total", &[("model", AGENT_MODEL), ("direction", "output")]),
        12.0
    );
    for tool in ["fs.write", "fs.read"] {
        assert_eq!(get(&agent, "hermes_tool_calls_total", &[("tool", tool), ("outcome", "ok")]), 1.0);
    }
    assert_eq!(
        get(&agent, "hermes_tasks_total", &[("task_type", "agent.run"), ("status", "succeeded")]),
        1.0
    );
    assert_eq!(
        get(
            &agent,
            "hermes_task_duration_seconds_count",
            &[("task_type", "agent.run"), ("status", "succeeded")]
        ),
        1.0
    );
    assert_eq!(get(&agent, "hermes_tasks_in_flight", &[("agent", "obs-1")]), 0.0);
    // `hermes get` shows the goal's token use.
    let out = hermes(&["get", &run.goal_id, "--server", &run.server], &[]);
    assert!(text(&out).contains("tokens  "), "{}", text(&out));
}

/// An agent joining a pool whose consumers another agent created with another ack wait binds to
/// them as they are, and says so once at start, naming what is in effect.
#[test]
fn an_agent_binding_a_pool_created_with_other_settings_warns_once() {
    let nats = hermes_test_util::NatsServer::start();
    let logs = tempfile::tempdir().unwrap();
    let workspace = tempfile::tempdir().unwrap();
    let agent = |id: &str, ack_wait: &str| {
        let args = [
            "agent",
            "--nats-url",
            &nats.url(),
            "--agent-id",
            id,
            "--tools",
            "math.evaluate",
            "--workspace",
            workspace.path().to_str().unwrap(),
            "--agent-ack-wait-secs",
            ack_wait,
        ];
        spawn(id, &args, &[], logs.path())
    };
    let first = agent("first", "30");
    wait_for("the first agent to serve", Duration::from_secs(60), || first.logs().contains("agent serving"));
    assert!(!first.logs().contains("exist with other settings"), "{}", first.logs());
    let second = agent("second", "7");
    let warned = |proc: &Proc| proc.logs().matches("exist with other settings than its own").count();
    wait_for("the second agent's warning", Duration::from_secs(60), || warned(&second) > 0);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(warned(&second), 1, "{}", second.logs());
    assert!(second.logs().contains("ack_wait: 30s (wanted 7s)"), "{}", second.logs());
}
