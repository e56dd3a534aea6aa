//! The real grpcurl (1.8.6, as the package registries ship it; `make tools` installs it) lists
//! and describes `hermes up`'s services by server reflection, with no proto files. grpcurl 1.8
//! speaks only `grpc.reflection.v1alpha`, so this fails if that version is not served.

use std::path::PathBuf;
use std::process::Command;

use hermes_test_util::process::{HermesUp, repo_root_from};

fn grpcurl() -> PathBuf {
    let path = std::env::var_os("HERMES_GRPCURL_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root_from(env!("CARGO_MANIFEST_DIR")).join(".tools/bin/grpcurl"));
    assert!(path.exists(), "{} is missing: run `make tools`", path.display());
    path
}

fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(grpcurl()).args(args).output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

#[test]
fn grpcurl_lists_and_describes_the_api_by_reflection() {
    let data = tempfile::tempdir().unwrap();
    let nats = hermes_test_util::NatsServer::start();
    let up = HermesUp::builder(env!("CARGO_BIN_EXE_hermes"), data.path())
        .nats_url(&nats.url())
        .current_dir(repo_root_from(env!("CARGO_MANIFEST_DIR")))
        .env("HERMES_LLM_PROVIDER", "none")
        .start();
    let (ok, listed) = run(&["-plaintext", &up.grpc, "list"]);
    assert!(ok, "{listed}");
    for service in ["hermes.v1.Dispatcher", "grpc.health.v1.Health"] {
        assert!(listed.lines().any(|l| l.trim() == service), "{service} not listed:\n{listed}");
    }
    let (ok, described) = run(&["-plaintext", &up.grpc, "describe", "hermes.v1.Dispatcher"]);
    assert!(ok, "{described}");
    for rpc in ["rpc SubmitGoal", "rpc WatchGoal", "rpc ApproveToolCall"] {
        assert!(described.contains(rpc), "{rpc} missing:\n{described}");
    }
    let (ok, message) = run(&["-plaintext", &up.grpc, "describe", "hermes.v1.WatchGoalRequest"]);
    assert!(ok && message.contains("after_seq"), "{message}");
    // Health answers for the server and for the Dispatcher service by name.
    let (ok, health) = run(&[
        "-plaintext",
        "-d",
        r#"{"service": "hermes.v1.Dispatcher"}"#,
        &up.grpc,
        "grpc.health.v1.Health/Check",
    ]);
    assert!(ok && health.contains("SERVING"), "{health}");
    // A call through reflection alone: a bad id is INVALID_ARGUMENT naming it.
    let (ok, reply) =
        run(&["-plaintext", "-d", r#"{"goal_id": "../etc"}"#, &up.grpc, "hermes.v1.Dispatcher/GetGoal"]);
    assert!(!ok, "{reply}");
    assert!(reply.contains("InvalidArgument") && reply.contains("goal_id"), "{reply}");
}
