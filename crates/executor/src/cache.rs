//! The tool-result cache (docs/agents.md, "Cached tool results"): the output of a tool that
//! declares itself cacheable (no side effects, the same output for the same arguments) is kept in
//! the KV bucket `hermes_tool_cache` and reused by every agent of the deployment until it expires.
//!
//! - The key is the tool's name and the sha256 of the RFC 8785 canonical JSON of the tenant, the
//!   tool, its version (the hash of its parameter schema, unless it names one) and the arguments:
//!   the same arguments however written share an entry, and no tenant ever reads another's.
//! - An entry holds the output (or, past [`MAX_ENTRY_BYTES`], the artifact holding it), when it
//!   was stored and when it expires (the tool's TTL).
//! - Single flight: the first call of a key writes a pending marker with `create` and runs the
//!   tool; identical calls meanwhile, in any process, wait for its result. A marker older than
//!   the tool's longest run is one whose caller died, and the next call takes it over. A failed
//!   run stores nothing and removes its marker, so the waiters run the tool themselves.

use std::time::{Duration, Instant};

use futures::StreamExt;
use hermes_core::artifacts::Artifacts;
use hermes_core::task_kv::TaskKv;
use hermes_core::{Bus, ErrorCode, now_unix_ms};
use serde_json::{Value, json};

use crate::scope::ToolError;

pub use hermes_core::tool_cache::{
    BUCKET, MAX_TTL, ToolStats, bucket, clear, stats, task_store, tenant_token,
};
/// Outputs larger than this (as JSON) are kept as an artifact, the entry holding its reference.
pub const MAX_ENTRY_BYTES: usize = 64 * 1024;
/// How often a waiting call looks at the entry when no change wakes it.
const WAIT_POLL: Duration = Duration::from_millis(100);

/// A result that came from the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheHit {
    /// How long ago it was stored.
    pub age: Duration,
}

/// What a tool call is cached under.
pub(crate) struct CacheKey {
    pub tool: String,
    pub key: String,
    pub tenant: String,
    pub ttl: Duration,
    /// How long a pending marker may stand before its caller counts as dead.
    pub stale_after: Duration,
}

impl CacheKey {
    pub fn new(
        tenant: &str,
        tool: &str,
        version: &str,
        args: &Value,
        ttl: Duration,
        stale_after: Duration,
    ) -> Self {
        let canonical = hermes_core::jcs::canonical(&json!({
            "tenant": tenant,
            "tool": tool,
            "version": version,
            "args": args,
        }));
        let hash = hermes_llm::record::sha256(&canonical);
        let key = format!("{}.{tool}.{hash}", tenant_token(tenant));
        CacheKey { tool: tool.to_owned(), key, tenant: tenant.to_owned(), ttl, stale_after }
    }
}

fn count(tool: &str, outcome: &str) {
    let labels = hermes_core::metrics::labels(&[("tool", tool), ("outcome", outcome)]);
    hermes_core::metrics::global().tool_cache.get_or_create(&labels).inc();
}

/// What an entry says.
enum Found {
    Output(Value, Duration),
    Pending,
    /// Nothing usable: absent, expired, a dead caller's marker. `Some(revision)` when an entry
    /// is there to be replaced.
    Free(Option<u64>),
}

async fn look(store: &TaskKv, artifacts: &Artifacts, key: &CacheKey) -> Result<Found, ToolError> {
    let entry = store.entry(&key.key).await.map_err(unavailable)?;
    let Some(entry) = entry else { return Ok(Found::Free(None)) };
    if !entry.live {
        return Ok(Found::Free(Some(entry.revision)));
    }
    let value: Value = serde_json::from_slice(&entry.value).unwrap_or(Value::Null);
    let now = now_unix_ms();
    if value["tenant"].as_str() != Some(key.tenant.as_str()) {
        // Not this tenant's (a hash collision would be needed): never served, never replaced.
        return Ok(Found::Pending);
    }
    if value["pending"] == json!(true) {
        let since = value["since_ms"].as_u64().unwrap_or(0);
        return Ok(if since + key.stale_after.as_millis() as u64 > now {
            Found::Pending
        } else {
            Found::Free(Some(entry.revision))
        });
    }
    if value["expires_ms"].as_u64().unwrap_or(0) <= now {
        return Ok(Found::Free(Some(entry.revision)));
    }
    let age = Duration::from_millis(now.saturating_sub(value["stored_ms"].as_u64().unwrap_or(now)));
    let output = match value["artifact"].as_str() {
        Some(reference) => match artifacts.get(reference).await {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(output) => output,
                Err(_) => return Ok(Found::Free(Some(entry.revision))),
            },
            // The artifact expired or was removed: the entry is as good as gone.
            Err(_) => return Ok(Found::Free(Some(entry.revision))),
        },
        None => value["output"].clone(),
    };
    Ok(Found::Output(output, age))
}

fn unavailable(e: impl std::fmt::Display) -> ToolError {
    ToolError { code: ErrorCode::Unavailable, message: format!("tool cache: {e}") }
}

/// The cached output of `key`, or the output of `run` (stored for the next call), with whether
/// it came from the cache. Identical calls in flight at once run `run` once.
/// `token` is the task's `memory_token`, with which an agent's own identity reaches the cache and
/// artifacts through the memory service.
pub(crate) async fn call<F>(
    bus: &Bus,
    token: &str,
    key: &CacheKey,
    run: F,
) -> (Result<Value, ToolError>, Option<CacheHit>)
where
    F: std::future::Future<Output = Result<Value, ToolError>>,
{
    let artifacts = &bus.task_artifacts(token);
    let store = match task_store(bus, token).await {
        Ok(store) => store,
        Err(e) => {
            tracing::warn!(error = %e, "the tool cache is unreachable; running the tool");
            return (run.await, None);
        }
    };
    let started = Instant::now();
    let mut waited = false;
    let mut watch = None;
    let claimed = loop {
        let found = match look(&store, artifacts, key).await {
            Ok(found) => found,
            Err(e) => {
                tracing::warn!(error = %e.message, "the tool cache is unreachable; running the tool");
                return (run.await, None);
            }
        };
        match found {
            Found::Output(output, age) => {
                count(&key.tool, if waited { "shared" } else { "hit" });
                return (Ok(output), Some(CacheHit { age }));
            }
            Found::Free(revision) => {
                let marker: bytes::Bytes =
                    json!({"pending": true, "since_ms": now_unix_ms(), "tenant": key.tenant})
                        .to_string()
                        .into();
                let won = match revision {
                    None => matches!(store.create(&key.key, marker).await, Ok(true)),
                    Some(revision) => store.replace(&key.key, marker, revision).await.is_ok(),
                };
                if won {
                    break true;
                }
            }
            Found::Pending => {
                waited = true;
                if started.elapsed() > key.stale_after {
                    break false;
                }
                if watch.is_none()
                    && let Some(bucket) = store.bucket()
                {
                    watch = bucket.watch(&key.key).await.ok();
                }
                match watch.as_mut() {
                    Some(w) => {
                        let _ = tokio::time::timeout(WAIT_POLL, w.next()).await;
                    }
                    None => tokio::time::sleep(WAIT_POLL).await,
                }
            }
        }
    };
    count(&key.tool, "miss");
    let result = run.await;
    if claimed {
        match &result {
            Ok(output) => store_output(&store, artifacts, key, output).await,
            Err(_) => {
                let _ = store.remove(&key.key).await;
            }
        }
    }
    (result, None)
}

async fn store_output(store: &TaskKv, artifacts: &Artifacts, key: &CacheKey, output: &Value) {
    let now = now_unix_ms();
    let text = output.to_string();
    let mut entry = json!({
        "tenant": key.tenant,
        "stored_ms": now,
        "expires_ms": now + key.ttl.as_millis() as u64,
    });
    if text.len() > MAX_ENTRY_BYTES {
        let put =
            artifacts.put_owned(text.as_bytes(), "application/json", "", &key.tenant, Some(key.ttl)).await;
        match put {
            Ok(info) => entry["artifact"] = json!(info.reference),
            Err(e) => {
                tracing::warn!(tool = %key.tool, error = %e, "cannot keep a large tool result; not cached");
                count(&key.tool, "too_large");
                let _ = store.remove(&key.key).await;
                return;
            }
        }
    } else {
        entry["output"] = output.clone();
    }
    match store.put(&key.key, entry.to_string().into()).await {
        Ok(_) => count(&key.tool, "stored"),
        Err(e) => tracing::warn!(tool = %key.tool, error = %e, "cannot store a tool result in the cache"),
    }
}
