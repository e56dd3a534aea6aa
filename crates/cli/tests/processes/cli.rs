//! The `hermes` binary as a user runs it: `hermes up` in one process, `hermes submit --watch` in
//! another, against a real nats-server.

use crate::repo_root;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

struct Up(Child);

impl Drop for Up {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `hermes up` with `extra` flags and waits for its ready line; returns the gRPC address.
fn hermes_up_with(nats_url: &str, data_dir: &Path, extra: &[&str]) -> (Up, String) {
    let (up, grpc, _) = hermes_up_ready(nats_url, data_dir, extra);
    (up, grpc)
}

/// Starts `hermes up`; returns it, its gRPC address and its ready line.
fn hermes_up_ready(nats_url: &str, data_dir: &Path, extra: &[&str]) -> (Up, String, String) {
    let listen = format!("127.0.0.1:{}", hermes_test_util::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args([
            "up",
            "--grpc-listen",
            &listen,
            "--http-listen",
            "127.0.0.1:0",
            "--nats-url",
            nats_url,
            "--data-dir",
        ])
        .arg(data_dir)
        .args(extra)
        .current_dir(repo_root())
        // No embedded planner from the repo's .tools/models: these tests submit plans.
        .env("HERMES_LLM_PROVIDER", "none")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(line) = rx.recv_timeout(Duration::from_millis(100))
            && line.starts_with("hermes up: grpc")
        {
            return (Up(child), listen, line);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("hermes up did not become ready within 30 s");
}

/// Runs `hermes up` on `data_dir` with `extra`, unsupervised, to its end: for starts that must
/// fail.
fn hermes_up_once(data_dir: &Path, extra: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hermes"))
        .arg("up")
        .args(extra)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--grpc-listen", &format!("127.0.0.1:{}", hermes_test_util::free_port())])
        .env("HERMES_NO_SUPERVISOR", "1")
        .output()
        .unwrap()
}

fn hermes(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_hermes")).args(args).current_dir(repo_root()).output().unwrap()
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// `hermes up` serves the HTTP API and says where in its ready line; curl submits a plan file
/// and `curl -N .../events` follows the goal to its end.
#[test]
fn hermes_up_serves_http_and_curl_follows_a_goal() {
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    // The plan reads examples/data: the checkout is the workspace.
    let (_up, _grpc, ready) = hermes_up_ready(&nats.url(), data.path(), &["--workspace", "."]);
    let http = ready
        .split_whitespace()
        .skip_while(|w| *w != "http")
        .nth(1)
        .unwrap_or_else(|| panic!("the ready line names the HTTP address: {ready}"))
        .to_owned();
    let curl = |args: &[&str]| {
        let out = Command::new("curl")
            .args(["-sS", "--max-time", "60"])
            .args(args)
            .current_dir(repo_root())
            .output()
            .unwrap();
        assert!(out.status.success(), "curl {args:?}: {}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let submitted = curl(&[
        "-H",
        "Content-Type: application/yaml",
        "--data-binary",
        "@examples/plans/sales-report.yaml",
        &format!("http://{http}/v1/goals"),
    ]);
    let goal: serde_json::Value = serde_json::from_str(&submitted).unwrap();
    let id = goal["goalId"].as_str().unwrap_or_else(|| panic!("{submitted}"));
    // The stream ends after the terminal event, so curl returns.
    let events = curl(&["-N", &format!("http://{http}/v1/goals/{id}/events")]);
    assert!(events.contains("id: 1\n") || events.contains("id:1\n"), "{events}");
    assert!(events.contains("\"goalAccepted\""), "{events}");
    assert!(events.contains("\"taskSucceeded\""), "{events}");
    let last_data = events.lines().rfind(|l| l.starts_with("data:")).unwrap();
    assert!(last_data.contains("\"goalCompleted\""), "{events}");
}

/// `hermes up` with its defaults keeps goals out of the directory it was started from: its
/// agents work in `<data-dir>/workspace` (the ready line says so), and `fs.write` waits for a
/// person's approval before anything is written.
#[test]
fn hermes_up_defaults_keep_goals_out_of_the_current_dir_and_ask_before_writing() {
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_up, _grpc, ready) = hermes_up_ready(&nats.url(), data.path(), &[]);
    let workspace = data.path().join("workspace").canonicalize().expect("the default workspace is created");
    assert!(ready.contains(&format!(" workspace {} ", workspace.display())), "{ready}");
    let http = http_of(&ready);
    let curl = |args: &[&str]| {
        let out = Command::new("curl").args(["-sS", "--max-time", "30"]).args(args).output().unwrap();
        assert!(out.status.success(), "curl {args:?}: {}", text(&out));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    let name = format!("hermes-up-default-{}.txt", std::process::id());
    let plan = serde_json::json!({"plan": {"nodes": [
        {"id": "w", "task_type": "fs.write", "inputs": {"path": name, "content": "written"}}]}});
    let goal = curl(&[
        "-H",
        "Content-Type: application/json",
        "-d",
        &plan.to_string(),
        &format!("http://{http}/v1/goals"),
    ]);
    let id = goal["goalId"].as_str().unwrap_or_else(|| panic!("{goal}")).to_owned();
    // The write waits in the approval inbox, and nothing is written meanwhile.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let call = loop {
        let inbox = curl(&[&format!("http://{http}/v1/approvals")]);
        if let Some(call) = inbox["approvals"].as_array().and_then(|a| a.first()) {
            assert_eq!(call["tool"], "fs.write", "{inbox}");
            break call["callId"].as_str().unwrap().to_owned();
        }
        assert!(std::time::Instant::now() < deadline, "fs.write never asked for approval: {inbox}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!workspace.join(&name).exists());
    assert!(!repo_root().join(&name).exists(), "a goal wrote into the directory hermes up runs in");
    curl(&[
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-d",
        "{}",
        &format!("http://{http}/v1/approvals/{id}/{call}:approve"),
    ]);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !workspace.join(&name).exists() {
        assert!(std::time::Instant::now() < deadline, "the approved write never happened");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!repo_root().join(&name).exists());
}

/// `hermes submit --watch` rides out a dispatcher restart: the stream drops when `hermes up`
/// drains, the CLI resumes after the last event it printed once the new one is up, and the
/// goal's steps are printed once each, to the end.
#[test]
fn submit_watch_resumes_after_a_dispatcher_restart() {
    use hermes_test_util::process::HermesUp;
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let mut up = HermesUp::builder(env!("CARGO_BIN_EXE_hermes"), data.path())
        .nats_url(&nats.url())
        .env("HERMES_LLM_PROVIDER", "none")
        .start();
    let plan = data.path().join("nap.yaml");
    std::fs::write(
        &plan,
        "nodes:\n  - {id: nap, task_type: time.sleep, inputs: {ms: 3000}}\n  - {id: sum, task_type: math.evaluate, inputs: {expression: '20 + 22'}, depends_on: [nap]}\noutput_node: sum\n",
    )
    .unwrap();
    let mut watch = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["submit", "--plan"])
        .arg(&plan)
        .args(["--watch", "--server", &up.grpc])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stdout = watch.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.contains("dispatched nap")) {
        lines.push(rx.recv_timeout(Duration::from_secs(30)).expect("the watch prints the dispatch"));
    }
    // A graceful restart while `nap` runs: the API stops first, the agent finishes its task.
    up.sigterm();
    assert!(up.wait_exit(Duration::from_secs(60)).is_some(), "hermes up drains");
    up.restart();
    let status = watch.wait().unwrap();
    // Everything it printed, to the end, so a failure shows the whole story.
    reader.join().unwrap();
    lines.extend(rx.try_iter());
    lines.push(format!("(exit: {status})"));
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut watch.stderr.take().unwrap(), &mut stderr).unwrap();
    let shown = lines.join("\n");
    assert!(status.success(), "{shown}\n{stderr}");
    assert!(stderr.contains("resuming after event"), "{stderr}");
    assert!(shown.contains("completed"), "{shown}");
    assert!(shown.contains("\"value\": 42"), "{shown}");
    for step in
        ["accepted", "dispatched nap", "succeeded  nap", "dispatched sum", "succeeded  sum", "] completed"]
    {
        assert_eq!(lines.iter().filter(|l| l.contains(step)).count(), 1, "`{step}` once:\n{shown}");
    }
}

#[test]
fn submit_watch_prints_the_report_and_exit_codes_follow_the_goal() {
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_up, server) = hermes_up_with(&nats.url(), data.path(), &["--workspace", "."]);

    let out =
        hermes(&["submit", "--plan", "examples/plans/sales-report.yaml", "--watch", "--server", &server]);
    let shown = text(&out);
    assert!(out.status.success(), "{shown}");
    assert!(
        shown.contains("plan: 4 nodes in 3 parallel groups: [april, march] -> [change] -> [report]"),
        "{shown}"
    );
    assert!(shown.contains("succeeded  report"), "{shown}");
    assert!(shown.contains("Total April sales:"), "{shown}");
    assert!(shown.contains("Top 3 categories in April:"), "{shown}");

    // The first goal of the Helm chart's NOTES and docs/deploy.md, on built-in tools only.
    let out = hermes(&["submit", "--plan", "examples/plans/first-goal.yaml", "--watch", "--server", &server]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("Q1 sales (200) were 1.33 times Q2 sales (150)."), "{}", text(&out));

    // A goal that fails exits 1 and says why.
    let dir = tempfile::tempdir().unwrap();
    let failing = dir.path().join("fail.yaml");
    std::fs::write(
        &failing,
        "nodes:\n  - id: calc\n    task_type: math.evaluate\n    inputs: {expression: 'nope + 1'}\n",
    )
    .unwrap();
    let out = hermes(&["submit", "--plan", failing.to_str().unwrap(), "--watch", "--server", &server]);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out));
    assert!(text(&out).contains("goal failed at node calc: INVALID_ARGUMENT"), "{}", text(&out));

    // A rejected plan exits 2 with the reason.
    std::fs::write(&failing, "nodes:\n  - id: a\n    task_type: no.such-tool\n").unwrap();
    let out = hermes(&["submit", "--plan", failing.to_str().unwrap(), "--server", &server]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("unknown task type `no.such-tool`"), "{}", text(&out));

    let out = hermes(&["agents", "--server", &server]);
    assert!(out.status.success(), "{}", text(&out));
    let table = text(&out);
    assert!(table.contains("LOAD/MAX") && table.contains("local-1") && table.contains("local-2"), "{table}");
    assert!(table.contains("table.aggregate"), "{table}");

    let out = hermes(&["list", "--server", &server]);
    assert!(out.status.success());
    assert!(text(&out).contains("COMPLETED") && text(&out).contains("FAILED"), "{}", text(&out));
}

#[test]
fn an_unreachable_server_gives_a_clear_error() {
    let port = hermes_test_util::free_port();
    let out = hermes(&["get", "g-1", "--server", &format!("127.0.0.1:{port}")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("cannot reach the dispatcher"), "{}", text(&out));
}

/// A NATS URL the user gave and that is down is an error, not a reason to start a second, local
/// bus that no one else sees.
#[test]
fn hermes_up_with_an_unreachable_nats_url_fails_and_starts_no_local_server() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("nats://127.0.0.1:{}", hermes_test_util::free_port());
    let out = hermes_up_once(dir.path(), &["--nats-url", &url]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains(&format!("nats.url {url} is not reachable")), "{}", text(&out));
    assert!(!text(&out).contains("hermes up: grpc"), "no stack became ready: {}", text(&out));
    assert!(!dir.path().join("nats").exists(), "no local nats-server store was made");
}

/// `nats.tls` is for a server that serves TLS: `hermes up`'s own loopback server does not, so
/// asking for it without a URL is refused, naming the way out, before any server starts.
#[test]
fn hermes_up_refuses_nats_tls_for_its_own_server() {
    let dir = tempfile::tempdir().unwrap();
    let out = hermes_up_once(dir.path(), &["--nats-tls-ca-file", "/etc/ssl/certs/ca-certificates.crt"]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("nats.tls is set"), "{}", text(&out));
    assert!(text(&out).contains("--nats-url"), "{}", text(&out));
    assert!(!dir.path().join("nats").exists(), "no local nats-server store was made");
}

#[test]
fn a_nats_server_older_than_2_10_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let fake = dir.path().join("nats-server");
    std::fs::write(&fake, "#!/bin/sh\necho 'nats-server: v2.9.10'\n").unwrap();
    let mut perms = std::fs::metadata(&fake).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perms, 0o755);
    std::fs::set_permissions(&fake, perms).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["up", "--grpc-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path().join("data"))
        .env("HERMES_NATS_SERVER_BIN", &fake)
        .env_remove("HERMES_NATS_URL")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let shown = text(&out);
    assert!(shown.contains("2.9.10 is too old"), "{shown}");
    assert!(shown.contains("make tools"), "{shown}");
}

/// `hermes up --agents-config` runs the file's agents; `hermes submit --watch --interactive`
/// puts each approval to the user as y/n and records the answer.
#[test]
fn submit_watch_asks_y_or_n_for_approvals() {
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let agents = work.path().join("agents.toml");
    std::fs::write(
        &agents,
        "[[agent]]\nid = \"writer-${HERMES_TEST_SUFFIX:-1}\"\ntools = [\"fs.write\"]\nconfirm = [\"fs.write\"]\nworkspace = \".\"\n",
    )
    .unwrap();
    let (_up, server) =
        hermes_up_with(&nats.url(), data.path(), &["--agents-config", agents.to_str().unwrap()]);
    let out = hermes(&["agents", "--server", &server]);
    assert!(text(&out).contains("writer-1"), "{}", text(&out));

    let plan = work.path().join("plan.yaml");
    for (answer, content, code) in [("n", "no", 1), ("y", "yes", 0)] {
        std::fs::write(
            &plan,
            format!("nodes:\n  - id: w\n    task_type: fs.write\n    inputs: {{path: {content}.txt, content: {content}}}\n"),
        )
        .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_hermes"))
            .args([
                "submit",
                "--plan",
                plan.to_str().unwrap(),
                "--watch",
                "--interactive",
                "--server",
                &server,
            ])
            .current_dir(repo_root())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let mut stdin = child.stdin.take().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines().map_while(Result::ok);
        let mut shown = Vec::new();
        for line in lines.by_ref() {
            shown.push(line.clone());
            if line.starts_with("approve fs.write on node w? [y/n]") {
                // An unclear answer is asked again.
                std::io::Write::write_all(&mut stdin, format!("maybe\n{answer}\n").as_bytes()).unwrap();
                break;
            }
        }
        shown.extend(lines);
        let status = child.wait().unwrap();
        let shown = shown.join("\n");
        assert_eq!(status.code(), Some(code), "{shown}");
        assert!(shown.contains("answer y or n"), "{shown}");
        assert_eq!(work.path().join(format!("{content}.txt")).exists(), answer == "y", "{shown}");
        if answer == "n" {
            assert!(shown.contains("DENIED") && shown.contains("denied at the terminal"), "{shown}");
        }
    }
}

/// `hermes memory` shows what the memory service in `hermes up` keeps: the session a goal was
/// submitted in, the artifact its large output became, and a clear error for search without an
/// embedding model.
#[test]
fn hermes_memory_shows_sessions_artifacts_and_explains_search() {
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let work = tempfile::tempdir().unwrap();
    let big: String = (0..5000).map(|i| format!("line {i} of a large file\n")).collect();
    std::fs::write(work.path().join("big.txt"), &big).unwrap();
    std::fs::write(
        work.path().join("plan.yaml"),
        "nodes:\n  - id: read\n    task_type: fs.read\n    inputs: {path: big.txt}\n",
    )
    .unwrap();
    let (_up, server) =
        hermes_up_with(&nats.url(), data.path(), &["--workspace", work.path().to_str().unwrap()]);
    let plan = work.path().join("plan.yaml");
    let out = hermes(&[
        "submit",
        "--plan",
        plan.to_str().unwrap(),
        "--session",
        "demo-1",
        "--watch",
        "--server",
        &server,
    ]);
    assert!(out.status.success(), "{}", text(&out));

    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let out = hermes(&["memory", "session", "demo-1", "--server", &server]);
        let shown = text(&out);
        if shown.contains("(2 turns") {
            assert!(shown.contains("user: (a plan of 1 nodes)") && shown.contains("assistant:"), "{shown}");
            break;
        }
        assert!(Instant::now() < deadline, "the session was not recorded: {shown}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let out = hermes(&["memory", "sessions", "--server", &server]);
    assert!(text(&out).contains("demo-1"), "{}", text(&out));

    let out = hermes(&["memory", "artifacts", "--server", &server]);
    let listing = text(&out);
    let reference = listing.split_whitespace().find(|w| w.starts_with("art-")).expect(&listing).to_owned();
    let copy = work.path().join("artifact.json");
    let out = hermes(&["memory", "artifact", &reference, "-o", copy.to_str().unwrap(), "--server", &server]);
    assert!(out.status.success(), "{}", text(&out));
    let stored: serde_json::Value = serde_json::from_slice(&std::fs::read(&copy).unwrap()).unwrap();
    assert_eq!(stored["text"].as_str().unwrap(), big);

    let out = hermes(&["memory", "search", "large file", "--server", &server]);
    assert!(!out.status.success());
    assert!(text(&out).contains("HERMES_EMBEDDING_PROVIDER"), "{}", text(&out));
}

/// The settings pipeline through the real binary: default < file < env < flag, an unknown key
/// named, secrets masked by `--print-config`.
#[test]
fn settings_come_from_file_env_and_flags_in_that_order() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("hermes.toml");
    std::fs::write(
        &file,
        "[dispatcher]\ngoal_timeout_secs = 111\nnode_timeout_secs = 222\nmax_nodes = 333\n",
    )
    .unwrap();
    let print = |env: &[(&str, &str)], args: &[&str]| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_hermes"));
        command.args(["up", "--print-config", "--config"]).arg(&file).args(args);
        for key in
            ["HERMES_GOAL_TIMEOUT_SECS", "HERMES_NODE_TIMEOUT_SECS", "HERMES_LLM_API_KEY", "HERMES_NATS_URL"]
        {
            command.env_remove(key);
        }
        command.envs(env.iter().copied());
        let out = command.output().unwrap();
        assert!(out.status.success(), "{}", text(&out));
        String::from_utf8(out.stdout).unwrap()
    };
    let printed = print(&[], &[]);
    assert!(printed.contains("goal_timeout_secs = 111") && printed.contains("max_nodes = 333"), "{printed}");
    assert!(printed.contains("catalog_ttl_ms = 2000"), "defaults fill the rest: {printed}");
    let printed =
        print(&[("HERMES_GOAL_TIMEOUT_SECS", "444"), ("HERMES_DISPATCHER__NODE_TIMEOUT_SECS", "555")], &[]);
    assert!(
        printed.contains("goal_timeout_secs = 444") && printed.contains("node_timeout_secs = 555"),
        "{printed}"
    );
    let printed = print(&[("HERMES_GOAL_TIMEOUT_SECS", "444")], &["--goal-timeout-secs", "666"]);
    assert!(printed.contains("goal_timeout_secs = 666") && printed.contains("max_nodes = 333"), "{printed}");
    let printed = print(
        &[("HERMES_LLM_API_KEY", "sk-do-not-print"), ("HERMES_NATS_URL", "nats://h:pw1234@n:4222")],
        &[],
    );
    assert!(!printed.contains("sk-do-not-print") && !printed.contains("pw1234"), "{printed}");
    assert!(printed.contains("api_key = \"********\""), "{printed}");

    std::fs::write(&file, "[dispatcher]\ngoal_timeout = 1\n").unwrap();
    let out =
        Command::new(env!("CARGO_BIN_EXE_hermes")).args(["up", "--config"]).arg(&file).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(text(&out).contains("unknown setting `dispatcher.goal_timeout`"), "{}", text(&out));
}

/// `hermes up`'s own nats-server listens on loopback and refuses anonymous clients: the services
/// connect with the password it made in its data dir (mode 0600), which the ready line does not
/// print, and with which another process may join.
#[test]
fn the_local_nats_server_refuses_anonymous_clients_and_takes_its_generated_password() {
    use std::os::unix::fs::PermissionsExt;
    let data = tempfile::tempdir().unwrap();
    let listen = format!("127.0.0.1:{}", hermes_test_util::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["up", "--grpc-listen", &listen, "--http-listen", "off", "--agents-count", "1", "--data-dir"])
        .arg(data.path())
        .current_dir(repo_root())
        .env("HERMES_LLM_PROVIDER", "none")
        .env_remove("HERMES_NATS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let up = Up(child);
    let said = crate::said_until_ready(stdout);
    let ready =
        said.last().filter(|l| l.starts_with("hermes up: grpc")).expect("hermes up becomes ready").clone();
    let note = said.iter().find(|l| l.contains("refuses anonymous clients")).cloned().unwrap_or_default();
    let url = ready.split_whitespace().skip_while(|w| *w != "nats").nth(1).unwrap().to_owned();
    assert!(url.starts_with("nats://127.0.0.1:"), "{ready}");

    let auth = data.path().join("nats").join("auth.conf");
    let mode = std::fs::metadata(&auth).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "{} is readable by others", auth.display());
    let config = std::fs::read_to_string(&auth).unwrap();
    let password =
        config.lines().find_map(|l| l.trim().strip_prefix("password:")).unwrap().trim().trim_matches('"');
    assert!(
        !ready.contains(password) && !note.contains(password),
        "the password was printed: {ready} / {note}"
    );
    assert!(note.contains(&auth.display().to_string()), "{note}");

    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    runtime.block_on(async {
        let anonymous = async_nats::ConnectOptions::new().connect(&url).await;
        assert!(anonymous.is_err(), "an anonymous client was let in");
        let wrong = async_nats::ConnectOptions::with_user_and_password("hermes".into(), "guess".into())
            .connect(&url)
            .await;
        assert!(wrong.is_err(), "a wrong password was let in");
        let client = async_nats::ConnectOptions::with_user_and_password("hermes".into(), password.into())
            .connect(&url)
            .await
            .expect("the generated password connects");
        let js = async_nats::jetstream::new(client);
        js.get_key_value("hermes_goals").await.expect("and reaches the goals bucket");
    });

    // `hermes nats-url` prints that URL with the password, for another process to join with;
    // once `hermes up` has stopped, it says none runs there.
    let nats_url = || {
        Command::new(env!("CARGO_BIN_EXE_hermes"))
            .arg("nats-url")
            .arg("--data-dir")
            .arg(data.path())
            .output()
            .unwrap()
    };
    let printed = nats_url();
    assert!(printed.status.success(), "{}", text(&printed));
    let host_port = url.trim_start_matches("nats://");
    assert_eq!(
        String::from_utf8_lossy(&printed.stdout).trim(),
        format!("nats://hermes:{password}@{host_port}")
    );
    drop(up);
    // The process that holds the data dir's lock is the supervised child of the one killed: it
    // follows its parent (parent-death signal) a moment later.
    let deadline = Instant::now() + Duration::from_secs(15);
    let after = loop {
        let after = nats_url();
        if !after.status.success() || Instant::now() > deadline {
            break after;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(!after.status.success(), "{}", text(&after));
    assert!(text(&after).contains("no `hermes up` is running on"), "{}", text(&after));
}

/// SIGHUP reads the API tokens file again: a token added works and one removed is refused, on the
/// dispatcher's calls and on the Registry and Memory APIs it serves, with no restart; a file that
/// no longer reads leaves the tokens before it in force; a change with no signal is seen too.
#[test]
fn the_api_tokens_file_is_read_again_on_sighup_and_on_a_change() {
    use sha2::Digest;
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let entry = |name: &str, secret: &str| {
        let sha: String =
            sha2::Sha256::digest(secret.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        format!(
            "[[token]]\nname = \"{name}\"\nsha256 = \"{sha}\"\ntenant = \"team-a\"\nroles = [\"viewer\"]\n"
        )
    };
    let tokens = data.path().join("tokens.toml");
    std::fs::write(&tokens, entry("old", "old-secret")).unwrap();
    let tokens_arg = tokens.to_str().unwrap().to_owned();
    let (up, grpc) = hermes_up_with(&nats.url(), data.path(), &["--dispatcher-api-tokens-file", &tokens_arg]);
    let works =
        |command: &str, token: &str| hermes(&[command, "--server", &grpc, "--token", token]).status.success();
    assert!(works("list", "old-secret"));
    assert!(!works("list", "new-secret"));

    std::fs::write(&tokens, entry("new", "new-secret")).unwrap();
    let hangup = || {
        let sent = Command::new("kill").args(["-HUP", &up.0.id().to_string()]).status().unwrap();
        assert!(sent.success());
    };
    hangup();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !works("list", "new-secret") {
        assert!(Instant::now() < deadline, "the new token was not taken within 10 s of SIGHUP");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!works("list", "old-secret"), "a token removed from the file still works");
    assert!(works("agents", "new-secret"), "the Registry API took the new token too");
    assert!(!works("agents", "old-secret"));
    let memory = hermes(&["memory", "artifacts", "--server", &grpc, "--token", "old-secret"]);
    assert!(text(&memory).contains("UNAUTHENTICATED"), "{}", text(&memory));

    // A broken file changes nothing, and the process goes on serving.
    std::fs::write(&tokens, "[[token]]\nname = \"broken\"\n").unwrap();
    hangup();
    std::thread::sleep(Duration::from_millis(500));
    assert!(works("list", "new-secret"), "a broken file took the tokens in force away");
    assert!(!works("list", "old-secret"));

    // A change with no signal (a Kubernetes Secret updated under the pod) is seen within 10 s.
    std::fs::write(&tokens, entry("third", "third-secret")).unwrap();
    let deadline = Instant::now() + Duration::from_secs(15);
    while !works("list", "third-secret") {
        assert!(Instant::now() < deadline, "a changed file was not taken within 15 s without SIGHUP");
        std::thread::sleep(Duration::from_millis(250));
    }
    assert!(!works("list", "new-secret"));
}

/// With an API tokens file, `hermes` client commands are refused without a token and work with
/// `--token` (or `HERMES_TOKEN`); `hermes audit` shows an operator who did what.
#[test]
fn client_commands_carry_the_api_token() {
    use sha2::Digest;
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let sha: String = sha2::Sha256::digest(b"cli-secret").iter().map(|b| format!("{b:02x}")).collect();
    let tokens = data.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        format!(
            "[[token]]\nname = \"me\"\nsha256 = \"{sha}\"\ntenant = \"team-a\"\nroles = [\"submitter\", \"operator\"]\n"
        ),
    )
    .unwrap();
    let tokens = tokens.to_str().unwrap().to_owned();
    let (_up, grpc) = hermes_up_with(&nats.url(), data.path(), &["--dispatcher-api-tokens-file", &tokens]);
    let refused = hermes(&["list", "--server", &grpc]);
    assert!(!refused.status.success(), "{}", text(&refused));
    assert!(text(&refused).contains("UNAUTHENTICATED"), "{}", text(&refused));
    let listed = hermes(&["list", "--server", &grpc, "--token", "cli-secret"]);
    assert!(listed.status.success(), "{}", text(&listed));
    let by_env = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["list", "--server", &grpc])
        .env("HERMES_TOKEN", "cli-secret")
        .output()
        .unwrap();
    assert!(by_env.status.success(), "{}", text(&by_env));

    // The Memory API on the same port needs the token too, and `hermes memory` sends it.
    let memory = hermes(&["memory", "artifacts", "--server", &grpc]);
    assert!(text(&memory).contains("UNAUTHENTICATED"), "{}", text(&memory));
    let memory = hermes(&["memory", "artifacts", "--server", &grpc, "--token", "cli-secret"]);
    assert!(memory.status.success(), "{}", text(&memory));

    // So does the registry's, and `hermes agents` sends it.
    let agents = hermes(&["agents", "--server", &grpc]);
    assert!(text(&agents).contains("UNAUTHENTICATED"), "{}", text(&agents));
    let agents = hermes(&["agents", "--server", &grpc, "--token", "cli-secret"]);
    assert!(agents.status.success(), "{}", text(&agents));

    let cancelled = hermes(&["cancel", "g-nothing-here", "--server", &grpc, "--token", "cli-secret"]);
    assert!(!cancelled.status.success(), "{}", text(&cancelled));
    let audit = hermes(&["audit", "--server", &grpc, "--token", "cli-secret"]);
    assert!(audit.status.success(), "{}", text(&audit));
    let row = text(&audit).lines().find(|l| l.contains("goal.cancel")).map(str::to_owned);
    let row = row.unwrap_or_else(|| panic!("no cancel in the audit: {}", text(&audit)));
    for part in ["me", "team-a", "NOT_FOUND", "g-nothing-here", "grpc 127.0.0.1:"] {
        assert!(row.contains(part), "{part} missing from {row}");
    }
    let json = hermes(&["audit", "--json", "--server", &grpc, "--token", "cli-secret"]);
    let line = String::from_utf8_lossy(&json.stdout).lines().next().map(str::to_owned).unwrap_or_default();
    let record: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line}"));
    assert_eq!(record["action"], "goal.cancel");
}

/// With auth off, the API is served on loopback only: a wider address is refused with the way
/// out, unless `--dispatcher-allow-unauthenticated` says a proxy in front authenticates.
#[test]
fn an_open_address_with_auth_off_is_refused_unless_allowed() {
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let wide = format!("0.0.0.0:{}", hermes_test_util::free_port());
    let refused = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["up", "--grpc-listen", &wide, "--http-listen", "off", "--agents-count", "0"])
        .args(["--nats-url", &nats.url(), "--data-dir"])
        .arg(data.path())
        .current_dir(repo_root())
        .env("HERMES_LLM_PROVIDER", "none")
        .output()
        .unwrap();
    assert!(!refused.status.success(), "{}", text(&refused));
    let said = text(&refused);
    assert!(said.contains(&format!("refusing to serve the gRPC API on {wide} with auth off")), "{said}");
    assert!(
        said.contains("HERMES_API_TOKENS_FILE") && said.contains("HERMES_ALLOW_UNAUTHENTICATED"),
        "{said}"
    );
    let (_up, _) = hermes_up_with(&nats.url(), data.path(), &["--dispatcher-allow-unauthenticated"]);
}

/// The `http` address of a ready line (`hermes up: grpc ... http ADDR`).
fn http_of(ready: &str) -> String {
    ready.rsplit("http ").next().unwrap().trim().to_owned()
}

async fn grpc_tls_call(
    addr: &str,
    ca: Option<&Path>,
    identity: Option<(&Path, &Path)>,
) -> Result<(), String> {
    use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity};
    let port = addr.rsplit(':').next().unwrap();
    let mut tls = ClientTlsConfig::new().domain_name("localhost");
    if let Some(ca) = ca {
        tls = tls.ca_certificate(Certificate::from_pem(std::fs::read(ca).unwrap()));
    }
    if let Some((cert, key)) = identity {
        tls = tls.identity(Identity::from_pem(std::fs::read(cert).unwrap(), std::fs::read(key).unwrap()));
    }
    let endpoint = Channel::from_shared(format!("https://localhost:{port}")).unwrap();
    let channel =
        endpoint.tls_config(tls).map_err(|e| e.to_string())?.connect().await.map_err(|e| format!("{e:?}"))?;
    let mut client = hermes_proto::dispatcher_client::DispatcherClient::new(channel);
    client.list_goals(hermes_proto::ListGoalsRequest::default()).await.map(|_| ()).map_err(|e| e.to_string())
}

async fn grpc_plain_call(addr: &str) -> Result<(), String> {
    let mut client = hermes_proto::dispatcher_client::DispatcherClient::connect(format!("http://{addr}"))
        .await
        .map_err(|e| e.to_string())?;
    client.list_goals(hermes_proto::ListGoalsRequest::default()).await.map(|_| ()).map_err(|e| e.to_string())
}

async fn https_get(addr: &str, ca: Option<&Path>, identity: Option<(&Path, &Path)>) -> Result<u16, String> {
    let port = addr.rsplit(':').next().unwrap();
    let mut builder = reqwest::Client::builder().timeout(Duration::from_secs(10)).use_rustls_tls();
    if let Some(ca) = ca {
        builder = builder
            .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(ca).unwrap()).unwrap());
    }
    if let Some((cert, key)) = identity {
        let pem = [std::fs::read(cert).unwrap(), std::fs::read(key).unwrap()].concat();
        builder = builder.identity(reqwest::Identity::from_pem(&pem).unwrap());
    }
    let response = builder.build().unwrap().get(format!("https://localhost:{port}/v1/goals")).send().await;
    response.map(|r| r.status().as_u16()).map_err(|e| format!("{e:?}"))
}

/// TLS on both doors: a client that trusts the CA gets through over gRPC and HTTPS; plaintext
/// and a client that does not trust the CA do not. With client CAs (mTLS), only a client
/// certificate that CA signed gets through; none, or one of another CA, is refused. A missing
/// certificate file stops `hermes up`, naming the setting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_and_mtls_handshakes_succeed_and_fail_as_configured() {
    let pki = hermes_test_util::tls::TestPki::new();
    let nats = hermes_test_util::NatsServer::start();
    let p = |path: std::path::PathBuf| path.to_str().unwrap().to_owned();
    let (cert, key, ca) = (p(pki.server_cert()), p(pki.server_key()), p(pki.ca()));
    let client = (pki.client_cert(), pki.client_key());
    let stranger = (pki.stranger_cert(), pki.stranger_key());

    let data = tempfile::tempdir().unwrap();
    let tls_args = [
        "--grpc-tls-cert-file",
        &cert,
        "--grpc-tls-key-file",
        &key,
        "--dispatcher-http-tls-cert-file",
        &cert,
        "--dispatcher-http-tls-key-file",
        &key,
    ];
    let (up, grpc, ready) = hermes_up_ready(&nats.url(), data.path(), &tls_args);
    let http = http_of(&ready);
    grpc_tls_call(&grpc, Some(&pki.ca()), None).await.expect("gRPC over TLS with the CA trusted");
    assert!(grpc_tls_call(&grpc, None, None).await.is_err(), "a client that does not trust the CA");
    assert!(grpc_plain_call(&grpc).await.is_err(), "plaintext gRPC against a TLS server");
    assert_eq!(https_get(&http, Some(&pki.ca()), None).await, Ok(200));
    assert!(https_get(&http, None, None).await.is_err(), "an HTTPS client that does not trust the CA");
    let plain = reqwest::Client::new().get(format!("http://{http}/v1/goals")).send().await;
    assert!(plain.is_err() || !plain.unwrap().status().is_success(), "plaintext HTTP against a TLS server");
    drop(up);

    let data = tempfile::tempdir().unwrap();
    let mtls_args: Vec<&str> = tls_args
        .iter()
        .copied()
        .chain(["--grpc-tls-client-ca-file", &ca, "--dispatcher-http-tls-client-ca-file", &ca])
        .collect();
    let (_up, grpc, ready) = hermes_up_ready(&nats.url(), data.path(), &mtls_args);
    let http = http_of(&ready);
    let with = |id: &(std::path::PathBuf, std::path::PathBuf)| (id.0.clone(), id.1.clone());
    let (c, s) = (with(&client), with(&stranger));
    grpc_tls_call(&grpc, Some(&pki.ca()), Some((&c.0, &c.1)))
        .await
        .expect("gRPC with a client certificate of the CA");
    assert!(grpc_tls_call(&grpc, Some(&pki.ca()), None).await.is_err(), "gRPC with no client certificate");
    assert!(
        grpc_tls_call(&grpc, Some(&pki.ca()), Some((&s.0, &s.1))).await.is_err(),
        "gRPC with another CA's client"
    );
    assert_eq!(https_get(&http, Some(&pki.ca()), Some((&c.0, &c.1))).await, Ok(200));
    assert!(https_get(&http, Some(&pki.ca()), None).await.is_err(), "HTTPS with no client certificate");
    assert!(
        https_get(&http, Some(&pki.ca()), Some((&s.0, &s.1))).await.is_err(),
        "HTTPS with another CA's client"
    );

    let refused = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["up", "--grpc-tls-cert-file", "/nonexistent/cert.pem", "--grpc-tls-key-file", &key])
        .args(["--nats-url", &nats.url(), "--data-dir"])
        .arg(tempfile::tempdir().unwrap().path())
        .current_dir(repo_root())
        .env("HERMES_LLM_PROVIDER", "none")
        .output()
        .unwrap();
    assert!(!refused.status.success());
    assert!(text(&refused).contains("grpc.tls.cert_file"), "{}", text(&refused));
}

/// The doors' certificates are read again without a restart: after the files are replaced by a
/// certificate of another CA and SIGHUP, new connections over gRPC and HTTPS get the new one (a
/// client trusting only the new CA gets through, one trusting only the old does not); files
/// that no longer make an identity are refused and the certificate in force stays; a change
/// with no signal is seen too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_certificates_are_read_again_on_sighup_and_on_a_change() {
    let (first, second, third) = (
        hermes_test_util::tls::TestPki::new(),
        hermes_test_util::tls::TestPki::new(),
        hermes_test_util::tls::TestPki::new(),
    );
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (cert, key) = (data.path().join("server.pem"), data.path().join("server.key"));
    let serve = |pki: &hermes_test_util::tls::TestPki| {
        // The key first, then the certificate: in between the pair makes no identity.
        std::fs::copy(pki.server_key(), &key).unwrap();
        std::fs::copy(pki.server_cert(), &cert).unwrap();
    };
    serve(&first);
    let (c, k) = (cert.to_str().unwrap().to_owned(), key.to_str().unwrap().to_owned());
    let args = [
        "--grpc-tls-cert-file",
        &c,
        "--grpc-tls-key-file",
        &k,
        "--dispatcher-http-tls-cert-file",
        &c,
        "--dispatcher-http-tls-key-file",
        &k,
    ];
    let (up, grpc, ready) = hermes_up_ready(&nats.url(), data.path(), &args);
    let http = http_of(&ready);
    // Whether each door (gRPC, HTTPS) lets in a client that trusts only `pki`'s CA.
    let serves = async |pki: &hermes_test_util::tls::TestPki| {
        let grpc_ok = grpc_tls_call(&grpc, Some(&pki.ca()), None).await.is_ok();
        let https_ok = https_get(&http, Some(&pki.ca()), None).await == Ok(200);
        (grpc_ok, https_ok)
    };
    // Waits until both doors do (`want`) or do not serve `pki`'s certificate. The doors follow
    // their files each on its own, so for a moment after a change one may be ahead.
    let until = async |pki: &hermes_test_util::tls::TestPki, want: bool, within: Duration, what: &str| {
        let deadline = Instant::now() + within;
        loop {
            let got = serves(pki).await;
            if got == (want, want) {
                return;
            }
            assert!(Instant::now() < deadline, "{what}: (gRPC, HTTPS) answered {got:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    until(&first, true, Duration::from_secs(10), "the first certificate at start").await;
    until(&second, false, Duration::from_secs(1), "another CA's client at start").await;

    let hangup = || {
        let sent = Command::new("kill").args(["-HUP", &up.0.id().to_string()]).status().unwrap();
        assert!(sent.success());
    };
    serve(&second);
    hangup();
    until(&second, true, Duration::from_secs(10), "the new certificate within 10 s of SIGHUP").await;
    until(&first, false, Duration::from_secs(2), "the old certificate is no longer served").await;

    // A key that does not match the certificate changes nothing.
    std::fs::copy(first.server_key(), &key).unwrap();
    hangup();
    tokio::time::sleep(Duration::from_millis(500)).await;
    for _ in 0..3 {
        assert_eq!(serves(&second).await, (true, true), "a broken pair took the certificate in force away");
    }

    // A change with no signal (a Secret updated under the pod) is seen within the poll.
    serve(&third);
    until(&third, true, Duration::from_secs(25), "changed files taken within 25 s without SIGHUP").await;
}

/// Every file under `dir`, read whole.
fn files_under(dir: &Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                out.push((path, bytes));
            }
        }
    }
    out
}

/// Submits a goal whose input holds `canary` and waits for it to end.
async fn goal_with_canary(grpc: &str, canary: &str) -> String {
    let mut client =
        hermes_proto::dispatcher_client::DispatcherClient::connect(format!("http://{grpc}")).await.unwrap();
    let plan = hermes_proto::TaskPlan {
        nodes: vec![hermes_proto::TaskNode {
            id: "say".into(),
            task_type: "text.template".into(),
            inputs_json:
                serde_json::json!({"template": format!("{canary} {{{{name}}}}"), "values": {"name": "x"}})
                    .to_string(),
            ..Default::default()
        }],
        ..Default::default()
    };
    let request = hermes_proto::SubmitGoalRequest {
        spec: Some(hermes_proto::GoalSpec { plan: Some(plan), ..Default::default() }),
    };
    let goal_id = client.submit_goal(request).await.unwrap().into_inner().goal_id;
    let mut events = client
        .watch_goal(hermes_proto::WatchGoalRequest { goal_id: goal_id.clone(), after_seq: 0 })
        .await
        .unwrap()
        .into_inner();
    while tokio::time::timeout(Duration::from_secs(30), events.message()).await.unwrap().unwrap().is_some() {}
    goal_id
}

/// With `store_secret`, the local nats-server's store is encrypted: a goal's input is nowhere in
/// its files, while without it the same input is there in clear; a restart with the same secret
/// reads the store back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn store_secret_encrypts_the_local_store_at_rest() {
    let canary = "canary-7f3a91c2-plaintext";
    let grep = |dir: &Path| {
        files_under(dir)
            .into_iter()
            .filter(|(_, b)| b.windows(canary.len()).any(|w| w == canary.as_bytes()))
            .count()
    };
    let start = |data: &Path, extra: &[&str]| {
        let up = hermes_test_util::process::HermesUp::builder(env!("CARGO_BIN_EXE_hermes"), data)
            .args(extra)
            .env("HERMES_LLM_PROVIDER", "none")
            .current_dir(repo_root())
            .start();
        let grpc = up.grpc.clone();
        (up, grpc)
    };
    // The baseline: without a secret the input is in the store in clear.
    let plain = tempfile::tempdir().unwrap();
    let (up, grpc) = start(plain.path(), &[]);
    goal_with_canary(&grpc, canary).await;
    drop(up);
    assert!(grep(plain.path()) > 0, "the baseline finds the canary in a plaintext store");

    let secret = "0123456789abcdef0123456789abcdef";
    let sealed = tempfile::tempdir().unwrap();
    let (up, grpc) = start(sealed.path(), &["--store-secret", secret]);
    let goal_id = goal_with_canary(&grpc, canary).await;
    drop(up);
    let files = files_under(sealed.path());
    assert!(files.iter().any(|(p, _)| p.to_string_lossy().contains("jetstream")), "the store was written");
    assert_eq!(grep(sealed.path()), 0, "the canary is in an encrypted store");
    assert!(
        files.iter().all(|(_, b)| !b.windows(secret.len()).any(|w| w == secret.as_bytes())),
        "the secret is on disk"
    );

    let (_up, grpc) = start(sealed.path(), &["--store-secret", secret]);
    let mut client =
        hermes_proto::dispatcher_client::DispatcherClient::connect(format!("http://{grpc}")).await.unwrap();
    let goal = client
        .get_goal(hermes_proto::GetGoalRequest { goal_id })
        .await
        .expect("the goal survives a restart")
        .into_inner();
    assert!(goal.output_json.contains(canary), "{}", goal.output_json);
}

/// `hermes webhooks` and `hermes submit --callback` as a user runs them: a standing endpoint
/// added, listed and rotated, a goal's own callback, both sent to a local receiver, the
/// deliveries listed, the endpoint removed.
#[test]
fn hermes_webhooks_adds_lists_rotates_removes_and_shows_deliveries() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let receiver = runtime.block_on(hermes_test_util::receiver::Receiver::start());
    let nats = hermes_test_util::NatsServer::start();
    let data = tempfile::tempdir().unwrap();
    let (_up, grpc) = hermes_up_with(&nats.url(), data.path(), &["--dispatcher-webhooks-allow", "127.0.0.1"]);
    let added = hermes(&["webhooks", "add", &receiver.url, "--event", "goal.completed", "--server", &grpc]);
    assert!(added.status.success(), "{}", text(&added));
    let added = text(&added);
    let id = added.split_whitespace().nth(1).unwrap_or_default().to_owned();
    assert!(id.starts_with("wh-") && added.contains("signing secret whsec_"), "{added}");
    let listed = text(&hermes(&["webhooks", "list", "--server", &grpc]));
    assert!(listed.contains(&id) && listed.contains("goal.completed"), "{listed}");
    assert!(!listed.contains("whsec_"), "a listing never shows a secret: {listed}");

    let plan = data.path().join("plan.yaml");
    std::fs::write(&plan, "nodes:\n  - {id: sum, task_type: math.evaluate, inputs: {expression: '2+2'}}\n")
        .unwrap();
    let submitted = hermes(&[
        "submit",
        "--plan",
        plan.to_str().unwrap(),
        "--callback",
        &receiver.url,
        "--watch",
        "--server",
        &grpc,
    ]);
    let out = text(&submitted);
    assert!(submitted.status.success(), "{out}");
    assert!(out.contains(&format!("callback {} signing secret whsec_", receiver.url)), "{out}");
    let goal = out.split_whitespace().nth(1).unwrap_or_default().to_owned();
    // The goal's own callback and the standing endpoint: two deliveries of its end.
    runtime.block_on(receiver.requests(2, Duration::from_secs(30)));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let shown = text(&hermes(&["webhooks", "deliveries", "--goal", &goal, "--server", &grpc]));
        if shown.matches("delivered").count() == 2 {
            assert!(shown.contains("goal.completed") && shown.contains(&id), "{shown}");
            break;
        }
        assert!(Instant::now() < deadline, "{shown}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let rotated = text(&hermes(&["webhooks", "rotate", &id, "--server", &grpc]));
    assert!(rotated.contains("new signing secret whsec_"), "{rotated}");
    let removed = hermes(&["webhooks", "remove", &id, "--server", &grpc]);
    assert!(removed.status.success(), "{}", text(&removed));
    let listed = text(&hermes(&["webhooks", "list", "--server", &grpc]));
    assert!(!listed.contains(&id), "{listed}");
    let missing = hermes(&["webhooks", "remove", &id, "--server", &grpc]);
    assert!(!missing.status.success() && text(&missing).contains("not found"), "{}", text(&missing));
}
