//! The `hermes` binary as processes against a real nats-server: the CLI, routing and failover,
//! hostile input, observability, grpcurl, and restarts mid-approval and mid-tool.
//!
//! One test binary, not one per file: each links the whole stack, and CI machines have two cores
//! and a bounded disk.

mod approval_restart;
mod cli;
mod grpcurl;
mod hostile;
mod ledger_kill;
mod observability;
mod routing;

/// The workspace root, where `hermes` finds `examples/` and `.tools/`.
fn repo_root() -> std::path::PathBuf {
    hermes_test_util::process::repo_root_from(env!("CARGO_MANIFEST_DIR"))
}
