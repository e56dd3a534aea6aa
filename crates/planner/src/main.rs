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
    /// Serve Prometheus metrics on this address (`/metrics`); unset: no endpoint.
    #[arg(long, env = "HERMES_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
}

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = hermes_core::telemetry::init("hermes-planner");
    let model = args
        .llm
        .planner_model()?
        .context("the planner needs a model: set HERMES_LLM_BASE_URL and HERMES_LLM_MODEL")?;
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    hermes_core::metrics::serve_if(args.metrics_listen, shutdown.clone()).await?;
    let bus =
        hermes_core::Bus::connect(hermes_core::BusConfig::new(&args.nats_url).with_name("hermes-planner"))
            .await
            .context("failed to connect to NATS")?;
    hermes_planner::run(bus, hermes_planner::PlannerConfig::new(model), shutdown).await
}
