//! The one owner of the `hermes_ledger` bucket. It holds two kinds of entries, both written by
//! agents:
//!
//! - **side-effect entries**, under a call's key (`<goal>.<node>.<call>.<args hash>`): claimed
//!   with a create before a side-effecting tool runs, then replaced by the call's outcome, so a
//!   redelivery or a later attempt reuses the outcome instead of running the call again
//!   (`hermes_executor`'s tool registry decides what the entries mean);
//! - **crash markers**, under `inflight.<goal>.<node>`: how many processes the node's task was
//!   running in when they crashed, written by the process that follows a crash (the Rust
//!   executor's supervisor knows what its worker ran without writing here; the Python SDK's
//!   worker still sets a marker while each task runs) and cleared once the task runs to an end.
//!
//! The values are the executor's JSON; this module owns the bucket's operations and their errors.

use async_nats::jetstream::kv;

/// The prefix of crash markers' keys.
pub const CRASH_MARKER_PREFIX: &str = "inflight.";

/// The ledger: the bucket, or on an agent's own identity one task's entries through the memory
/// service ([`crate::broker`]). Cheap to clone.
pub type LedgerStore = crate::task_kv::TaskKv;
/// An entry as stored, with what a compare-and-set needs.
pub type LedgerEntry = crate::task_kv::KvEntry;

/// The ledger of the bucket `kv`.
pub fn store(kv: kv::Store) -> LedgerStore {
    crate::task_kv::TaskKv::new(kv, crate::task_kv::LEDGER)
}
