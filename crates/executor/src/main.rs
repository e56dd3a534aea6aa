//! `hermes-executor`: one executor agent as its own process.

use anyhow::Context;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "hermes-executor", version, about = "Hermes executor agent")]
struct Args {
    /// NATS server URL.
    #[arg(long, env = "HERMES_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Agent id; unique among live agents.
    #[arg(long, env = "HERMES_AGENT_ID")]
    agent_id: String,
    /// Pool this agent belongs to.
    #[arg(long, env = "HERMES_AGENT_POOL", default_value = "default")]
    pool: String,
    /// Comma-separated tools to serve; empty serves every built-in tool.
    #[arg(long, env = "HERMES_AGENT_TOOLS", value_delimiter = ',', default_value = "")]
    tools: Vec<String>,
    /// Tasks run at once.
    #[arg(long, env = "HERMES_AGENT_MAX_CONCURRENCY", default_value_t = 16)]
    max_concurrency: u32,
    /// Dir that file tools may read.
    #[arg(long, env = "HERMES_AGENT_WORKSPACE", default_value = ".")]
    workspace: std::path::PathBuf,
}

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hermes_core::telemetry::init_logging();
    let args = Args::parse();
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    let bus = hermes_core::Bus::connect(
        hermes_core::BusConfig::new(&args.nats_url).with_name(format!("hermes-executor-{}", args.agent_id)),
    )
    .await
    .context("failed to connect to NATS")?;
    let mut config = hermes_executor::AgentConfig::new(args.agent_id, args.workspace);
    config.pool = args.pool;
    config.tools = args.tools.into_iter().filter(|t| !t.is_empty()).collect();
    config.max_concurrency = args.max_concurrency;
    let agent = hermes_executor::Agent::build(bus, config).await.context("failed to start the agent")?;
    agent.run(shutdown).await.context("agent failed")?;
    Ok(())
}
