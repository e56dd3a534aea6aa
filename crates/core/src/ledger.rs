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
use hermes_proto::{LedgerOp, LedgerReply, LedgerRequest};

use crate::broker::TaskBroker;
use crate::{Error, Result};

/// The prefix of crash markers' keys.
pub const CRASH_MARKER_PREFIX: &str = "inflight.";

/// The ledger. Cheap to clone.
#[derive(Clone)]
pub struct LedgerStore {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    /// The bucket itself.
    Bucket(std::sync::Arc<kv::Store>),
    /// One task's entries, through the memory service (an agent with its own identity).
    Brokered(TaskBroker),
    /// Neither: an agent's identity asked for the whole ledger (it may not read it).
    Closed,
}

fn closed() -> Error {
    Error::FailedPrecondition(
        "this connection is an agent's own identity: it reaches the ledger only through a task's token (Bus::task_ledger)"
            .into(),
    )
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
        Self { backend: Backend::Bucket(std::sync::Arc::new(kv)) }
    }

    /// One task's entries through the memory service (see [`crate::broker`]).
    pub fn brokered(broker: TaskBroker) -> Self {
        Self { backend: Backend::Brokered(broker) }
    }

    /// A ledger every operation of which is refused, for a connection that may not read it.
    pub(crate) fn closed() -> Self {
        Self { backend: Backend::Closed }
    }

    async fn broker(
        &self,
        broker: &TaskBroker,
        op: LedgerOp,
        key: &str,
        value: Bytes,
        revision: u64,
    ) -> Result<LedgerReply> {
        let request = LedgerRequest {
            task_token: broker.token().to_owned(),
            op: op as i32,
            key: key.to_owned(),
            value: value.to_vec(),
            revision,
        };
        broker.call("ledger", &request).await
    }

    /// Writes `value` under `key` unless the key holds a live entry: `true` when this call wrote
    /// it, `false` when one was there already.
    pub async fn create(&self, key: &str, value: Bytes) -> Result<bool> {
        match &self.backend {
            Backend::Bucket(kv) => match kv.create(key, value).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(Error::jetstream("create a ledger entry", e)),
            },
            Backend::Brokered(b) => Ok(self.broker(b, LedgerOp::Create, key, value, 0).await?.created),
            Backend::Closed => Err(closed()),
        }
    }

    /// The entry under `key`, live or a delete marker; `None` when the key never had one.
    pub async fn entry(&self, key: &str) -> Result<Option<LedgerEntry>> {
        match &self.backend {
            Backend::Bucket(kv) => {
                let entry = kv.entry(key).await.map_err(|e| Error::jetstream("read a ledger entry", e))?;
                Ok(entry.map(|entry| LedgerEntry {
                    live: entry.operation == kv::Operation::Put,
                    written_unix_ms: entry.created.unix_timestamp_nanos() / 1_000_000,
                    revision: entry.revision,
                    value: entry.value,
                }))
            }
            Backend::Brokered(b) => {
                let reply = self.broker(b, LedgerOp::Entry, key, Bytes::new(), 0).await?;
                Ok(reply.found.then(|| LedgerEntry {
                    live: reply.live,
                    written_unix_ms: i128::from(reply.written_unix_ms),
                    revision: reply.revision,
                    value: reply.value.into(),
                }))
            }
            Backend::Closed => Err(closed()),
        }
    }

    /// The live value under `key`, if any.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        match &self.backend {
            Backend::Bucket(kv) => kv.get(key).await.map_err(|e| Error::jetstream("read a ledger entry", e)),
            Backend::Brokered(b) => {
                let reply = self.broker(b, LedgerOp::Get, key, Bytes::new(), 0).await?;
                Ok(reply.found.then(|| reply.value.into()))
            }
            Backend::Closed => Err(closed()),
        }
    }

    /// Replaces the entry under `key` if it is still at `revision` (a compare-and-set).
    pub async fn replace(&self, key: &str, value: Bytes, revision: u64) -> Result<()> {
        match &self.backend {
            Backend::Bucket(kv) => {
                kv.update(key, value, revision)
                    .await
                    .map_err(|e| Error::jetstream("replace a ledger entry", e))?;
            }
            Backend::Brokered(b) => {
                self.broker(b, LedgerOp::Replace, key, value, revision).await?;
            }
            Backend::Closed => return Err(closed()),
        }
        Ok(())
    }

    /// Writes `value` under `key`, whatever was there.
    pub async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        match &self.backend {
            Backend::Bucket(kv) => {
                kv.put(key, value).await.map_err(|e| Error::jetstream("write a ledger entry", e))?;
            }
            Backend::Brokered(b) => {
                self.broker(b, LedgerOp::Put, key, value, 0).await?;
            }
            Backend::Closed => return Err(closed()),
        }
        Ok(())
    }

    /// Removes the entry under `key` (it leaves a delete marker).
    pub async fn remove(&self, key: &str) -> Result<()> {
        match &self.backend {
            Backend::Bucket(kv) => {
                kv.delete(key).await.map_err(|e| Error::jetstream("remove a ledger entry", e))?;
            }
            Backend::Brokered(b) => {
                self.broker(b, LedgerOp::Remove, key, Bytes::new(), 0).await?;
            }
            Backend::Closed => return Err(closed()),
        }
        Ok(())
    }

    /// Every key in the ledger, sorted (side-effect entries and crash markers). Only with the
    /// bucket itself: a task's broker lists nothing.
    pub async fn keys(&self) -> Result<Vec<String>> {
        match &self.backend {
            Backend::Bucket(kv) => crate::kv::kv_keys(kv, "list the ledger").await,
            Backend::Brokered(_) | Backend::Closed => Err(closed()),
        }
    }

    /// Does what a brokered request asks, on the bucket (the memory service's side). The caller
    /// has checked that the key is of the token's goal.
    pub async fn serve(&self, request: &LedgerRequest) -> Result<LedgerReply> {
        let key = request.key.as_str();
        let value = || Bytes::copy_from_slice(&request.value);
        let mut reply = LedgerReply::default();
        match LedgerOp::try_from(request.op).unwrap_or(LedgerOp::Unspecified) {
            LedgerOp::Get => {
                if let Some(value) = self.get(key).await? {
                    reply.found = true;
                    reply.value = value.to_vec();
                }
            }
            LedgerOp::Entry => {
                if let Some(entry) = self.entry(key).await? {
                    reply.found = true;
                    reply.live = entry.live;
                    reply.value = entry.value.to_vec();
                    reply.revision = entry.revision;
                    reply.written_unix_ms = entry.written_unix_ms as i64;
                }
            }
            LedgerOp::Create => reply.created = self.create(key, value()).await?,
            LedgerOp::Replace => self.replace(key, value(), request.revision).await?,
            LedgerOp::Put => self.put(key, value()).await?,
            LedgerOp::Remove => self.remove(key).await?,
            LedgerOp::Unspecified => {
                return Err(Error::InvalidArgument {
                    field: "op".into(),
                    reason: "no ledger operation named".into(),
                });
            }
        }
        Ok(reply)
    }
}
