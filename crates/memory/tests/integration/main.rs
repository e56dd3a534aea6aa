//! The memory service against a real nats-server: persistence across restarts, the vector
//! index's snapshots, and the embedded MiniLM model (with the `local` feature).
//!
//! One test binary, not one per file, to keep links and disk down on CI machines.

mod minilm;
mod persistence;
mod snapshots;
