//! The registry: which agents are alive and what they can do. Agents heartbeat on core NATS; an
//! agent silent for longer than the TTL is dropped. The registry answers catalogue requests (task
//! types with their input schemas, used to validate plans) and route requests (which live agents
//! serve a task type) over core request/reply in a queue group, so replicas share the load. Every
//! replica sees every heartbeat, so all replicas agree.
//!
//! Capability/load scoring and directed routing are not built yet: the dispatcher publishes to the
//! pool subject of each task type, which every capable agent pulls from.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures::StreamExt;
use hermes_core::topology::{validate_agent_id, validate_task_type};
use hermes_core::{Bus, now_unix_ms};
use hermes_proto::{AgentHeartbeat, CatalogEntry, CatalogReply, RouteReply, RouteRequest};
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, debug, info, warn};

/// Most task types one agent may declare.
pub const MAX_TASK_TYPES_PER_AGENT: usize = 256;

#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// An agent with no heartbeat for this long is offline.
    pub heartbeat_ttl: Duration,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self { heartbeat_ttl: Duration::from_secs(30) }
    }
}

struct LiveAgent {
    heartbeat: AgentHeartbeat,
    last_seen: Instant,
}

/// The live agent table, shared by the handlers.
#[derive(Clone)]
pub struct Registry {
    agents: Arc<DashMap<String, LiveAgent>>,
    config: RegistryConfig,
}

impl Registry {
    pub fn new(config: RegistryConfig) -> Self {
        Self { agents: Arc::new(DashMap::new()), config }
    }

    /// Applies a heartbeat after checking it; returns why it was rejected otherwise.
    pub fn apply_heartbeat(&self, heartbeat: AgentHeartbeat) -> Result<(), String> {
        validate_agent_id(&heartbeat.agent_id).map_err(|e| e.to_string())?;
        if heartbeat.deregister {
            if self.agents.remove(&heartbeat.agent_id).is_some() {
                info!(agent = %heartbeat.agent_id, event = "agent_deregistered", "agent left");
            }
            return Ok(());
        }
        if heartbeat.max_concurrency == 0 {
            return Err("max_concurrency must be at least 1".into());
        }
        if heartbeat.task_types.is_empty() || heartbeat.task_types.len() > MAX_TASK_TYPES_PER_AGENT {
            return Err(format!(
                "declares {} task types; 1 to {MAX_TASK_TYPES_PER_AGENT} are allowed",
                heartbeat.task_types.len()
            ));
        }
        for task_type in &heartbeat.task_types {
            validate_task_type(task_type).map_err(|e| e.to_string())?;
        }
        let id = heartbeat.agent_id.clone();
        let new =
            self.agents.insert(id.clone(), LiveAgent { heartbeat, last_seen: Instant::now() }).is_none();
        if new {
            info!(agent = %id, event = "agent_online", "agent registered");
        }
        Ok(())
    }

    /// Drops agents whose last heartbeat is older than the TTL; returns their ids.
    pub fn expire(&self) -> Vec<String> {
        let ttl = self.config.heartbeat_ttl;
        let mut gone = Vec::new();
        self.agents.retain(|id, agent| {
            let alive = agent.last_seen.elapsed() <= ttl;
            if !alive {
                gone.push(id.clone());
            }
            alive
        });
        for id in &gone {
            warn!(agent = %id, event = "agent_offline", "agent missed its heartbeat ttl");
        }
        gone
    }

    /// Task types served by live agents, with their schemas.
    pub fn catalog(&self) -> CatalogReply {
        let mut entries: BTreeMap<String, CatalogEntry> = BTreeMap::new();
        for agent in self.agents.iter() {
            for task_type in &agent.heartbeat.task_types {
                let entry = entries.entry(task_type.clone()).or_insert_with(|| CatalogEntry {
                    task_type: task_type.clone(),
                    tool: agent.heartbeat.tools.iter().find(|t| &t.name == task_type).cloned(),
                    live_agents: 0,
                });
                entry.live_agents += 1;
            }
        }
        CatalogReply { entries: entries.into_values().collect() }
    }

    /// Live agents declaring `task_type`, sorted by id.
    pub fn capable_agents(&self, task_type: &str) -> Vec<String> {
        let mut ids: Vec<String> = self
            .agents
            .iter()
            .filter(|a| a.heartbeat.task_types.iter().any(|t| t == task_type))
            .map(|a| a.key().clone())
            .collect();
        ids.sort();
        ids
    }

    pub fn len(&self) -> usize {
        self.agents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.agents.is_empty()
    }

    /// Loads the heartbeats mirrored in KV that are still within the TTL, so a restarted
    /// registry knows the live agents at once.
    async fn rebuild_from_kv(&self, bus: &Bus) {
        let Ok(mut keys) = bus.agents().keys().await else {
            return;
        };
        let ttl_ms = self.config.heartbeat_ttl.as_millis() as u64;
        while let Some(Ok(key)) = keys.next().await {
            let Ok(Some(bytes)) = bus.agents().get(&key).await else {
                continue;
            };
            let Ok(hb) = AgentHeartbeat::decode(bytes) else {
                continue;
            };
            if now_unix_ms().saturating_sub(hb.sent_unix_ms) <= ttl_ms {
                let _ = self.apply_heartbeat(hb);
            }
        }
    }
}

/// Runs the registry until `shutdown` is cancelled.
pub async fn run(bus: Bus, config: RegistryConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let registry = Registry::new(config);
    let topology = bus.topology().clone();
    registry.rebuild_from_kv(&bus).await;
    let mut heartbeats = bus.client().subscribe(topology.all_heartbeats()).await?;
    let mut catalog = bus.client().queue_subscribe(topology.catalog(), topology.registry_queue()).await?;
    let mut routes = bus.client().queue_subscribe(topology.route(), topology.registry_queue()).await?;
    let mut sweep = tokio::time::interval(Duration::from_secs(1));
    info!(agents = registry.len(), "registry serving");
    async {
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(msg) = heartbeats.next() => {
                    let applied = AgentHeartbeat::decode(msg.payload.clone())
                        .map_err(|e| format!("does not decode: {e}"))
                        .and_then(|hb| registry.apply_heartbeat(hb));
                    if let Err(reason) = applied {
                        warn!(subject = %msg.subject, reason, event = "heartbeat_rejected", "heartbeat rejected");
                    }
                }
                Some(msg) = catalog.next() => {
                    if let Some(reply) = msg.reply {
                        let body = registry.catalog().encode_to_vec();
                        if let Err(e) = bus.client().publish(reply, body.into()).await {
                            debug!(error = %e, "catalog reply failed");
                        }
                    }
                }
                Some(msg) = routes.next() => {
                    if let Some(reply) = msg.reply {
                        let capable_agents = RouteRequest::decode(msg.payload.clone())
                            .map(|req| registry.capable_agents(&req.task_type))
                            .unwrap_or_default();
                        let body = RouteReply { capable_agents }.encode_to_vec();
                        if let Err(e) = bus.client().publish(reply, body.into()).await {
                            debug!(error = %e, "route reply failed");
                        }
                    }
                }
                _ = sweep.tick() => {
                    registry.expire();
                }
            }
        }
    }
    .instrument(tracing::info_span!("registry"))
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(id: &str, types: &[&str]) -> AgentHeartbeat {
        AgentHeartbeat {
            agent_id: id.into(),
            task_types: types.iter().map(|t| t.to_string()).collect(),
            max_concurrency: 4,
            ..Default::default()
        }
    }

    #[test]
    fn malformed_heartbeats_are_rejected_with_a_reason() {
        let r = Registry::new(RegistryConfig::default());
        assert!(r.apply_heartbeat(beat("", &["a"])).unwrap_err().contains("agent_id"));
        assert!(r.apply_heartbeat(beat("x", &["a.*"])).unwrap_err().contains("task_type"));
        let mut zero = beat("x", &["a"]);
        zero.max_concurrency = 0;
        assert!(r.apply_heartbeat(zero).is_err());
        let many: Vec<String> = (0..300).map(|i| format!("t{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(r.apply_heartbeat(beat("x", &refs)).unwrap_err().contains("300 task types"));
        assert!(r.is_empty());
    }

    #[test]
    fn catalogue_and_capability_follow_live_agents() {
        let r = Registry::new(RegistryConfig { heartbeat_ttl: Duration::from_millis(50) });
        r.apply_heartbeat(beat("a1", &["math.evaluate", "time.now"])).unwrap();
        r.apply_heartbeat(beat("a2", &["math.evaluate"])).unwrap();
        assert_eq!(r.capable_agents("math.evaluate"), vec!["a1", "a2"]);
        let cat = r.catalog();
        assert_eq!(cat.entries.len(), 2);
        assert_eq!(cat.entries[0].live_agents, 2);
        let mut bye = beat("a2", &[]);
        bye.deregister = true;
        r.apply_heartbeat(bye).unwrap();
        assert_eq!(r.capable_agents("math.evaluate"), vec!["a1"]);
        std::thread::sleep(Duration::from_millis(80));
        assert_eq!(r.expire(), vec!["a1"]);
        assert!(r.capable_agents("time.now").is_empty());
    }
}
