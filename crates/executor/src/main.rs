//! `hermes-executor`: one executor agent as its own process.

use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "hermes-executor", version, about = "Hermes executor agent")]
struct Args {
    #[command(flatten)]
    agent: hermes_executor::cli::AgentArgs,
}

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = hermes_core::telemetry::init("hermes-agent");
    hermes_executor::cli::run_agent(args.agent).await
}
