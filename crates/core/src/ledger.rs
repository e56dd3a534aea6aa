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
use bytes::Bytes;

use crate::{Error, Result};

/// The prefix of crash markers' keys.
pub const CRASH_MARKER_PREFIX: &str = "inflight.";

/// The ledger. Cheap to clone.
#[derive(Clone)]
pub struct LedgerStore {
    kv: kv::Store,
}

/// An entry as stored, with what a compare-and-set needs.
#[derive(Debug, Clone)]
pub struct LedgerEntry {
    pub value: Bytes,
    pub revision: u64,
    /// When this revision was written, in Unix milliseconds.
    pub written_unix_ms: i128,
    /// False when the key's last entry is a delete marker.
    pub live: bool,
}

impl LedgerStore {
    pub fn new(kv: kv::Store) -> Self {
        Self { kv }
    }

    /// Writes `value` under `key` unless the key holds a live entry: `true` when this call wrote
    /// it, `false` when one was there already.
    pub async fn create(&self, key: &str, value: Bytes) -> Result<bool> {
        match self.kv.create(key, value).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(Error::jetstream("create a ledger entry", e)),
        }
    }

    /// The entry under `key`, live or a delete marker; `None` when the key never had one.
    pub async fn entry(&self, key: &str) -> Result<Option<LedgerEntry>> {
        let entry = self.kv.entry(key).await.map_err(|e| Error::jetstream("read a ledger entry", e))?;
        Ok(entry.map(|entry| LedgerEntry {
            live: entry.operation == kv::Operation::Put,
            written_unix_ms: entry.created.unix_timestamp_nanos() / 1_000_000,
            revision: entry.revision,
            value: entry.value,
        }))
    }

    /// The live value under `key`, if any.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        self.kv.get(key).await.map_err(|e| Error::jetstream("read a ledger entry", e))
    }

    /// Replaces the entry under `key` if it is still at `revision` (a compare-and-set).
    pub async fn replace(&self, key: &str, value: Bytes, revision: u64) -> Result<()> {
        self.kv
            .update(key, value, revision)
            .await
            .map_err(|e| Error::jetstream("replace a ledger entry", e))?;
        Ok(())
    }

    /// Writes `value` under `key`, whatever was there.
    pub async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        self.kv.put(key, value).await.map_err(|e| Error::jetstream("write a ledger entry", e))?;
        Ok(())
    }

    /// Removes the entry under `key` (it leaves a delete marker).
    pub async fn remove(&self, key: &str) -> Result<()> {
        self.kv.delete(key).await.map_err(|e| Error::jetstream("remove a ledger entry", e))?;
        Ok(())
    }

    /// Every key in the ledger, sorted (side-effect entries and crash markers).
    pub async fn keys(&self) -> Result<Vec<String>> {
        crate::kv::kv_keys(&self.kv, "list the ledger").await
    }
}
