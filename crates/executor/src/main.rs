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

fn main() -> anyhow::Result<()> {
    // A child started to run one isolated tool job (a template render) does only that.
    hermes_executor::isolate::serve_if_child();
    // Runs as the child of a crash supervisor, so a task that crashes it is counted and
    // quarantined (see `hermes_executor::supervise`).
    hermes_executor::supervise::supervise_unless_child("hermes-executor");
    hermes_executor::isolate::enable();
    let args = Args::parse();
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(async {
        let _telemetry = hermes_core::telemetry::init("hermes-agent");
        hermes_executor::cli::run_agent(args.agent).await
    })
}
