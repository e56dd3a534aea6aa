//! `hermes-registry`: the registry as its own process.

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
}

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    hermes_core::telemetry::init_logging();
    let args = Args::parse();
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    let bus =
        hermes_core::Bus::connect(hermes_core::BusConfig::new(&args.nats_url).with_name("hermes-registry"))
            .await
            .context("failed to connect to NATS")?;
    let config = hermes_registry::RegistryConfig {
        heartbeat_ttl: std::time::Duration::from_secs(args.heartbeat_ttl_secs),
    };
    hermes_registry::run(bus, config, shutdown).await
}
