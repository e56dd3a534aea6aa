//! Tenants' lanes of the pool, and their weights.
//!
//! A task with a tenant that no agent had a free slot for waits in its tenant's own lane of the
//! pool, `hermes.task.lane.<tenant>.<task_type>` (durable consumer `lane_<type>__<tenant>`,
//! [`crate::topology::Topology::lane_consumer`]): one lane per tenant, so no two tenants share
//! one. Agents serve the lanes with work by weighted fair queuing, a tenant of weight 3 three
//! tasks for each one of a tenant of weight 1 (`docs/security.md`, "Fair dispatch").
//!
//! Which lanes exist is the `hermes_lanes` bucket's: a key per tenant, its value the tenant's
//! weight as JSON (`{"weight": 3.0}`). Every dispatcher writes the tenants of its API tokens
//! file there when it starts, before it serves (so a tenant's lane is known before its first task
//! is in it), and agents follow the bucket to pull from each lane. The lanes are bounded by the
//! tenants the tokens file names, and the tenants OIDC tokens' claims name ([`ensure`], at a
//! tenant's first submit); a tenant dropped from the file keeps its entry, so tasks left in its
//! lane are still served.

use std::collections::BTreeMap;

use async_nats::jetstream::kv;
use futures::StreamExt as _;
use serde::{Deserialize, Serialize};

use crate::{Bus, Error, Result};

/// The largest weight a tenant may have: shares beyond 1000:1 are better served by a pool of
/// their own.
pub const MAX_WEIGHT: f64 = 1000.0;

/// Whether `weight` may be a tenant's: finite, positive, at most [`MAX_WEIGHT`].
pub fn valid_weight(weight: f64) -> bool {
    weight.is_finite() && weight > 0.0 && weight <= MAX_WEIGHT
}

/// A lane's entry in the bucket.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Lane {
    pub weight: f64,
}

/// A change to the lanes, as [`follow`] reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct LaneUpdate {
    pub tenant: String,
    pub weight: f64,
}

/// Opens (creating it if needed) the lanes bucket.
pub async fn bucket(bus: &Bus) -> Result<kv::Store> {
    bus.ensure_bucket(kv::Config {
        bucket: bus.topology().lanes_bucket(),
        description: "Hermes tenants' lanes of the task pool, with their weights".into(),
        history: 1,
        num_replicas: bus.config().replicas,
        ..Default::default()
    })
    .await
}

/// Writes every tenant's lane with its weight, where the bucket does not hold it already.
pub async fn publish(bus: &Bus, tenants: &BTreeMap<String, f64>) -> Result<()> {
    let store = bucket(bus).await?;
    for (tenant, &weight) in tenants {
        crate::ids::check_id("tenant", tenant, 64, crate::ids::IdShape::Word)?;
        let lane = Lane { weight };
        // At a service's start, on a bucket a forming cluster may not know everywhere yet.
        crate::bus::patiently(|| async {
            let held = store
                .get(tenant)
                .await
                .map_err(|e| Error::JetStream { operation: "read lane", reason: e.to_string() })?;
            if held.as_deref().and_then(|bytes| serde_json::from_slice::<Lane>(bytes).ok()) == Some(lane) {
                return Ok(());
            }
            let value = serde_json::to_vec(&lane).expect("a lane serializes");
            store
                .put(tenant, value.into())
                .await
                .map(|_| ())
                .map_err(|e| Error::JetStream { operation: "write lane", reason: e.to_string() })
        })
        .await?;
    }
    Ok(())
}

/// Writes `tenant`'s lane with weight 1 unless the bucket holds it already (with any weight):
/// for a tenant no tokens file names (an OIDC token's claim), at its first submit.
pub async fn ensure(bus: &Bus, tenant: &str) -> Result<()> {
    crate::ids::check_id("tenant", tenant, 64, crate::ids::IdShape::Word)?;
    let store = bucket(bus).await?;
    let value = serde_json::to_vec(&Lane { weight: 1.0 }).expect("a lane serializes");
    match store.create(tenant, value.into()).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::JetStream { operation: "write lane", reason: e.to_string() }),
    }
}

/// Every lane the bucket holds, then each one written later, as it is written. An entry that
/// is not a lane (a key that is no tenant, a value that is no weight) is skipped with a warning:
/// an agent must not stop serving on a bad entry.
pub async fn follow(bus: &Bus) -> Result<impl futures::Stream<Item = LaneUpdate> + Send + Unpin + 'static> {
    let store = bucket(bus).await?;
    let watch = store
        .watch_with_history(">")
        .await
        .map_err(|e| Error::JetStream { operation: "watch lanes", reason: e.to_string() })?;
    Ok(Box::pin(watch.filter_map(|entry| async move {
        let entry = match entry {
            Ok(entry) => entry,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read the lanes bucket's next entry");
                return None;
            }
        };
        if entry.operation != kv::Operation::Put {
            return None;
        }
        let lane = serde_json::from_slice::<Lane>(&entry.value).ok().filter(|l| valid_weight(l.weight));
        let tenant_ok = crate::ids::check_id("tenant", &entry.key, 64, crate::ids::IdShape::Word).is_ok();
        match lane {
            Some(lane) if tenant_ok => Some(LaneUpdate { tenant: entry.key, weight: lane.weight }),
            _ => {
                tracing::warn!(key = %entry.key, "the lanes bucket holds an entry that is no tenant's lane; skipped");
                None
            }
        }
    })))
}
