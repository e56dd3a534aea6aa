//! Clients of the registry: [`route`], which asks it where tasks should go (dispatchers route from
//! their own view instead, see `hermes_registry::Registry::mirror`), and [`Catalog`], a cached
//! view of its capability catalogue, used by the dispatcher and the planner to validate plans.
//! The catalogue is refreshed at most once per `ttl`, and once more on a miss, so a newly
//! registered task type is accepted without waiting for the next refresh.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hermes_core::plan::TaskTypeCatalog;
use hermes_core::schema::InputSchema;
use hermes_core::{Bus, Error, Result};
use hermes_proto::{
    CatalogEntry, CatalogReply, CatalogRequest, RouteDecision, RouteQuery, RouteReply, RouteRequest,
};
use prost::Message as _;
use tokio::sync::Mutex;

/// Task types with their compiled input schemas.
#[derive(Default, Clone)]
pub struct CatalogSnapshot {
    schemas: HashMap<String, (String, Option<Arc<InputSchema>>)>,
    /// The registry's entries as received: task types with descriptions and schemas.
    entries: Arc<Vec<CatalogEntry>>,
}

impl TaskTypeCatalog for CatalogSnapshot {
    fn input_schema(&self, task_type: &str) -> Option<Option<&InputSchema>> {
        self.schemas.get(task_type).map(|(_, s)| s.as_deref())
    }
}

impl CatalogSnapshot {
    pub fn contains_all<'a>(&self, mut task_types: impl Iterator<Item = &'a str>) -> bool {
        task_types.all(|t| self.schemas.contains_key(t))
    }

    /// Every task type live agents serve, with its tool description and schema.
    pub fn entries(&self) -> &[CatalogEntry] {
        &self.entries
    }

    /// A snapshot of `entries` as a registry would send them, for checking plans offline
    /// (tests, the planning benchmark).
    pub fn from_entries(entries: Vec<CatalogEntry>) -> Self {
        Self::build(entries, &Self::default())
    }

    /// Compiles the schemas of `entries`, reusing those of `previous` that did not change:
    /// compiling is the costly part.
    fn build(entries: Vec<CatalogEntry>, previous: &CatalogSnapshot) -> Self {
        let mut next = CatalogSnapshot { entries: Arc::new(entries.clone()), ..Default::default() };
        for entry in entries {
            let raw = entry.tool.map(|t| t.params_schema_json).unwrap_or_default();
            let compiled = match previous.schemas.get(&entry.task_type) {
                Some((old_raw, old)) if *old_raw == raw => old.clone(),
                _ => compile(&raw),
            };
            next.schemas.insert(entry.task_type, (raw, compiled));
        }
        next
    }

    /// The JSON Schema of a task type's inputs, as JSON.
    pub fn schema_json(&self, task_type: &str) -> Option<serde_json::Value> {
        self.schemas.get(task_type).and_then(|(raw, _)| serde_json::from_str(raw).ok())
    }
}

pub struct Catalog {
    bus: Bus,
    ttl: Duration,
    cached: Mutex<(Option<Instant>, CatalogSnapshot)>,
}

impl Catalog {
    pub fn new(bus: Bus, ttl: Duration) -> Self {
        Self { bus, ttl, cached: Mutex::new((None, CatalogSnapshot::default())) }
    }

    /// A snapshot fresh enough to validate a plan using `task_types`.
    pub async fn snapshot<'a>(
        &self,
        task_types: impl Iterator<Item = &'a str> + Clone,
    ) -> Result<CatalogSnapshot> {
        self.snapshot_inner(Some(task_types)).await
    }

    /// The registry's catalogue as it is now, bypassing the cache.
    pub async fn current(&self) -> Result<CatalogSnapshot> {
        self.snapshot_inner(None::<std::iter::Empty<&str>>).await
    }

    async fn snapshot_inner<'a>(
        &self,
        task_types: Option<impl Iterator<Item = &'a str> + Clone>,
    ) -> Result<CatalogSnapshot> {
        let mut cached = self.cached.lock().await;
        let fresh = cached.0.is_some_and(|at| at.elapsed() < self.ttl);
        if let Some(task_types) = task_types
            && fresh
            && cached.1.contains_all(task_types)
        {
            return Ok(cached.1.clone());
        }
        let reply = self.fetch().await?;
        let next = CatalogSnapshot::build(reply.entries, &cached.1);
        *cached = (Some(Instant::now()), next.clone());
        Ok(next)
    }

    async fn fetch(&self) -> Result<CatalogReply> {
        let subject = self.bus.topology().catalog();
        let request = CatalogRequest {}.encode_to_vec();
        let reply =
            tokio::time::timeout(Duration::from_secs(3), self.bus.client().request(subject, request.into()))
                .await
                .map_err(|_| Error::Unavailable("the registry (catalogue request timed out)".into()))?
                .map_err(|e| Error::Unavailable(format!("the registry ({e})")))?;
        CatalogReply::decode(reply.payload)
            .map_err(|e| Error::Decode { kind: "CatalogReply", reason: e.to_string() })
    }
}

fn compile(raw: &str) -> Option<Arc<InputSchema>> {
    if raw.trim().is_empty() {
        return None;
    }
    let value = serde_json::from_str(raw).ok()?;
    InputSchema::compile(value).ok().map(Arc::new)
}

/// Asks the registry to route `queries`, within `timeout`: one decision per query, in order.
/// `UNAVAILABLE` when no registry answers in time.
pub async fn route(bus: &Bus, queries: Vec<RouteQuery>, timeout: Duration) -> Result<Vec<RouteDecision>> {
    let request = RouteRequest { queries }.encode_to_vec();
    match tokio::time::timeout(timeout, bus.client().request(bus.topology().route(), request.into())).await {
        Ok(Ok(msg)) => RouteReply::decode(msg.payload)
            .map(|reply| reply.decisions)
            .map_err(|e| Error::Decode { kind: "RouteReply", reason: e.to_string() }),
        Ok(Err(e)) => Err(Error::Unavailable(format!("the registry did not answer a route request: {e}"))),
        Err(_) => Err(Error::Unavailable(format!("no registry answered a route request within {timeout:?}"))),
    }
}
