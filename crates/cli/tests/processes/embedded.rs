//! With nothing configured, `hermes up` plans goals given as text on the embedded model
//! (Qwen2.5-Coder-0.5B-Instruct, which `make models` installs), and `hermes submit "<text>"
//! --watch` completes the shipped text goals of `examples/text-goals.txt` with the right value.
//!
//! Runs when `HERMES_QWEN_MODEL` names the model (the Makefile sets it); a path that does not
//! exist fails the test. Slow: the first plan of a process reads the whole catalogue (about
//! 100 s on 2 cores), each later one about 20 s.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use hermes_test_util::process::HermesUp;

use crate::repo_root;

/// The goals and their expected values: `<goal> => <text the output must contain>` per line.
fn shipped_goals() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(repo_root().join("examples/text-goals.txt")).unwrap();
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|line| {
            let (goal, expected) = line.split_once(" => ").expect("`<goal> => <expected>`");
            (goal.trim().to_owned(), expected.trim().to_owned())
        })
        .collect()
}

#[test]
fn hermes_up_with_nothing_configured_completes_the_shipped_text_goals() {
    let Some(model) = std::env::var_os("HERMES_QWEN_MODEL").map(PathBuf::from) else {
        println!("skipped: HERMES_QWEN_MODEL is not set (make test sets it)");
        return;
    };
    assert!(
        model.is_file(),
        "HERMES_QWEN_MODEL names {}, which does not exist (make models)",
        model.display()
    );
    let goals = shipped_goals();
    assert!(goals.len() >= 3, "examples/text-goals.txt ships at least three goals");

    // A fresh working directory laid out like a checkout after `make models`: the model where
    // `hermes up` looks by default, and the example data as the agents' workspace.
    let cwd = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(cwd.path().join(".tools/models")).unwrap();
    std::os::unix::fs::symlink(&model, cwd.path().join(hermes_llm::config::EMBEDDED_MODEL_PATH)).unwrap();
    for entry in std::fs::read_dir(repo_root().join("examples/data")).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), cwd.path().join(entry.file_name())).unwrap();
    }
    let up = HermesUp::builder(env!("CARGO_BIN_EXE_hermes"), &cwd.path().join(".hermes"))
        .args(["--workspace", "."])
        .current_dir(cwd.path())
        .stderr_file(&cwd.path().join("up.log"))
        .ready_within(Duration::from_secs(240))
        .start();

    for (goal, expected) in &goals {
        let out = Command::new(env!("CARGO_BIN_EXE_hermes"))
            .args(["submit", goal, "--watch", "--server", &up.grpc])
            .current_dir(cwd.path())
            .output()
            .unwrap();
        let shown =
            format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(out.status.success(), "`{goal}` did not complete:\n{shown}");
        assert!(shown.contains("] completed"), "`{goal}`:\n{shown}");
        assert!(shown.contains(expected.as_str()), "`{goal}` should answer {expected}:\n{shown}");
    }
}

/// Without the embedded model installed, `hermes up` says so at start and text goals are refused
/// with the reason; plans still run.
#[test]
fn hermes_up_without_the_embedded_model_says_so_and_refuses_text_goals() {
    let cwd = tempfile::tempdir().unwrap();
    let grpc = format!("127.0.0.1:{}", hermes_test_util::free_port());
    let mut child = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["up", "--grpc-listen", &grpc, "--http-listen", "127.0.0.1:0", "--data-dir", ".hermes"])
        .current_dir(cwd.path())
        .env_remove("HERMES_NATS_URL")
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let _up = Killed(child);
    let said = crate::said_until_ready(stdout);
    assert!(
        said.iter().any(|l| l.contains("no model configured and the embedded model")
            && l.contains("is not installed (run `make models`)")),
        "{said:?}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_hermes"))
        .args(["submit", "What is 2 + 2?", "--server", &grpc])
        .current_dir(cwd.path())
        .output()
        .unwrap();
    let shown = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success(), "{shown}");
    assert!(shown.contains("no planner configured"), "{shown}");
}

/// Kills the process on drop (`hermes up` takes its nats-server with it).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
