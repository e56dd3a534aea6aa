//! Footprint: the resident memory of Hermes's own binaries as an operator runs them, each its own
//! process on its own nats-server: an idle agent (`hermes-executor`), and a dispatcher
//! (`hermes-dispatcher`) idle and after it has run goals whose states stay retained in KV.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::registry_client::RegistryClient;
use hermes_test_util::process::HermesProcess;

use crate::Completions;

/// What [`measure`] found, in bytes.
pub struct Footprint {
    pub agent_idle: u64,
    pub dispatcher_idle: u64,
    pub dispatcher_after: u64,
    /// How many goals the dispatcher ran before `dispatcher_after`.
    pub goals: usize,
}

/// A service binary built beside this one (`make bench` builds them), or why not.
fn sibling(name: &str) -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    let path = exe.with_file_name(name);
    if path.is_file() { Ok(path) } else { Err(format!("{} is not built", path.display())) }
}

fn free_addr() -> String {
    format!("127.0.0.1:{}", hermes_test_util::free_port())
}

/// Starts a registry, a dispatcher and one agent, each its own process; measures the agent and
/// the dispatcher idle, runs `goals` single-node goals with `in_flight` at a time, and measures
/// the dispatcher again. `Err(why)` when the binaries are not built.
pub async fn measure(goals: usize, in_flight: usize) -> anyhow::Result<Result<Footprint, String>> {
    let binaries =
        match (sibling("hermes-registry"), sibling("hermes-dispatcher"), sibling("hermes-executor")) {
            (Ok(r), Ok(d), Ok(e)) => (r, d, e),
            (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => return Ok(Err(why)),
        };
    let nats = hermes_test_util::NatsServer::start();
    let dir = tempfile::tempdir()?;
    let url = nats.url();
    let start = |binary: &PathBuf, name: &str, args: &[&str]| {
        let mut all = vec!["--nats-url", url.as_str()];
        all.extend_from_slice(args);
        HermesProcess::start_logged(binary, &all, &dir.path().join(format!("{name}.log")))
    };
    let grpc = free_addr();
    let dispatcher = start(
        &binaries.1,
        "dispatcher",
        &["--grpc-listen", &grpc, "--dispatcher-http-listen", "off", "--llm-provider", "none"],
    );
    let client = connect(&grpc, |c| async move { DispatcherClient::connect(c).await.ok() }).await?;
    let registry_addr = free_addr();
    let _registry = start(&binaries.0, "registry", &["--grpc-listen", &registry_addr]);
    let workspace = dir.path().to_str().context("a UTF-8 temp dir")?.to_owned();
    let agent = start(
        &binaries.2,
        "agent",
        &["--agent-id", "footprint-1", "--agent-tools", "math.evaluate", "--agent-workspace", &workspace],
    );
    let mut registry =
        connect(&registry_addr, |c| async move { RegistryClient::connect(c).await.ok() }).await?;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let listed = registry.list_agents(hermes_proto::ListAgentsRequest {}).await;
        if listed.is_ok_and(|l| !l.into_inner().agents.is_empty()) {
            break;
        }
        anyhow::ensure!(Instant::now() < deadline, "the footprint agent did not register within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Settled: the first heartbeats and catalogue writes are behind them.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let agent_idle = agent.rss();
    let dispatcher_idle = dispatcher.rss();
    let events = async_nats::connect(nats.url()).await?;
    let done = Completions::start(&events).await?;
    crate::run_goals(&client, &done, goals, in_flight).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let dispatcher_after = dispatcher.rss();
    Ok(Ok(Footprint { agent_idle, dispatcher_idle, dispatcher_after, goals }))
}

/// A gRPC client of `addr`, once it answers (within 60 s).
async fn connect<C, F, Fut>(addr: &str, client: F) -> anyhow::Result<C>
where
    F: Fn(String) -> Fut,
    Fut: std::future::Future<Output = Option<C>>,
{
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Some(c) = client(format!("http://{addr}")).await {
            return Ok(c);
        }
        anyhow::ensure!(Instant::now() < deadline, "{addr} did not answer within 60 s");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Prints the footprint table.
pub fn rows(footprint: &Result<Footprint, String>) {
    let mb = |b: u64| b as f64 / (1024.0 * 1024.0);
    println!("\n{:<58} {:>12}", "footprint: resident memory of the binaries (MB)", "value");
    println!("{}", "-".repeat(71));
    match footprint {
        Ok(f) => {
            println!("{:<58} {:>12.1}", "idle agent (hermes-executor)", mb(f.agent_idle));
            println!("{:<58} {:>12.1}", "dispatcher (hermes-dispatcher), idle", mb(f.dispatcher_idle));
            println!(
                "{:<58} {:>12.1}",
                format!("dispatcher after {} goals, retained in KV", f.goals),
                mb(f.dispatcher_after)
            );
            println!("goal: an idle agent (supervisor and worker) at most 25 MB.");
        }
        Err(why) => println!("not measured: {why} (`make bench` builds the service binaries)"),
    }
}
