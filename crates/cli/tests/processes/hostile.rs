//! Hostile input against a real stack: `hermes up` as its own process (with the fault-injection
//! tools on), a real nats-server, a real gRPC client. Every case must end in a typed error; the
//! process must stay up with its RSS growth under [`RSS_BOUND_BYTES`]; and a well-formed goal
//! from another client must still complete while the cases run.
//!
//! Also here: the crash quarantine (a task that aborts its agent twice lands in the DLQ), a tool
//! burning 60 s of CPU beside a single-node goal, and `kill -9` of `hermes up` with its own
//! nats-server.

use crate::repo_root;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::{
    ApproveToolCallRequest, GetGoalRequest, GoalSpec, GoalStatus, SubmitGoalRequest, TaskNode, TaskPlan,
};
use hermes_test_util::process::HermesUp;
use serde_json::{Value, json};
use tonic::transport::Channel;

/// How much the stack's resident memory may grow over the whole suite.
const RSS_BOUND_BYTES: u64 = 400 * 1024 * 1024;

/// `hermes up` with the fault-injection tools, its stderr in `data_dir/../stderr.log`.
fn start_up(nats_url: Option<&str>, data_dir: &Path, agents: &Path) -> HermesUp {
    let mut builder = HermesUp::builder(env!("CARGO_BIN_EXE_hermes"), data_dir)
        .arg("--agents-config")
        .arg(agents)
        .env("HERMES_TEST_TOOLS", "1")
        .env("HERMES_LLM_PROVIDER", "none")
        .current_dir(repo_root())
        .stderr_file(&stderr_log(data_dir));
    if let Some(url) = nats_url {
        builder = builder.nats_url(url);
    }
    builder.start()
}

fn stderr_log(data_dir: &Path) -> PathBuf {
    data_dir.with_extension("stderr.log")
}

/// How many times the supervisor reported a crash of its worker process.
fn crashes_reported(data_dir: &Path) -> usize {
    std::fs::read_to_string(stderr_log(data_dir))
        .unwrap_or_default()
        .matches("worker process crashed")
        .count()
}

fn agents_config(dir: &Path, workspace: &Path, _http_port: u16) -> PathBuf {
    let path = dir.join("agents.toml");
    let text = format!(
        r#"[defaults]
workspace = "{ws}"
max_concurrency = 16
ack_wait_secs = 2
http_allow = ["localhost:*", "*.test"]

[[agent]]
id = "hostile-1"

[agent.code_python]
confirm = false
timeout_secs = 5
memory_mb = 256

[[agent]]
id = "hostile-2"
"#,
        ws = workspace.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

async fn client(addr: &str) -> DispatcherClient<Channel> {
    DispatcherClient::connect(format!("http://{addr}")).await.unwrap()
}

fn one_node(task_type: &str, inputs: Value) -> TaskPlan {
    TaskPlan {
        nodes: vec![TaskNode {
            id: "n".into(),
            task_type: task_type.into(),
            inputs_json: inputs.to_string(),
            ..Default::default()
        }],
        ..Default::default()
    }
}

/// How a case may end: a refused submit or a failed goal, with one of these codes.
struct Case {
    name: String,
    plan: TaskPlan,
    codes: &'static [&'static str],
}

fn case(name: impl Into<String>, plan: TaskPlan, codes: &'static [&'static str]) -> Case {
    Case { name: name.into(), plan, codes }
}

const BAD_INPUT: &[&str] = &["INVALID_ARGUMENT", "PLAN_INVALID", "LIMIT_EXCEEDED", "TOOL_ERROR"];
const REFUSED: &[&str] = &["DENIED", "INVALID_ARGUMENT", "PLAN_INVALID"];

/// Submits a plan and waits for its end; returns the submit's or the goal's error code.
async fn outcome(client: &mut DispatcherClient<Channel>, plan: TaskPlan) -> Result<Value, (String, String)> {
    let spec = GoalSpec { plan: Some(plan), ..Default::default() };
    let goal_id = match client.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await {
        Ok(r) => r.into_inner().goal_id,
        Err(status) => {
            let code = status.message().split(':').next().unwrap_or_default().to_owned();
            return Err((code, status.message().to_owned()));
        }
    };
    wait_goal(client, &goal_id, Duration::from_secs(60)).await
}

async fn wait_goal(
    client: &mut DispatcherClient<Channel>,
    goal_id: &str,
    limit: Duration,
) -> Result<Value, (String, String)> {
    let deadline = Instant::now() + limit;
    loop {
        let goal = client.get_goal(GetGoalRequest { goal_id: goal_id.into() }).await.unwrap().into_inner();
        if goal.status == GoalStatus::Completed as i32 {
            return Ok(serde_json::from_str(&goal.output_json).unwrap_or(Value::Null));
        }
        if goal.status == GoalStatus::Failed as i32 || goal.status == GoalStatus::Cancelled as i32 {
            let error = goal.error.unwrap_or_default();
            return Err((error.code, error.message));
        }
        assert!(Instant::now() < deadline, "goal {goal_id} did not end within {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A loopback HTTP server that answers `/ok` and redirects `/hop` to another port.
fn http_server() -> u16 {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            let mut buf = [0u8; 2048];
            let n = stream.read(&mut buf).unwrap_or(0);
            let request = String::from_utf8_lossy(&buf[..n]);
            let reply = if request.starts_with("GET /hop") {
                "HTTP/1.1 302 Found\r\nLocation: http://127.0.0.1:9/x\r\nContent-Length: 0\r\n\r\n".to_owned()
            } else {
                "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok".to_owned()
            };
            let _ = stream.write_all(reply.as_bytes());
        }
    });
    port
}

fn workspace_files(ws: &Path) {
    std::fs::write(ws.join("data.csv"), "k,v\na,1\nb,2\n").unwrap();
    std::fs::write(ws.join("one-mb.txt"), "y".repeat(1024 * 1024)).unwrap();
    std::fs::write(ws.join("sixty-kb.txt"), "z".repeat(60 * 1024)).unwrap();
    // Sparse: 300 MB on paper, nothing on disk.
    std::fs::File::create(ws.join("huge.bin")).unwrap().set_len(300 * 1024 * 1024).unwrap();
    std::fs::create_dir_all(ws.join("dir")).unwrap();
    assert!(Command::new("mkfifo").arg(ws.join("fifo")).status().unwrap().success());
    let socket = std::os::unix::net::UnixListener::bind(ws.join("sock")).unwrap();
    std::mem::forget(socket);
    std::os::unix::fs::symlink("/dev/zero", ws.join("zero")).unwrap();
    std::os::unix::fs::symlink("/etc/shadow", ws.join("shadow")).unwrap();
}

fn cases(http_port: u16, foreign_artifact: &str) -> Vec<Case> {
    let mut out = Vec::new();
    // Expression bombs.
    for depth in [65, 100, 1_000, 10_000, 30_000] {
        let e = format!("{}1{}", "(".repeat(depth), ")".repeat(depth));
        out.push(case(
            format!("nested parens {depth}"),
            one_node("math.evaluate", json!({"expression": e})),
            BAD_INPUT,
        ));
        let e = format!("{}1", "(-".repeat(depth));
        out.push(case(
            format!("unclosed unary {depth}"),
            one_node("math.evaluate", json!({"expression": e})),
            BAD_INPUT,
        ));
    }
    for terms in [2_050, 5_000, 30_000] {
        for op in ["+", "*", "^", "-", "&&"] {
            let e = vec!["1"; terms].join(op);
            out.push(case(
                format!("{terms} terms {op}"),
                one_node("math.evaluate", json!({"expression": e})),
                BAD_INPUT,
            ));
        }
    }
    for n in [100, 1000, 5000] {
        let e = format!("{}1{}", "math::abs(".repeat(n), ")".repeat(n));
        out.push(case(
            format!("nested calls {n}"),
            one_node("math.evaluate", json!({"expression": e})),
            BAD_INPUT,
        ));
    }
    let vars: serde_json::Map<String, Value> = (0..2000).map(|i| (format!("v{i}"), json!(1.0))).collect();
    out.push(case(
        "2000 variables",
        one_node("math.evaluate", json!({"expression": "v1", "variables": vars})),
        BAD_INPUT,
    ));
    for e in ["1e308*1e308", "0/0", "1/0.0", "\"s\" + 1", "x + 1", "((((", "))))", "1 +", "", "\u{0}"] {
        out.push(case(
            format!("bad expression {e:?}"),
            one_node("math.evaluate", json!({"expression": e})),
            BAD_INPUT,
        ));
    }
    out.push(case(
        "60 KB expression",
        one_node("math.evaluate", json!({"expression": "1".repeat(60_000)})),
        BAD_INPUT,
    ));
    // Template bombs.
    let templates = [
        r#"{% set a = "x" * 100000000 %}{% set b = a ~ a %}{% set c = b ~ b %}{{ c | length }}"#.to_owned(),
        r#"{% set a = "x" * 99999999 %}{{ a ~ a ~ a ~ a }}"#.to_owned(),
        r#"{% set ns = namespace(a="x") %}{% for i in range(64) %}{% set ns.a = ns.a ~ ns.a %}{% endfor %}{{ ns.a | length }}"#.to_owned(),
        r#"{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}"#.to_owned(),
        r#"{% for i in range(10000000) %}{{ i }}{% endfor %}"#.to_owned(),
        r#"{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"#.to_owned(),
        r#"{{ "x" * 50000000 }}"#.to_owned(),
        r#"{{ ("ab" * 40000000) | replace("a", "aaaaaaaaaa") | length }}"#.to_owned(),
        r#"{{ range(100000000) | list | join(",") | length }}"#.to_owned(),
        r#"{{ ([1] * 100000000) | join(",") | length }}"#.to_owned(),
        r#"{% set a = "x" * 60000000 %}{{ [a, a, a, a, a] | join("") | length }}"#.to_owned(),
        format!("{{{{ {}1{} }}}}", "(".repeat(5000), ")".repeat(5000)),
        format!("{}x{}", "{% if true %}".repeat(3000), "{% endif %}".repeat(3000)),
        "x".repeat(70 * 1024),
        "{{ undefined_thing }}".to_owned(),
        "{% for %}".to_owned(),
        "{{ 1 // 0 }}".to_owned(),
        r#"{% set a = "a" * 90000000 %}{{ "%s%s%s" | format(a, a, a) | length }}"#.to_owned(),
    ];
    for (i, t) in templates.into_iter().enumerate() {
        out.push(case(
            format!("template bomb {i}"),
            one_node("text.template", json!({"template": t})),
            BAD_INPUT,
        ));
    }
    for n in [30, 40, 50, 60, 64] {
        let t = format!(
            r#"{{% set ns = namespace(a="xy") %}}{{% for i in range({n}) %}}{{% set ns.a = ns.a ~ ns.a %}}{{% endfor %}}{{{{ ns.a }}}}"#
        );
        out.push(case(format!("doubling {n}"), one_node("text.template", json!({"template": t})), BAD_INPUT));
    }
    // $ref amplification: to a 1 MB artifact, and to a 60 KB inline output.
    for (file, refs) in
        [("one-mb.txt", 150), ("one-mb.txt", 120), ("sixty-kb.txt", 150), ("sixty-kb.txt", 300)]
    {
        let values: serde_json::Map<String, Value> =
            (0..refs).map(|i| (format!("v{i}"), json!({"$ref": "read.text"}))).collect();
        let plan = TaskPlan {
            nodes: vec![
                TaskNode {
                    id: "read".into(),
                    task_type: "fs.read".into(),
                    inputs_json: json!({"path": file}).to_string(),
                    ..Default::default()
                },
                TaskNode {
                    id: "amp".into(),
                    task_type: "text.template".into(),
                    inputs_json: json!({"template": "{{ v0 | length }}", "values": values}).to_string(),
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        out.push(case(format!("{refs} refs to {file}"), plan, BAD_INPUT));
    }
    // Huge and special files.
    for path in [
        "fifo",
        "sock",
        "dir",
        "huge.bin",
        "zero",
        "shadow",
        "/etc/shadow",
        "../etc/passwd",
        "/proc/self/mem",
        "nope.txt",
        "%2e%2e/x",
        "a\u{0}b",
    ] {
        out.push(case(format!("fs.read {path:?}"), one_node("fs.read", json!({"path": path})), BAD_INPUT));
    }
    for path in ["fifo", "huge.bin", "sock", "zero"] {
        out.push(case(
            format!("table.aggregate {path}"),
            one_node("table.aggregate", json!({"path": path, "op": "count"})),
            BAD_INPUT,
        ));
    }
    // Hand-written artifact stubs, of another goal or made up, anywhere in the inputs.
    let stubs = [
        json!({"$artifact": foreign_artifact}),
        json!({"$artifact": foreign_artifact, "path": ["text"]}),
        json!({"$artifact": foreign_artifact, "size_bytes": 1, "content_type": "x", "preview": ""}),
        json!({"$artifact": "art-00000000000000000000000000000000"}),
        json!({"$artifact": "../etc/passwd"}),
        json!({"$artifact": foreign_artifact, "extra": true}),
        json!([{"$artifact": foreign_artifact}]),
        json!({"deep": {"deeper": [{"$artifact": foreign_artifact}]}}),
    ];
    for (i, stub) in stubs.iter().enumerate() {
        out.push(case(
            format!("stub in template values {i}"),
            one_node("text.template", json!({"template": "{{ v }}", "values": {"v": stub}})),
            REFUSED,
        ));
        out.push(case(
            format!("stub as write content {i}"),
            one_node("fs.write", json!({"path": "leak.txt", "content": stub})),
            REFUSED,
        ));
    }
    // SSRF: names, address forms and redirects.
    let urls = [
        format!("http://localhost:{http_port}/ok"),
        "http://localhost/".to_owned(),
        format!("http://127.0.0.1:{}/ok", http_port.wrapping_add(1).max(1)),
        format!("http://127.0.0.1:{http_port}/hop"),
        "http://127.0.0.1/".to_owned(),
        "http://2130706433/".to_owned(),
        "http://0x7f000001/".to_owned(),
        "http://0177.0.0.1/".to_owned(),
        "http://127.1/".to_owned(),
        "http://[::1]/".to_owned(),
        format!("http://[::1]:{http_port}/"),
        "http://[::ffff:127.0.0.1]/".to_owned(),
        "http://[::ffff:7f00:1]/".to_owned(),
        "http://169.254.169.254/latest/meta-data/".to_owned(),
        "http://[fd00:ec2::254]/".to_owned(),
        "http://10.0.0.1/".to_owned(),
        "http://192.168.1.1/".to_owned(),
        "http://172.16.0.1/".to_owned(),
        "http://100.64.0.1/".to_owned(),
        "http://0.0.0.0/".to_owned(),
        "http://[::]/".to_owned(),
        "http://[fe80::1]/".to_owned(),
        "http://[64:ff9b::7f00:1]/".to_owned(),
        "http://[2002:7f00:1::]/".to_owned(),
        "file:///etc/passwd".to_owned(),
        "gopher://localhost/".to_owned(),
        format!("http://user:pw@localhost:{http_port}/ok"),
        "http://evil.example.com/".to_owned(),
        "not a url".to_owned(),
        "http://localhost.:1/".to_owned(),
    ];
    for url in urls {
        out.push(case(
            format!("http.fetch {url}"),
            one_node("http.fetch", json!({"url": url})),
            &["DENIED", "INVALID_ARGUMENT", "PLAN_INVALID"],
        ));
    }
    // Sandbox escapes in code.python: each prints ESCAPED only if it got out.
    let escapes = [
        "print('ESCAPED' if open('/etc/shadow').read() else '')",
        "open('/tmp/hermes-escape-marker','w').write('x')",
        "open('/etc/hermes-escape','w').write('x'); print('ESCAPED')",
        "import socket; s=socket.socket(socket.AF_UNIX); s.connect('/var/run/docker.sock'); print('ESCAPED')",
        &format!(
            "import socket; socket.create_connection(('127.0.0.1', {http_port}), timeout=2); print('ESCAPED')"
        ),
        "import os\nfor i in range(3):\n    if os.fork() == 0:\n        b = bytearray(200*1024*1024)\n        os._exit(0)\nprint('ESCAPED')",
        "import os\nfor i in range(40):\n    if os.fork() == 0:\n        os.setsid(); import time; time.sleep(100); os._exit(0)\nprint('ESCAPED')",
        "import os\nwhile True:\n    os.fork()",
        "b = bytearray(2*1024*1024*1024); print('ESCAPED')",
        "import subprocess; subprocess.Popen(['sleep','100']); print('ESCAPED')",
        "import os; print('ESCAPED' if os.getuid() == 0 else '')",
    ];
    for (i, code) in escapes.iter().enumerate() {
        out.push(case(
            format!("sandbox escape {i}"),
            one_node("code.python", json!({"code": code})),
            &["TOOL_ERROR", "TIMEOUT", "FAILED_PRECONDITION", "LIMIT_EXCEEDED", "OK-WITHOUT-ESCAPE"],
        ));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn hostile_inputs_end_in_typed_errors_and_hurt_no_one_else() {
    let nats = hermes_test_util::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    workspace_files(&ws);
    let http_port = http_server();
    let agents = agents_config(dir.path(), &ws, http_port);
    let data = dir.path().join("data");
    let mut up = start_up(Some(&nats.url()), &data, &agents);
    let mut attacker = client(&up.grpc).await;

    // Another goal's artifact, for the stub cases.
    let plan = one_node("fs.read", json!({"path": "one-mb.txt"}));
    let spec = GoalSpec { plan: Some(plan), ..Default::default() };
    let victim =
        attacker.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await.unwrap().into_inner().goal_id;
    wait_goal(&mut attacker, &victim, Duration::from_secs(30)).await.unwrap();
    let goal = attacker.get_goal(GetGoalRequest { goal_id: victim.clone() }).await.unwrap().into_inner();
    let foreign = goal.nodes[0].memory_ref.clone();
    assert!(foreign.starts_with("art-"), "{:?}", goal.nodes[0]);

    let baseline = up.rss();
    let cases = cases(http_port, &foreign);
    let bad_ids = bad_id_cases();
    assert!(cases.len() + bad_ids.len() >= 200, "{} cases", cases.len() + bad_ids.len());

    // The other client keeps submitting well-formed goals while the cases run.
    let grpc = up.grpc.clone();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop_bystander = stop.clone();
    let bystander = tokio::spawn(async move {
        let mut bystander = client(&grpc).await;
        let mut done = 0u32;
        let mut slowest = Duration::ZERO;
        while !stop_bystander.load(std::sync::atomic::Ordering::Relaxed) {
            let started = Instant::now();
            let plan = one_node("math.evaluate", json!({"expression": "6 * 7"}));
            let out = outcome(&mut bystander, plan).await.expect("the well-formed goal completes");
            assert_eq!(out["value"], 42.0);
            slowest = slowest.max(started.elapsed());
            done += 1;
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (done, slowest)
    });

    let mut failures = Vec::new();
    for chunk in cases.chunks(12) {
        let runs = chunk.iter().map(|c| {
            let mut client = attacker.clone();
            let plan = c.plan.clone();
            async move { outcome(&mut client, plan).await }
        });
        let results = futures::future::join_all(runs).await;
        for (c, result) in chunk.iter().zip(results) {
            match result {
                Err((code, message)) if c.codes.contains(&code.as_str()) => {
                    assert!(!message.is_empty(), "{}: an empty message", c.name);
                }
                Ok(output) if c.codes.contains(&"OK-WITHOUT-ESCAPE") => {
                    let printed = output["stdout"].as_str().unwrap_or_default().to_owned();
                    if printed.contains("ESCAPED") {
                        failures.push(format!("{}: escaped the sandbox: {printed}", c.name));
                    }
                }
                other => failures.push(format!("{}: expected one of {:?}, got {other:?}", c.name, c.codes)),
            }
        }
        let names: Vec<_> = chunk.iter().map(|c| &c.name).collect();
        assert!(up.alive(), "hermes up died during {names:?}");
        assert_eq!(crashes_reported(&data), 0, "the worker process crashed during {names:?}");
        let grown = up.rss().saturating_sub(baseline);
        assert!(grown < RSS_BOUND_BYTES, "RSS grew by {grown} bytes (bound {RSS_BOUND_BYTES})");
    }
    for (name, request) in bad_ids {
        let mut client = attacker.clone();
        let status = match request {
            BadId::Approve(r) => client.approve_tool_call(r).await.err(),
            BadId::Get(r) => client.get_goal(r).await.err(),
            BadId::Cancel(r) => client.cancel_goal(r).await.err(),
            BadId::Submit(r) => client.submit_goal(r).await.err(),
        };
        match status {
            Some(s)
                if s.code() == tonic::Code::InvalidArgument
                    && s.message().starts_with("INVALID_ARGUMENT") => {}
            other => failures.push(format!("{name}: expected INVALID_ARGUMENT, got {other:?}")),
        }
    }
    assert!(
        !std::path::Path::new("/tmp/hermes-escape-marker").exists(),
        "a snippet wrote outside its sandbox"
    );
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (done, slowest) = bystander.await.unwrap();
    assert!(done >= 5, "the well-formed goals kept completing ({done})");
    assert!(slowest < Duration::from_secs(10), "a well-formed goal took {slowest:?}");
    assert!(up.alive(), "hermes up died");
    assert!(failures.is_empty(), "{} of the cases failed:\n{}", failures.len(), failures.join("\n"));
}

enum BadId {
    Approve(ApproveToolCallRequest),
    Get(GetGoalRequest),
    Cancel(hermes_proto::CancelGoalRequest),
    Submit(SubmitGoalRequest),
}

fn bad_id_cases() -> Vec<(String, BadId)> {
    let bad =
        ["../a", "a..b", "a\u{0}b", "a.*", "a.>", "*", ">", "a b", "a/b", ".a", "a.", "", "a\nb", "a\tb"];
    let mut out = Vec::new();
    for id in bad {
        out.push((
            format!("approve call id {id:?}"),
            BadId::Approve(ApproveToolCallRequest {
                goal_id: "g-1".into(),
                call_id: id.into(),
                approve: true,
                note: String::new(),
            }),
        ));
        out.push((
            format!("approve goal id {id:?}"),
            BadId::Approve(ApproveToolCallRequest {
                goal_id: id.into(),
                call_id: "g-1.n.0.ab".into(),
                approve: true,
                note: String::new(),
            }),
        ));
        out.push((format!("get goal id {id:?}"), BadId::Get(GetGoalRequest { goal_id: id.into() })));
        out.push((
            format!("cancel goal id {id:?}"),
            BadId::Cancel(hermes_proto::CancelGoalRequest { goal_id: id.into(), reason: String::new() }),
        ));
        if !id.is_empty() {
            let plan = one_node("math.evaluate", json!({"expression": "1"}));
            out.push((
                format!("session id {id:?}"),
                BadId::Submit(SubmitGoalRequest {
                    spec: Some(GoalSpec { plan: Some(plan), session_id: id.into(), ..Default::default() }),
                }),
            ));
        }
    }
    for key in ["a\u{0}b", "k\nk", "\u{7}"] {
        let plan = one_node("math.evaluate", json!({"expression": "1"}));
        out.push((
            format!("idempotency key {key:?}"),
            BadId::Submit(SubmitGoalRequest {
                spec: Some(GoalSpec { plan: Some(plan), idempotency_key: key.into(), ..Default::default() }),
            }),
        ));
    }
    out
}

/// A task whose tool aborts the process is quarantined after at most two deaths, and the
/// restarted agent serves other goals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_that_crashes_its_agent_lands_in_the_dlq_after_two_deaths() {
    let nats = hermes_test_util::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let agents = agents_config(dir.path(), &ws, 1);
    let data = dir.path().join("data");
    let mut up = start_up(Some(&nats.url()), &data, &agents);
    // A task that runs to its end costs the ledger nothing: the worker tells its supervisor what
    // it runs on a pipe, and crash markers are written only after a crash.
    let mut c = client(&up.grpc).await;
    let out = outcome(&mut c, one_node("math.evaluate", json!({"expression": "1 + 1"}))).await.unwrap();
    assert_eq!(out["value"], 2.0);
    let ledger = hermes_core::topology::Topology::default().ledger_bucket();
    let js = async_nats::jetstream::new(async_nats::connect(nats.url()).await.unwrap());
    let mut ledger = js.get_stream(format!("KV_{ledger}")).await.unwrap();
    let written = ledger.info().await.unwrap().state.last_sequence;
    assert_eq!(written, 0, "a task that ran normally wrote to the ledger");
    let spec = GoalSpec {
        plan: Some(one_node("test.abort", json!({}))),
        idempotency_key: "crashes-its-agent".into(),
        ..Default::default()
    };
    // `hermes up` serves gRPC from the process the task aborts, so the abort can cut the submit's
    // answer off. A careful client retries with its idempotency key and gets the same goal.
    let deadline = Instant::now() + Duration::from_secs(60);
    let goal_id = loop {
        let submitted = match DispatcherClient::connect(format!("http://{}", up.grpc)).await {
            Ok(mut c) => c.submit_goal(SubmitGoalRequest { spec: Some(spec.clone()) }).await,
            Err(e) => Err(tonic::Status::unavailable(e.to_string())),
        };
        match submitted {
            Ok(response) => break response.into_inner().goal_id,
            Err(e)
                if Instant::now() < deadline
                    && matches!(e.code(), tonic::Code::Unknown | tonic::Code::Unavailable) =>
            {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the submit failed: {e}"),
        }
    };
    // The worker process aborts; its supervisor starts a new one, which counts the crash.
    let deadline = Instant::now() + Duration::from_secs(120);
    let failed = loop {
        assert!(
            Instant::now() < deadline,
            "the crashing task was not quarantined ({} crashes)",
            crashes_reported(&data)
        );
        assert!(up.alive(), "the supervisor died");
        if let Ok(mut c) = DispatcherClient::connect(format!("http://{}", up.grpc)).await
            && let Ok(goal) = c.get_goal(GetGoalRequest { goal_id: goal_id.clone() }).await
            && goal.get_ref().status == GoalStatus::Failed as i32
        {
            break goal.into_inner();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let deaths = crashes_reported(&data);
    assert!((1..=2).contains(&deaths), "the worker crashed {deaths} times");
    assert!(
        std::fs::read_to_string(stderr_log(&data)).unwrap_or_default().contains("with 1 task(s) in flight"),
        "the supervisor did not know the task its worker ran"
    );
    let mut c = client(&up.grpc).await;
    let error = failed.error.unwrap();
    assert_eq!(error.code, "POISON_MESSAGE", "{error:?}");
    assert!(error.message.contains("crashed its consumer"), "{}", error.message);
    let letters =
        c.list_dead_letters(hermes_proto::ListDeadLettersRequest { limit: 100 }).await.unwrap().into_inner();
    assert!(
        letters.dead_letters.iter().any(|d| d.reason.contains("crashed its consumer")),
        "{:?}",
        letters.dead_letters
    );
    let out = outcome(&mut c, one_node("math.evaluate", json!({"expression": "2 + 2"}))).await.unwrap();
    assert_eq!(out["value"], 4.0);
    assert!(up.alive());
}

/// A tool burning CPU for 60 s does not hold up another goal, is stopped at its limit, and runs
/// once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cpu_bound_tool_is_stopped_at_its_limit_and_starves_no_one() {
    let nats = hermes_test_util::NatsServer::start();
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let agents = agents_config(dir.path(), &ws, 1);
    let mut up = start_up(Some(&nats.url()), &dir.path().join("data"), &agents);
    let mut c = client(&up.grpc).await;
    // Warm up the path a single-node goal takes.
    outcome(&mut c, one_node("math.evaluate", json!({"expression": "1"}))).await.unwrap();
    let spec = GoalSpec { plan: Some(one_node("test.spin", json!({"seconds": 60}))), ..Default::default() };
    let spin = c.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await.unwrap().into_inner().goal_id;
    let started = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let mut other = client(&up.grpc).await;
    for _ in 0..5 {
        let t = Instant::now();
        let out =
            outcome(&mut other, one_node("math.evaluate", json!({"expression": "3 * 3"}))).await.unwrap();
        assert_eq!(out["value"], 9.0);
        assert!(
            t.elapsed() < Duration::from_secs(1),
            "a single-node goal took {:?} beside the spinning tool",
            t.elapsed()
        );
    }
    let (code, message) = wait_goal(&mut c, &spin, Duration::from_secs(30)).await.unwrap_err();
    assert_eq!(code, "LIMIT_EXCEEDED", "{message}");
    assert!(started.elapsed() < Duration::from_secs(15), "stopped after {:?}", started.elapsed());
    let runs = std::fs::read_to_string(ws.join("test-spin-runs.log")).unwrap();
    assert_eq!(runs.lines().count(), 1, "the tool ran {} times", runs.lines().count());
    assert!(up.alive());
}

/// `kill -9` of `hermes up` takes its own nats-server with it; a restart on the same data dir has
/// exactly one server, and a second `hermes up` on that dir is refused naming the holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_of_hermes_up_leaves_no_nats_server_behind() {
    let dir = tempfile::tempdir().unwrap();
    let ws = dir.path().join("ws");
    std::fs::create_dir_all(&ws).unwrap();
    let agents = agents_config(dir.path(), &ws, 1);
    let data = dir.path().join("data");
    let mut up = start_up(None, &data, &agents);
    let store = data.join("nats").canonicalize().unwrap();
    let servers = || nats_servers_on(&store);
    assert_eq!(servers().len(), 1, "one server at start");
    let first = servers()[0];

    // A second `hermes up` on the same dir is refused, naming the pid that holds it.
    let out = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["up", "--grpc-listen", &format!("127.0.0.1:{}", hermes_test_util::free_port())])
        .args(["--http-listen", "127.0.0.1:0", "--data-dir"])
        .arg(&data)
        .arg("--agents-config")
        .arg(&agents)
        .env_remove("HERMES_NATS_URL")
        .env("HERMES_LLM_PROVIDER", "none")
        .current_dir(repo_root())
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&out.stderr).to_string();
    assert!(!out.status.success(), "{said}");
    let holder: u32 = said
        .split("(pid ")
        .nth(1)
        .and_then(|rest| rest.split(')').next())
        .and_then(|pid| pid.parse().ok())
        .unwrap_or_else(|| panic!("no pid named: {said}"));
    assert!(
        hermes_test_util::process::tree_of(up.pid()).contains(&holder),
        "{holder} is not of the first hermes up: {said}"
    );

    up.kill9();
    let deadline = Instant::now() + Duration::from_secs(5);
    while std::path::Path::new(&format!("/proc/{first}")).exists() && !is_zombie(first) {
        assert!(Instant::now() < deadline, "nats-server {first} outlived hermes up");
        std::thread::sleep(Duration::from_millis(50));
    }
    let again = start_up(None, &data, &agents);
    assert_eq!(servers().len(), 1, "exactly one server after the restart");
    drop(again);
}

fn is_zombie(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| s.contains(") Z ")).unwrap_or(true)
}

/// Live nats-server processes serving `store`.
fn nats_servers_on(store: &Path) -> Vec<u32> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
        let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else { continue };
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        if cmdline.contains("nats-server") && cmdline.contains(&*store.to_string_lossy()) && !is_zombie(pid) {
            out.push(pid);
        }
    }
    out
}
