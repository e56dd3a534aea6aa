//! A KV bucket that agents write (the side-effect ledger, the tool cache), as a task reaches it:
//! the bucket itself, or, on an agent's own NATS identity, only the entries the task's token
//! allows, through the memory service ([`crate::broker`]), which serves the same operations on
//! the bucket ([`TaskKv::serve`]).

use async_nats::jetstream::kv;
use bytes::Bytes;
use hermes_proto::{LedgerOp, LedgerReply, LedgerRequest};

use crate::broker::TaskBroker;
use crate::{Error, Result};

/// Which bucket a [`TaskKv`] is: its name in errors, and the memory method that brokers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KvKind {
    /// What an entry is called in errors (`ledger entry`).
    pub entry: &'static str,
    /// The memory service's method for an agent's own identity (`ledger`).
    pub method: &'static str,
    /// Whether a request waits out a while with no memory replica running (the ledger, which a
    /// side effect cannot go without), or fails at once (the cache, which the tool can).
    pub patient: bool,
}

/// The side-effect ledger (`hermes_ledger`, [`crate::ledger`]).
pub const LEDGER: KvKind = KvKind { entry: "ledger entry", method: "ledger", patient: true };
/// The tool cache (`hermes_tool_cache`, [`crate::tool_cache`]).
pub const TOOL_CACHE: KvKind = KvKind { entry: "tool cache entry", method: "tool_cache", patient: false };

/// A KV bucket agents write, as a task reaches it: the bucket itself, or on an agent's own
/// identity the entries its task's token allows, through the memory service. Cheap to clone.
#[derive(Clone)]
pub struct TaskKv {
    backend: Backend,
    kind: KvKind,
}

#[derive(Clone)]
enum Backend {
    /// The bucket itself.
    Bucket(std::sync::Arc<kv::Store>),
    /// One task's entries, through the memory service (an agent with its own identity).
    Brokered(TaskBroker),
    /// Neither: an agent's identity asked for the whole bucket (it may not read it).
    Closed,
}

/// An entry as stored, with what a compare-and-set needs.
#[derive(Debug, Clone)]
pub struct KvEntry {
    pub value: Bytes,
    pub revision: u64,
    /// When this revision was written, in Unix milliseconds.
    pub written_unix_ms: i128,
    /// False when the key's last entry is a delete marker.
    pub live: bool,
}

impl TaskKv {
    /// The bucket `kv`, which is a `kind`.
    pub fn new(kv: kv::Store, kind: KvKind) -> Self {
        Self { backend: Backend::Bucket(std::sync::Arc::new(kv)), kind }
    }

    /// One task's entries through the memory service (see [`crate::broker`]).
    pub fn brokered(broker: TaskBroker, kind: KvKind) -> Self {
        Self { backend: Backend::Brokered(broker), kind }
    }

    /// A store every operation of which is refused, for a connection that may not read it.
    pub(crate) fn closed(kind: KvKind) -> Self {
        Self { backend: Backend::Closed, kind }
    }

    fn closed_error(&self) -> Error {
        Error::FailedPrecondition(format!(
            "this connection is an agent's own identity: it reaches a {} only through a task's token",
            self.kind.entry
        ))
    }

    fn error(&self, operation: &'static str, e: impl std::fmt::Display) -> Error {
        Error::JetStream { operation, reason: format!("{}: {e}", self.kind.entry) }
    }

    /// The bucket's own handle, for what only it does (a watch); `None` through the broker.
    pub fn bucket(&self) -> Option<&kv::Store> {
        match &self.backend {
            Backend::Bucket(kv) => Some(kv),
            Backend::Brokered(_) | Backend::Closed => None,
        }
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
        match self.kind.patient {
            true => broker.call(self.kind.method, &request).await,
            false => broker.call_once(self.kind.method, &request).await,
        }
    }

    /// Writes `value` under `key` unless the key holds a live entry: `true` when this call wrote
    /// it, `false` when one was there already.
    pub async fn create(&self, key: &str, value: Bytes) -> Result<bool> {
        match &self.backend {
            Backend::Bucket(kv) => match kv.create(key, value).await {
                Ok(_) => Ok(true),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
                Err(e) => Err(self.error("create", e)),
            },
            Backend::Brokered(b) => Ok(self.broker(b, LedgerOp::Create, key, value, 0).await?.created),
            Backend::Closed => Err(self.closed_error()),
        }
    }

    /// The entry under `key`, live or a delete marker; `None` when the key never had one.
    pub async fn entry(&self, key: &str) -> Result<Option<KvEntry>> {
        match &self.backend {
            Backend::Bucket(kv) => {
                let entry = kv.entry(key).await.map_err(|e| self.error("read", e))?;
                Ok(entry.map(|entry| KvEntry {
                    live: entry.operation == kv::Operation::Put,
                    written_unix_ms: entry.created.unix_timestamp_nanos() / 1_000_000,
                    revision: entry.revision,
                    value: entry.value,
                }))
            }
            Backend::Brokered(b) => {
                let reply = self.broker(b, LedgerOp::Entry, key, Bytes::new(), 0).await?;
                Ok(reply.found.then(|| KvEntry {
                    live: reply.live,
                    written_unix_ms: i128::from(reply.written_unix_ms),
                    revision: reply.revision,
                    value: reply.value.into(),
                }))
            }
            Backend::Closed => Err(self.closed_error()),
        }
    }

    /// The live value under `key`, if any.
    pub async fn get(&self, key: &str) -> Result<Option<Bytes>> {
        match &self.backend {
            Backend::Bucket(kv) => kv.get(key).await.map_err(|e| self.error("read", e)),
            Backend::Brokered(b) => {
                let reply = self.broker(b, LedgerOp::Get, key, Bytes::new(), 0).await?;
                Ok(reply.found.then(|| reply.value.into()))
            }
            Backend::Closed => Err(self.closed_error()),
        }
    }

    /// Replaces the entry under `key` if it is still at `revision` (a compare-and-set).
    pub async fn replace(&self, key: &str, value: Bytes, revision: u64) -> Result<()> {
        match &self.backend {
            Backend::Bucket(kv) => {
                kv.update(key, value, revision).await.map_err(|e| self.error("replace", e))?;
            }
            Backend::Brokered(b) => {
                self.broker(b, LedgerOp::Replace, key, value, revision).await?;
            }
            Backend::Closed => return Err(self.closed_error()),
        }
        Ok(())
    }

    /// Writes `value` under `key`, whatever was there.
    pub async fn put(&self, key: &str, value: Bytes) -> Result<()> {
        match &self.backend {
            Backend::Bucket(kv) => {
                kv.put(key, value).await.map_err(|e| self.error("write", e))?;
            }
            Backend::Brokered(b) => {
                self.broker(b, LedgerOp::Put, key, value, 0).await?;
            }
            Backend::Closed => return Err(self.closed_error()),
        }
        Ok(())
    }

    /// Removes the entry under `key` (it leaves a delete marker).
    pub async fn remove(&self, key: &str) -> Result<()> {
        match &self.backend {
            Backend::Bucket(kv) => {
                kv.delete(key).await.map_err(|e| self.error("remove", e))?;
            }
            Backend::Brokered(b) => {
                self.broker(b, LedgerOp::Remove, key, Bytes::new(), 0).await?;
            }
            Backend::Closed => return Err(self.closed_error()),
        }
        Ok(())
    }

    /// Every key in the bucket, sorted. Only with the bucket itself: a task's broker lists nothing.
    pub async fn keys(&self) -> Result<Vec<String>> {
        match &self.backend {
            Backend::Bucket(kv) => crate::kv::kv_keys(kv, "list a bucket's keys").await,
            Backend::Brokered(_) | Backend::Closed => Err(self.closed_error()),
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
                    reason: "no operation named".into(),
                });
            }
        }
        Ok(reply)
    }
}
