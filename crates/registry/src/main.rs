//! `hermes-registry`: the registry as its own process, with its gRPC API.

use anyhow::Context;
use clap::Parser;

#[derive(Parser, Debug)]
#[command(name = "hermes-registry", version, about = "Hermes agent registry")]
struct Args {
    #[arg(long, env = "HERMES_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    nats_url: String,
    /// Seconds without a heartbeat after which an agent is offline.
    #[arg(long, env = "HERMES_HEARTBEAT_TTL_SECS", default_value_t = 30)]
    heartbeat_ttl_secs: u64,
    /// Address the Registry gRPC API listens on.
    #[arg(long, env = "HERMES_REGISTRY_GRPC_LISTEN", default_value = "127.0.0.1:50052")]
    grpc_listen: std::net::SocketAddr,
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
    let _telemetry = hermes_core::telemetry::init("hermes-registry");
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    hermes_core::metrics::serve_if(args.metrics_listen, shutdown.clone()).await?;
    let bus =
        hermes_core::Bus::connect(hermes_core::BusConfig::new(&args.nats_url).with_name("hermes-registry"))
            .await
            .context("failed to connect to NATS")?;
    let registry = hermes_registry::Registry::new(hermes_registry::RegistryConfig {
        heartbeat_ttl: std::time::Duration::from_secs(args.heartbeat_ttl_secs),
    });
    let listener = tokio::net::TcpListener::bind(args.grpc_listen)
        .await
        .with_context(|| format!("cannot listen for gRPC on {}", args.grpc_listen))?;
    let mut routes = tonic::service::RoutesBuilder::default();
    routes.add_service(hermes_registry::RegistryGrpc::new(registry.clone(), shutdown.clone()).into_service());
    let limit = hermes_core::grpc::DEFAULT_MAX_MESSAGE_BYTES;
    let grpc = hermes_core::grpc::serve(
        listener,
        routes,
        &["hermes.v1.Registry"],
        limit,
        "the default gRPC limit",
        shutdown.clone(),
    );
    let (nats, grpc) = tokio::join!(hermes_registry::run(bus, registry, shutdown.clone()), grpc);
    grpc.context("registry gRPC server failed")?;
    nats
}
