//! `hermes-executor`: executor agents as their own process.

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    // A lean idle agent (`hermes_executor::lean`), for this process and its worker.
    hermes_executor::lean::lean();
    // A child started to run one isolated tool job (a template render) does only that.
    hermes_executor::isolate::serve_if_child();
    // Runs as the child of a crash supervisor, so a task that crashes it is counted and
    // quarantined (see `hermes_executor::supervise`).
    hermes_executor::supervise::supervise_unless_child("hermes-executor");
    hermes_executor::isolate::enable();
    hermes_runtime::main::<hermes_executor::service::ExecutorService>()
}
