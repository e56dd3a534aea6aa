//! `hermes-dispatcher`: the dispatcher as its own process.

use anyhow::Context;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "hermes-dispatcher", version, about = "Hermes dispatcher and gRPC API")]
struct Args {
    #[arg(long, env = "HERMES_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Address the gRPC API listens on.
    #[arg(long, env = "HERMES_GRPC_LISTEN", default_value = "127.0.0.1:50051")]
    grpc_listen: std::net::SocketAddr,
    /// Most nodes a plan may have.
    #[arg(long, env = "HERMES_MAX_NODES", default_value_t = hermes_core::plan::DEFAULT_MAX_NODES)]
    max_nodes: usize,
    /// A planner service (`hermes-planner`) runs in this deployment: accept goals given as text.
    #[arg(long, env = "HERMES_PLANNER_SERVICE")]
    planner: bool,
    /// The model that writes the answers of goals given as text (the summarizer); see docs/llm.md.
    #[command(flatten)]
    llm: hermes_llm::config::LlmArgs,
    /// Serve Prometheus metrics on this address (`/metrics`); unset: no endpoint.
    #[arg(long, env = "HERMES_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    #[command(flatten)]
    limits: hermes_dispatcher::cli::LimitArgs,
}

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let _telemetry = hermes_core::telemetry::init("hermes-dispatcher");
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    hermes_core::metrics::serve_if(args.metrics_listen, shutdown.clone()).await?;
    let bus =
        hermes_core::Bus::connect(hermes_core::BusConfig::new(&args.nats_url).with_name("hermes-dispatcher"))
            .await
            .context("failed to connect to NATS")?;
    let mut config = hermes_dispatcher::DispatcherConfig {
        grpc_listen: args.grpc_listen,
        max_nodes: args.max_nodes,
        planner: args.planner,
        summarizer: args.llm.summarizer_model()?.map(hermes_dispatcher::summarize::Summarizer),
        prices: hermes_dispatcher::engine::Prices {
            input_per_mtok: args.llm.price_input_per_mtok,
            output_per_mtok: args.llm.price_output_per_mtok,
        },
        ..Default::default()
    };
    args.limits.apply(&mut config);
    let dispatcher = hermes_dispatcher::Dispatcher::build(bus, config).await?;
    dispatcher.run(shutdown).await
}
