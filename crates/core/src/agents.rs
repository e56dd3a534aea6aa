//! The one owner of the `hermes_agents` bucket: each agent's last heartbeat, mirrored there so
//! that a registry that starts (or restarts) knows the fleet at once instead of after the next
//! heartbeat period. Agents write their own entry and remove it when they leave; registries read
//! every entry and remove those of agents that died unseen.
//!
//! Entries expire [`MAX_AGE`] after their last write, and with them the delete markers agents
//! leave when they go (one per agent id that ever left: with pods named anew on each rollout,
//! they piled up without bound, and every registry start read them all). A live agent rewrites
//! its entry with every heartbeat, so only the gone expire.

use async_nats::jetstream::kv;
use hermes_proto::AgentHeartbeat;
use prost::Message as _;

use crate::{Error, Result};

/// How long an entry, or the marker a removal leaves, lasts after its last write.
pub const MAX_AGE: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// The agents' mirrored heartbeats, by agent id. Cheap to clone.
#[derive(Clone)]
pub struct AgentStore {
    kv: kv::Store,
}

impl AgentStore {
    pub fn new(kv: kv::Store) -> Self {
        Self { kv }
    }

    /// Stores `heartbeat` as `agent_id`'s last.
    pub async fn mirror(&self, agent_id: &str, heartbeat: &AgentHeartbeat) -> Result<()> {
        self.kv
            .put(agent_id, heartbeat.encode_to_vec().into())
            .await
            .map_err(|e| Error::jetstream("mirror heartbeat", e))?;
        Ok(())
    }

    /// Gives a bucket created before entries expired their [`MAX_AGE`] (its owner, the registry,
    /// does it at start); says whether it changed anything. A bucket already so is left alone.
    pub async fn expire_entries(&self, js: &async_nats::jetstream::Context) -> Result<bool> {
        let mut stream = self.kv.stream.clone();
        let info = stream.info().await.map_err(|e| Error::jetstream("read the agents bucket", e))?;
        if info.config.max_age == MAX_AGE {
            return Ok(false);
        }
        let config = async_nats::jetstream::stream::Config { max_age: MAX_AGE, ..info.config.clone() };
        js.update_stream(config).await.map_err(|e| Error::jetstream("set the agents bucket's max age", e))?;
        Ok(true)
    }

    /// Removes `agent_id`'s entry (it left, or died unseen).
    pub async fn remove(&self, agent_id: &str) -> Result<()> {
        self.kv.delete(agent_id).await.map_err(|e| Error::jetstream("remove agent", e))?;
        Ok(())
    }

    /// Every agent's last heartbeat, by agent id; an entry that does not decode is skipped.
    pub async fn all(&self) -> Result<Vec<(String, AgentHeartbeat)>> {
        let mut out = Vec::new();
        for key in crate::kv::kv_keys(&self.kv, "list agents").await? {
            // A key whose last entry is a delete marker reads as nothing.
            let Ok(Some(bytes)) = self.kv.get(&key).await else { continue };
            if let Ok(heartbeat) = AgentHeartbeat::decode(bytes) {
                out.push((key, heartbeat));
            }
        }
        Ok(out)
    }
}
