//! `hermes-memory`: the memory service as its own process, with its gRPC API.

// mimalloc: glibc malloc showed up at ~17% of CPU under load in `make bench`.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    hermes_runtime::main::<hermes_memory::service::MemoryService>()
}
