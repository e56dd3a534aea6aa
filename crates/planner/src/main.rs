//! `hermes-planner`: the planner as its own process.

use anyhow::Context;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "hermes-planner", version, about = "Hermes planner")]
struct Args {
    #[arg(long, env = "HERMES_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    #[command(flatten)]
    llm: hermes_llm::config::LlmArgs,
}

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hermes_core::telemetry::init_logging();
    let args = Args::parse();
    let model = args
        .llm
        .planner_model()?
        .context("the planner needs a model: set HERMES_LLM_BASE_URL and HERMES_LLM_MODEL")?;
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    let bus =
        hermes_core::Bus::connect(hermes_core::BusConfig::new(&args.nats_url).with_name("hermes-planner"))
            .await
            .context("failed to connect to NATS")?;
    hermes_planner::run(bus, hermes_planner::PlannerConfig::new(model), shutdown).await
}
