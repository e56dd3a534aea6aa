//! `hermes-memory`: the memory service as its own process, with its gRPC API.

use anyhow::Context;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "hermes-memory", version, about = "Hermes memory service")]
struct Args {
    #[arg(long, env = "HERMES_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Address the Memory gRPC API listens on.
    #[arg(long, env = "HERMES_MEMORY_GRPC_LISTEN", default_value = "127.0.0.1:50053")]
    grpc_listen: std::net::SocketAddr,
    #[command(flatten)]
    memory: hermes_memory::MemoryArgs,
    /// The model that folds old session turns (the summarizer model); see docs/llm.md.
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
    let _telemetry = hermes_core::telemetry::init("hermes-memory");
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    hermes_core::metrics::serve_if(args.metrics_listen, shutdown.clone()).await?;
    let bus_config = hermes_core::BusConfig::new(&args.nats_url).with_name("hermes-memory");
    let bus = hermes_core::Bus::connect(bus_config).await.context("failed to connect to NATS")?;
    let config = args.memory.to_config(&args.llm)?;
    let memory = hermes_memory::Memory::open(bus, config, shutdown.clone()).await?;
    let listener = tokio::net::TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("cannot listen for gRPC on {}", args.grpc_listen))?;
    let mut routes = tonic::service::RoutesBuilder::default();
    routes.add_service(hermes_memory::grpc::MemoryGrpc::new(memory.clone()).into_service());
    let limit = hermes_core::grpc::DEFAULT_MAX_MESSAGE_BYTES;
    let grpc = hermes_core::grpc::serve(
        listener,
        routes,
        &["hermes.v1.Memory"],
        limit,
        "the default gRPC limit",
        shutdown.clone(),
    );
    let (nats, grpc) = tokio::join!(hermes_memory::run(memory, shutdown.clone()), grpc);
    grpc.context("memory gRPC server failed")?;
    nats
}
