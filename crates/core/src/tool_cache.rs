//! The layout of the tool-result cache's bucket, `hermes_tool_cache` (docs/agents.md, "Cached
//! tool results"): the executor reads and writes entries (`hermes_executor::cache`), operators
//! count and clear them through the dispatcher (`hermes cache`).
//!
//! A key is `<tenant token>.<tool>.<sha256>`: the tenant's token first, so one tenant's entries
//! are listed and cleared alone, then the tool, then the hash of the call.

use std::time::Duration;

use async_nats::jetstream::kv;
use serde_json::{Value, json};
use sha2::{Digest as _, Sha256};

use crate::{Bus, now_unix_ms};

/// The bucket of cached results.
pub const BUCKET: &str = "hermes_tool_cache";
/// The longest a result may be kept.
pub const MAX_TTL: Duration = Duration::from_secs(7 * 24 * 3600);

/// The first key token of a tenant's entries: `t` and 16 hex digits of the sha256 of its name
/// (tenant names need not be key tokens), so one tenant's entries are listed and cleared alone.
pub fn tenant_token(tenant: &str) -> String {
    format!(
        "t{}",
        &Sha256::digest(tenant.as_bytes()).iter().take(8).map(|b| format!("{b:02x}")).collect::<String>()
    )
}

/// Opens (creating it if needed) the cache bucket.
pub async fn bucket(bus: &Bus) -> crate::Result<kv::Store> {
    bus.ensure_bucket(kv::Config {
        bucket: BUCKET.to_owned(),
        description: "Cached results of idempotent tools, by tenant, tool and arguments".into(),
        history: 1,
        max_age: MAX_TTL,
        num_replicas: bus.config().replicas,
        ..Default::default()
    })
    .await
}

/// The cache as a task whose `memory_token` is `token` reaches it: the bucket, or on an agent's
/// own identity that task's tenant's entries through the memory service (as [`Bus::task_ledger`]).
pub async fn task_store(bus: &Bus, token: &str) -> crate::Result<crate::task_kv::TaskKv> {
    use crate::task_kv::{TOOL_CACHE, TaskKv};
    match bus.brokered() {
        true => Ok(TaskKv::brokered(bus.task_broker(token), TOOL_CACHE)),
        false => Ok(TaskKv::new(bucket(bus).await?, TOOL_CACHE)),
    }
}

/// Entries and their bytes, by tool, for `hermes cache stats`.
#[derive(Debug, Default, Clone, PartialEq, Eq, serde::Serialize)]
pub struct ToolStats {
    pub entries: u64,
    pub pending: u64,
    pub expired: u64,
    pub bytes: u64,
}

/// The keys of `tenant`'s entries (every tenant's with `None`), of `tool` or of every tool.
async fn keys(store: &kv::Store, tenant: Option<&str>, tool: Option<&str>) -> crate::Result<Vec<String>> {
    if let Some(tool) = tool {
        crate::topology::validate_task_type(tool)?;
    }
    let pattern = match (tenant, tool) {
        (Some(t), Some(tool)) => format!("{}.{tool}.*", tenant_token(t)),
        (Some(t), None) => format!("{}.>", tenant_token(t)),
        (None, Some(tool)) => format!("*.{tool}.*"),
        (None, None) => ">".to_owned(),
    };
    crate::kv::kv_keys_matching(store, &pattern, "list tool cache").await
}

/// Counts the cache's entries by tool: `tenant`'s, or every tenant's with `None`.
pub async fn stats(
    bus: &Bus,
    tenant: Option<&str>,
    tool: Option<&str>,
) -> crate::Result<std::collections::BTreeMap<String, ToolStats>> {
    let store = bucket(bus).await?;
    let now = now_unix_ms();
    let mut by_tool: std::collections::BTreeMap<String, ToolStats> = Default::default();
    for key in keys(&store, tenant, tool).await? {
        let Some((_, rest)) = key.split_once('.') else { continue };
        let Some((tool, _)) = rest.rsplit_once('.') else { continue };
        let Ok(Some(value)) = store.get(&key).await else { continue };
        let parsed: Value = serde_json::from_slice(&value).unwrap_or(Value::Null);
        let stats = by_tool.entry(tool.to_owned()).or_default();
        if parsed["pending"] == json!(true) {
            stats.pending += 1;
        } else if parsed["expires_ms"].as_u64().unwrap_or(0) <= now {
            stats.expired += 1;
        } else {
            stats.entries += 1;
            stats.bytes += value.len() as u64;
        }
    }
    Ok(by_tool)
}

/// Removes `tenant`'s entries (every tenant's with `None`), of `tool` or of every tool; returns
/// how many.
pub async fn clear(bus: &Bus, tenant: Option<&str>, tool: Option<&str>) -> crate::Result<usize> {
    let store = bucket(bus).await?;
    let mut removed = 0;
    for key in keys(&store, tenant, tool).await? {
        if store.purge(&key).await.is_ok() {
            removed += 1;
        }
    }
    Ok(removed)
}
