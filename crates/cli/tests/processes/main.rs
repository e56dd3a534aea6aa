//! The `hermes` binary as processes against a real nats-server: the CLI, hostile input,
//! observability and grpcurl. (Tests that pair processes with an in-process stack are in
//! `tests/tests/e2e`, on the `Sandbox`.)
//!
//! One test binary, not one per file: each links the whole stack, and CI machines have two cores
//! and a bounded disk.

mod bus;
mod cli;
mod embedded;
mod footprint;
mod grpcurl;
mod hostile;
mod identities;
mod observability;
mod secrets;

/// The workspace root, where `hermes` finds `examples/` and `.tools/`.
fn repo_root() -> std::path::PathBuf {
    hermes_test_util::process::repo_root_from(env!("CARGO_MANIFEST_DIR"))
}

/// What `hermes up` prints on stdout up to and including its ready line, which it prints last.
fn said_until_ready(stdout: std::process::ChildStdout) -> Vec<String> {
    use std::io::BufRead;
    let mut said = Vec::new();
    for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
        let ready = line.starts_with("hermes up: grpc");
        said.push(line);
        if ready {
            break;
        }
    }
    said
}
