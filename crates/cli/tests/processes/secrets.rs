//! No credential in any output (docs/security.md, "What is redacted where"): every line a whole
//! `hermes up` run writes, at debug level, with the CLI submitting, watching and listing with a
//! token, and every line of a failing NATS connect (refused, a malformed URL, a TLS handshake
//! with a plain server), holds neither the NATS password nor an API token.

use crate::repo_root;
use std::io::{BufRead, BufReader};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use hermes_test_util::process::built_binary;

const TOKEN: &str = "tok-9f3c2a7d41e8b6050c1d";

fn all_of(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The lines of `said` that hold any of `secrets`, each cut short.
fn leaks(said: &str, secrets: &[&str]) -> Vec<String> {
    said.lines()
        .filter(|line| secrets.iter().any(|s| line.contains(s)))
        .map(|line| line.chars().take(400).collect())
        .collect()
}

#[test]
fn a_whole_run_prints_neither_the_nats_password_nor_a_token() {
    let data = tempfile::tempdir().unwrap();
    let tokens = data.path().join("tokens.toml");
    std::fs::write(
        &tokens,
        hermes_test_util::api_token("me", TOKEN, "team-a", &["submitter", "operator", "viewer"]),
    )
    .unwrap();
    let stderr_log = data.path().join("up.stderr");
    let listen = format!("127.0.0.1:{}", hermes_test_util::free_port());
    let mut up = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["up", "--grpc-listen", &listen, "--http-listen", "127.0.0.1:0", "--data-dir"])
        .arg(data.path().join("data"))
        .arg("--dispatcher-api-tokens-file")
        .arg(&tokens)
        .current_dir(repo_root())
        .env("HERMES_LLM_PROVIDER", "none")
        // Debug level: the dependencies' own logs (async-nats prints the server it dials) too.
        .env("RUST_LOG", "debug")
        .env_remove("HERMES_NATS_URL")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&stderr_log).unwrap())
        .spawn()
        .unwrap();
    let stdout = up.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut said = String::new();
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if line.starts_with("hermes up: grpc") {
                let _ = tx.send(line.clone());
            }
            said.push_str(&line);
            said.push('\n');
        }
        said
    });
    let ready = rx.recv_timeout(Duration::from_secs(60)).expect("hermes up becomes ready");
    let http = ready.rsplit("http ").next().unwrap().trim().to_owned();

    let hermes = |args: &[&str]| {
        let mut all = args.to_vec();
        all.extend(["--server", &listen, "--token", TOKEN]);
        Command::new(env!("CARGO_BIN_EXE_hermes")).args(&all).current_dir(repo_root()).output().unwrap()
    };
    let mut said = Vec::new();
    let submitted = hermes(&["submit", "--plan", "examples/plans/first-goal.yaml", "--watch"]);
    assert!(submitted.status.success(), "{}", all_of(&submitted));
    assert!(all_of(&submitted).contains("Q1 sales (200)"), "{}", all_of(&submitted));
    let listed = hermes(&["list"]);
    assert!(listed.status.success(), "{}", all_of(&listed));
    let goal_id = String::from_utf8_lossy(&listed.stdout)
        .split_whitespace()
        .find(|w| w.starts_with("g-"))
        .expect("the goal is listed")
        .to_owned();
    for args in
        [vec!["get", goal_id.as_str()], vec!["watch", goal_id.as_str()], vec!["agents"], vec!["audit"]]
    {
        let out = hermes(&args);
        assert!(out.status.success(), "{args:?}: {}", all_of(&out));
        said.push(all_of(&out));
    }
    said.push(all_of(&submitted));
    said.push(all_of(&listed));
    // A refused token is not echoed either.
    let refused = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["list", "--server", &listen, "--token", "tok-wrong-7b1e0c55aa"])
        .output()
        .unwrap();
    assert!(!refused.status.success());
    said.push(all_of(&refused));
    // The HTTP door, with the token as a bearer.
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let events = runtime.block_on(async {
        let client = reqwest::Client::new();
        let url = format!("http://{http}/v1/goals/{goal_id}/events");
        let response = client.get(url).bearer_auth(TOKEN).send().await.unwrap();
        assert!(response.status().is_success(), "{}", response.status());
        response.text().await.unwrap()
    });
    assert!(
        events.to_lowercase().replace('_', "").contains("goalcompleted"),
        "the stream ends with the goal: {events}"
    );
    said.push(events);

    let password = {
        let auth = std::fs::read_to_string(data.path().join("data/nats/auth.conf")).unwrap();
        auth.lines()
            .find_map(|l| l.trim().strip_prefix("password:"))
            .unwrap()
            .trim()
            .trim_matches('"')
            .to_owned()
    };
    // `hermes nats-url` is the one command made to print it, for another process to join with.
    let joined = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .arg("nats-url")
        .arg("--data-dir")
        .arg(data.path().join("data"))
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&joined.stdout).contains(&password), "the password is in auth.conf");

    // SIGTERM, so the drain's lines are in the log too.
    let _ = Command::new("kill").args(["-TERM", &up.id().to_string()]).status();
    let deadline = Instant::now() + Duration::from_secs(30);
    while up.try_wait().unwrap().is_none() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = up.kill();
    let _ = up.wait();
    said.push(reader.join().unwrap());
    let log = std::fs::read_to_string(&stderr_log).unwrap();
    assert!(log.contains("hermes stack ready") && log.contains("async_nats"), "the log is the whole run's");
    assert!(log.lines().count() > 100, "a debug log of the run: {} lines", log.lines().count());
    said.push(log);

    let found = leaks(&said.join("\n"), &[&password, TOKEN]);
    assert!(found.is_empty(), "a credential was printed:\n{}", found.join("\n"));
}

#[test]
fn a_failing_nats_connect_prints_no_password() {
    let plain = hermes_test_util::NatsServer::start();
    let closed = hermes_test_util::free_port();
    let password = "pw-5e0d9b3c27a14f86";
    let cases = [
        ("refused", format!("nats://hermes:{password}@127.0.0.1:{closed}"), "cannot connect to NATS"),
        ("a malformed URL", format!("nats://hermes:{password}@[not-a-host:x"), "cannot connect to NATS"),
        (
            "a TLS error",
            format!("tls://hermes:{password}@127.0.0.1:{}", plain.port()),
            "cannot connect to NATS",
        ),
        ("a token", format!("nats://{password}@127.0.0.1:{closed}"), "cannot connect to NATS"),
    ];
    for (what, url, says) in &cases {
        // A service binary, which connects once and exits on failure.
        let out = Command::new(built_binary("hermes-registry"))
            .env("HERMES_NATS_URL", url)
            .env("RUST_LOG", "debug")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let said = all_of(&out);
        assert!(!out.status.success(), "{what}: {said}");
        assert!(said.contains(says), "{what}: {said}");
        let found = leaks(&said, &[password]);
        assert!(found.is_empty(), "{what}: the password was printed:\n{}", found.join("\n"));
    }
    // `hermes up` says it cannot reach a server over TLS, without the password; and its
    // `--print-config` masks it.
    let data = tempfile::tempdir().unwrap();
    let tls = &cases[2].1;
    let out = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["up", "--grpc-listen", "127.0.0.1:0", "--http-listen", "off", "--nats-url", tls, "--data-dir"])
        .arg(data.path())
        .env("HERMES_LLM_PROVIDER", "none")
        .env("RUST_LOG", "debug")
        .current_dir(repo_root())
        .output()
        .unwrap();
    let said = all_of(&out);
    assert!(!out.status.success(), "{said}");
    assert!(said.contains("cannot connect to NATS at tls://127.0.0.1:"), "{said}");
    let printed = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["up", "--print-config", "--nats-url", tls])
        .output()
        .unwrap();
    let config = all_of(&printed);
    assert!(printed.status.success() && config.contains("tls://"), "{config}");
    for said in [said, config] {
        let found = leaks(&said, &[password]);
        assert!(found.is_empty(), "the password was printed:\n{}", found.join("\n"));
    }
}
