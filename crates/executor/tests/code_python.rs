//! `code.python` in a real `python3` subprocess: results, no network, the time and memory
//! limits, the scratch dir, and its defaults (off, and gated by approval).

use std::time::Duration;

use hermes_executor::tools::{CodePython, CodePythonConfig};
use hermes_executor::{AgentConfig, ToolContext, ToolRegistry, build_registry};
use serde_json::{Value, json};

fn registry(config: CodePythonConfig) -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    registry.register(std::sync::Arc::new(CodePython::new(config))).unwrap();
    registry
}

fn unconfirmed() -> CodePythonConfig {
    CodePythonConfig { confirm: false, timeout: Duration::from_secs(5), ..Default::default() }
}

fn ctx() -> ToolContext {
    ToolContext { workspace: std::env::temp_dir(), task: None }
}

/// Whether this host lets an unprivileged process make a network namespace.
fn namespaces_allowed() -> bool {
    std::process::Command::new("unshare")
        .args(["--user", "--map-root-user", "--net", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

async fn run(registry: &ToolRegistry, code: &str) -> Result<Value, hermes_executor::ToolError> {
    registry.call("code.python", json!({"code": code}), &ctx()).await
}

#[tokio::test]
async fn a_snippet_runs_isolated_in_a_scratch_dir_or_the_tool_refuses() {
    let tools = registry(unconfirmed());
    if !namespaces_allowed() {
        let err = run(&tools, "print(1)").await.unwrap_err();
        assert_eq!(err.code.as_str(), "FAILED_PRECONDITION");
        assert!(err.message.contains("network namespace"), "{err}");
        return;
    }
    let out = run(&tools, "import json\nprint(json.dumps({'total': sum(range(10))}))").await.unwrap();
    assert_eq!(out["exit_code"], 0);
    assert_eq!(out["value"]["total"], 45);

    // A listener the host can reach; the snippet cannot.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let code = format!(
        "import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\nexcept OSError as e:\n    print('blocked')\n"
    );
    assert_eq!(run(&tools, &code).await.unwrap()["stdout"].as_str().unwrap().trim(), "blocked");

    // The working dir is a fresh scratch dir, gone afterwards, and the environment is empty.
    let out = run(
        &tools,
        "import os, json\nopen('f.txt','w').write('x')\nprint(json.dumps([os.getcwd(), sorted(os.environ)]))",
    )
    .await
    .unwrap();
    let cwd = out["value"][0].as_str().unwrap();
    assert!(cwd.contains("hermes-python-"), "{cwd}");
    assert!(!std::path::Path::new(cwd).exists());
    assert!(!out["value"][1].to_string().contains("CARGO"), "{}", out["value"][1]);

    // An error exit is a tool error naming the exception.
    let err = run(&tools, "1/0").await.unwrap_err();
    assert!(err.code.as_str() == "TOOL_ERROR" && err.message.contains("ZeroDivisionError"), "{err}");
}

#[tokio::test]
async fn the_time_and_memory_limits_hold() {
    if !namespaces_allowed() {
        return; // the refusal is covered above
    }
    let tools =
        registry(CodePythonConfig { timeout: Duration::from_secs(1), memory_mb: 128, ..unconfirmed() });
    let started = std::time::Instant::now();
    let err = run(&tools, "while True:\n    pass").await.unwrap_err();
    assert_eq!(err.code.as_str(), "TIMEOUT");
    assert!(started.elapsed() < Duration::from_secs(4), "{:?}", started.elapsed());
    let err = run(&tools, "x = bytearray(512 * 1024 * 1024)\nprint(len(x))").await.unwrap_err();
    assert!(err.message.contains("MemoryError"), "{err}");
}

#[tokio::test]
async fn code_python_is_off_by_default_and_asks_for_approval_when_on() {
    let workspace = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::new("py", workspace.path());
    let default_tools = build_registry(&config, None).await.unwrap();
    assert!(!default_tools.contains("code.python"));
    config.tools = vec!["code.python".into()];
    let err = build_registry(&config, None).await.err().unwrap();
    assert!(err.contains("disabled"), "{err}");
    config.code_python = Some(CodePythonConfig::default());
    let tools = build_registry(&config, None).await.unwrap();
    let spec = tools.specs().into_iter().find(|s| s.name == "code.python").unwrap();
    assert!(spec.require_confirm && spec.side_effects);
    // Outside a task nobody can approve, so the call is denied without running.
    let err = run(&tools, "print(1)").await.unwrap_err();
    assert_eq!(err.code.as_str(), "DENIED");
}
