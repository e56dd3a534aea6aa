//! `hermes-planner`: the planner as its own process.

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    hermes_runtime::main::<hermes_planner::service::PlannerService>()
}
