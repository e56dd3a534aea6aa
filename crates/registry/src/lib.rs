//! The registry: which agents are alive, what they can do, and where each task should go.
//!
//! Agents heartbeat on core NATS; an agent silent for longer than the TTL is marked offline and
//! `AgentOffline` is published, as it is on a graceful deregistration. Every replica subscribes to
//! every heartbeat, so all replicas share one view of the agents. Catalogue and route requests are
//! served over core request/reply in a queue group, so replicas share that load.
//!
//! Routing scores each live agent that declares the task type:
//! `score = 0.6 × capability + 0.4 × availability`, where capability is 0.5 plus 0.5 × the share
//! of the node's preferences (tags, tools, model) the agent matches (1.0 when the node states
//! none), and availability is `1 − load / max_concurrency`. Load is kept current between
//! heartbeats by optimistic reservation: a routed task adds one, its result (for whoever follows
//! results, [`Registry::task_finished`]) removes one, and each heartbeat resets it to the agent's
//! own count. Saturated agents are never chosen; ties go to the agent assigned least recently.
//! When no agent can take a task the decision is the task type's pool.
//!
//! Dispatchers route from a table of their own ([`Registry::mirror`], kept by [`follow`]), which
//! frees each reservation when the dispatcher applies the result. The registry service still
//! answers route requests for other clients; it follows results for latency and health only, so
//! the reservations it makes last until the agent's next heartbeat, and the load it lists is the
//! agents' own count.
//!
//! Latency and health ([`health`]): each view keeps a peak-EWMA of every agent's successful task
//! run times by task type and a breaker its own failures open ([`Registry::observe`]). Under
//! [`Policy::Balanced`] the most capable candidates compete on latency × (load + 1) / slots,
//! agents in a cool-off or with a late heartbeat left out.

mod grpc;
pub mod health;
pub mod identities;
pub mod service;

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use dashmap::DashMap;
use futures::StreamExt;
use hermes_core::topology::{validate_agent_id, validate_task_type};
use hermes_core::{Bus, now_unix_ms};
use hermes_proto::{
    AgentChange, AgentEvent, AgentHeartbeat, AgentInfo, AgentOffline, CatalogEntry, CatalogReply,
    RouteDecision, RouteQuery, RouteReply, RouteRequest,
};
use prost::Message as _;
use tokio::sync::broadcast;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use grpc::RegistryGrpc;
pub use health::{Breaker, Clock, HealthSettings, Outcome, PeakEwma};

/// Most task types one agent may declare.
pub const MAX_TASK_TYPES_PER_AGENT: usize = 256;
/// Most tags one agent may carry.
pub const MAX_TAGS_PER_AGENT: usize = 64;
/// Largest tool schema accepted in a heartbeat.
pub const MAX_SCHEMA_BYTES: usize = 64 * 1024;
/// Weight of capability in the score; availability gets the rest.
pub const CAPABILITY_WEIGHT: f64 = 0.6;
/// Weight of availability in the score.
pub const AVAILABILITY_WEIGHT: f64 = 0.4;
/// Candidates up to this many are all compared; past it, [`DRAWS`] drawn at random are (the power
/// of d choices), so dispatchers routing at once do not all pick the same agent.
pub const FULL_SCAN: usize = 16;
/// How many candidates a draw compares past [`FULL_SCAN`]: three, not the classic two, because
/// with two a tenth of slow agents are both drawn one time in a hundred, which is the p99; the
/// routing simulator measured p99 at 0.78x the old policy's with two and 0.20x with three.
pub const DRAWS: usize = 3;

/// How routing chooses among the capable agents (docs/routing.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Capability, then speed: each agent's recent latency for the task type (a peak-EWMA) times
    /// `(load + 1) / slots`; agents in a cool-off or with a late heartbeat are left out.
    #[default]
    Balanced,
    /// Capability and availability (free slots) alone, with no latency or health: the policy
    /// before `Balanced`, kept as the routing simulator's baseline.
    Scored,
}

#[derive(Debug, Clone)]
pub struct RegistryConfig {
    /// An agent with no heartbeat for this long is offline. At least three heartbeat periods.
    pub heartbeat_ttl: Duration,
    pub policy: Policy,
    pub health: HealthSettings,
    /// Time for latencies, cool-offs and late heartbeats (a simulation sets its own).
    pub clock: Clock,
    /// Seeds the draw of the power of two choices (0: from the time).
    pub seed: u64,
}

impl Default for RegistryConfig {
    fn default() -> Self {
        Self {
            heartbeat_ttl: Duration::from_secs(30),
            policy: Policy::default(),
            health: HealthSettings::default(),
            clock: Clock::default(),
            seed: 0,
        }
    }
}

struct LiveAgent {
    heartbeat: AgentHeartbeat,
    last_seen: Instant,
    /// On the registry's [`Clock`], for a late heartbeat.
    last_seen_ms: u64,
    last_seen_unix_ms: u64,
    /// Peak-EWMA of its successful tasks' run times, by task type.
    latency: HashMap<String, PeakEwma>,
    breaker: Breaker,
    /// In-flight tasks as counted here: see the module docs.
    load: u32,
    assigned: u64,
    /// Position in the global assignment order; 0 means never assigned.
    last_assigned: u64,
}

impl LiveAgent {
    fn info(&self, now_ms: u64, config: &RegistryConfig) -> AgentInfo {
        let cool_off_until_unix_ms = match self.breaker {
            Breaker::CoolingOff { until_ms, .. } => now_unix_ms() + until_ms.saturating_sub(now_ms),
            _ => 0,
        };
        let health = if self.late(now_ms, config) { "late" } else { self.breaker.name(now_ms) };
        AgentInfo {
            heartbeat: Some(self.heartbeat.clone()),
            online: true,
            load: self.load,
            last_seen_unix_ms: self.last_seen_unix_ms,
            assigned: self.assigned,
            health: health.to_owned(),
            cool_off_until_unix_ms,
            latency_ms: self.latency.iter().map(|(t, e)| (t.clone(), e.read(now_ms))).collect(),
        }
    }

    /// Takes no directed work now: every slot reserved, draining, or pooled work waiting on it
    /// (which a directed task would pass by).
    fn saturated(&self) -> bool {
        self.load >= self.heartbeat.max_concurrency.max(1)
            || self.heartbeat.draining
            || self.heartbeat.backlogged
    }

    /// Its last heartbeat is older than [`HealthSettings::late_heartbeats`] of its periods (a
    /// third of the TTL for an agent that does not say its period).
    fn late(&self, now_ms: u64, config: &RegistryConfig) -> bool {
        let period = match self.heartbeat.heartbeat_period_ms {
            0 => config.heartbeat_ttl.as_millis() as u64 / 3,
            ms => ms,
        };
        let bound = (period * u64::from(config.health.late_heartbeats.max(1))).max(1_000);
        now_ms.saturating_sub(self.last_seen_ms) > bound
    }
}

/// The live agent table. Cheap to clone; clones share the table.
#[derive(Clone)]
pub struct Registry {
    inner: Arc<Inner>,
}

struct Inner {
    agents: DashMap<String, LiveAgent>,
    /// task type → agents declaring it, so a route decision looks only at capable agents.
    by_type: DashMap<String, BTreeSet<String>>,
    assign_clock: AtomicU64,
    /// State of the draw for the power of two choices (xorshift).
    draw: AtomicU64,
    changes: broadcast::Sender<AgentEvent>,
    config: RegistryConfig,
    /// A mirror ([`Registry::mirror`]) logs no agent coming and going: the registry does.
    quiet: bool,
}

impl Registry {
    pub fn new(config: RegistryConfig) -> Self {
        Self::with(config, false)
    }

    /// A table kept from the same heartbeats by another service, to route without asking the
    /// registry (a dispatcher's routing view, kept by [`follow`]): it logs nothing of agents
    /// coming and going, which the registry does, and it learns that an agent went offline from
    /// the registry's notice ([`Registry::forget`]) rather than deciding it.
    pub fn mirror(config: RegistryConfig) -> Self {
        Self::with(config, true)
    }

    fn with(config: RegistryConfig, quiet: bool) -> Self {
        let (changes, _) = broadcast::channel(4096);
        let seed = match config.seed {
            0 => now_unix_ms() | 1,
            seed => seed,
        };
        Self {
            inner: Arc::new(Inner {
                agents: DashMap::new(),
                by_type: DashMap::new(),
                assign_clock: AtomicU64::new(0),
                draw: AtomicU64::new(seed),
                changes,
                config,
                quiet,
            }),
        }
    }

    /// Checks and applies a heartbeat that arrived on `subject_agent`'s subject. Returns the
    /// offline notice to publish when it was a deregistration, or why it was rejected.
    pub fn apply_heartbeat(
        &self,
        subject_agent: &str,
        heartbeat: AgentHeartbeat,
    ) -> Result<Option<AgentOffline>, hermes_core::Error> {
        validate_heartbeat(subject_agent, &heartbeat)?;
        if heartbeat.deregister {
            return Ok(self.remove(&heartbeat.agent_id, "deregistered"));
        }
        let id = heartbeat.agent_id.clone();
        let now = Instant::now();
        let mut new_types: Option<Vec<String>> = None;
        let mut old_types: Vec<String> = Vec::new();
        let is_new = match self.inner.agents.get_mut(&id) {
            Some(mut agent) => {
                if agent.heartbeat.task_types != heartbeat.task_types {
                    old_types = agent.heartbeat.task_types.clone();
                    new_types = Some(heartbeat.task_types.clone());
                }
                agent.load = heartbeat.in_flight;
                agent.heartbeat = heartbeat;
                agent.last_seen = now;
                agent.last_seen_ms = self.inner.config.clock.now_ms();
                agent.last_seen_unix_ms = now_unix_ms();
                false
            }
            None => {
                new_types = Some(heartbeat.task_types.clone());
                self.inner.agents.insert(
                    id.clone(),
                    LiveAgent {
                        load: heartbeat.in_flight,
                        heartbeat,
                        last_seen: now,
                        last_seen_ms: self.inner.config.clock.now_ms(),
                        last_seen_unix_ms: now_unix_ms(),
                        latency: HashMap::new(),
                        breaker: Breaker::default(),
                        assigned: 0,
                        last_assigned: 0,
                    },
                );
                true
            }
        };
        for task_type in &old_types {
            if let Some(mut ids) = self.inner.by_type.get_mut(task_type) {
                ids.remove(&id);
            }
        }
        for task_type in new_types.iter().flatten() {
            self.inner.by_type.entry(task_type.clone()).or_default().insert(id.clone());
        }
        if is_new {
            if !self.inner.quiet {
                info!(agent = %id, event = "agent_online", "agent registered");
            }
            if let Some(agent) = self.inner.agents.get(&id) {
                let _ = self.inner.changes.send(AgentEvent {
                    change: AgentChange::Online as i32,
                    agent: Some(agent.info(self.inner.config.clock.now_ms(), &self.inner.config)),
                    reason: String::new(),
                });
            }
        }
        Ok(None)
    }

    fn remove(&self, agent_id: &str, reason: &str) -> Option<AgentOffline> {
        let (_, agent) = self.inner.agents.remove(agent_id)?;
        for task_type in &agent.heartbeat.task_types {
            if let Some(mut ids) = self.inner.by_type.get_mut(task_type) {
                ids.remove(agent_id);
            }
        }
        if !self.inner.quiet {
            warn!(agent = %agent_id, reason, event = "agent_offline", "agent offline");
        }
        let mut info = agent.info(self.inner.config.clock.now_ms(), &self.inner.config);
        info.online = false;
        let _ = self.inner.changes.send(AgentEvent {
            change: AgentChange::Offline as i32,
            agent: Some(info),
            reason: reason.to_owned(),
        });
        Some(AgentOffline {
            agent_id: agent_id.to_owned(),
            pool: agent.heartbeat.pool,
            reason: reason.to_owned(),
            last_seen_unix_ms: agent.last_seen_unix_ms,
        })
    }

    /// Marks offline every agent whose last heartbeat is older than the TTL.
    pub fn expire(&self) -> Vec<AgentOffline> {
        let ttl = self.inner.config.heartbeat_ttl;
        let expired: Vec<String> = self
            .inner
            .agents
            .iter()
            .filter(|a| a.last_seen.elapsed() > ttl)
            .map(|a| a.key().clone())
            .collect();
        expired.iter().filter_map(|id| self.remove(id, "ttl_expired")).collect()
    }

    /// [`Registry::apply_heartbeat`] for a heartbeat as it arrived: its subject names the agent,
    /// its payload is the encoded `AgentHeartbeat`.
    pub fn apply_heartbeat_message(
        &self,
        subject: &str,
        payload: &[u8],
    ) -> Result<Option<AgentOffline>, hermes_core::Error> {
        let subject_agent = subject.rsplit('.').next().unwrap_or_default();
        let heartbeat = AgentHeartbeat::decode(payload)
            .map_err(|e| hermes_core::Error::Decode { kind: "AgentHeartbeat", reason: e.to_string() })?;
        self.apply_heartbeat(subject_agent, heartbeat)
    }

    /// Removes an agent the registry announced offline.
    pub fn forget(&self, agent_id: &str) {
        self.remove(agent_id, "offline");
    }

    /// A result from `agent_id` came back: one task fewer in flight there.
    pub fn task_finished(&self, agent_id: &str) {
        if let Some(mut agent) = self.inner.agents.get_mut(agent_id) {
            agent.load = agent.load.saturating_sub(1);
        }
    }

    /// How `agent_id`'s task of `task_type` ended, after running `elapsed`: a success feeds its
    /// latency for the type, and its own failures may cool it off (docs/routing.md). Frees no
    /// slot: [`Registry::task_finished`] does, for tasks routing reserved.
    pub fn observe(&self, agent_id: &str, task_type: &str, elapsed: Duration, outcome: Outcome) {
        let now = self.inner.config.clock.now_ms();
        let Some(mut agent) = self.inner.agents.get_mut(agent_id) else { return };
        if outcome == Outcome::Succeeded && !task_type.is_empty() {
            let ms = elapsed.as_secs_f64() * 1000.0;
            match agent.latency.get_mut(task_type) {
                Some(ewma) => ewma.observe(ms, now),
                None => {
                    // Bounded by the types it declares: a result naming another is not kept.
                    if agent.heartbeat.task_types.iter().any(|t| t == task_type) {
                        agent.latency.insert(task_type.to_owned(), PeakEwma::new(ms, now));
                    }
                }
            }
        }
        let before = agent.breaker;
        agent.breaker.observe(outcome, now, &self.inner.config.health);
        match (before, agent.breaker) {
            (Breaker::CoolingOff { .. }, _) => {}
            (_, Breaker::CoolingOff { cool_off_ms, .. }) => {
                warn!(agent = %agent_id, cool_off_ms, event = "agent_cool_off", "agent out of rotation after its own failures");
            }
            (Breaker::Probing { .. }, Breaker::Closed { .. }) => {
                info!(agent = %agent_id, event = "agent_back", "agent back in rotation after a probe");
            }
            _ => {}
        }
    }

    /// Decides where one task goes, and reserves a slot on the chosen agent.
    pub fn route(&self, query: &RouteQuery) -> RouteDecision {
        match self.inner.config.policy {
            Policy::Balanced => self.route_balanced(query),
            Policy::Scored => self.route_scored(query),
        }
    }

    /// A number from the draw, below `n`.
    fn draw(&self, n: usize) -> usize {
        let mut x = self.inner.draw.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.inner.draw.store(x, Ordering::Relaxed);
        (x % n as u64) as usize
    }

    /// [`Policy::Balanced`].
    fn route_balanced(&self, query: &RouteQuery) -> RouteDecision {
        struct Candidate {
            id: String,
            capability: (f64, usize, usize),
            latency: Option<f64>,
            load: u32,
            max: u32,
            last_assigned: u64,
        }
        let config = &self.inner.config;
        let now = config.clock.now_ms();
        let (mut candidates, capable, saturated, cooling, late) = {
            let Some(ids) = self.inner.by_type.get(&query.task_type) else {
                return pool_decision(query, 0, "no live agent serves this task type");
            };
            let mut candidates = Vec::with_capacity(ids.len());
            let (mut saturated, mut cooling, mut late) = (0, 0, 0);
            for id in ids.iter() {
                let Some(mut agent) = self.inner.agents.get_mut(id) else { continue };
                let max = agent.heartbeat.max_concurrency.max(1);
                if agent.saturated() {
                    saturated += 1;
                    continue;
                }
                if agent.late(now, config) {
                    late += 1;
                    continue;
                }
                if !agent.breaker.admits(now, &config.health) {
                    cooling += 1;
                    continue;
                }
                let own = agent.latency.get(&query.task_type).map(|e| e.read(now));
                // Before any result of this type: the agent's own figure from its heartbeat.
                let latency =
                    own.or((agent.heartbeat.latency_ms > 0.0).then_some(agent.heartbeat.latency_ms));
                candidates.push(Candidate {
                    id: id.clone(),
                    capability: capability(&agent.heartbeat, query),
                    latency,
                    load: agent.load,
                    max,
                    last_assigned: agent.last_assigned,
                });
            }
            (candidates, ids.len() as u32, saturated, cooling, late)
        };
        let left_out = match (cooling, late) {
            (0, 0) => String::new(),
            (c, 0) => format!("; {c} in cool-off left out"),
            (0, l) => format!("; {l} with a late heartbeat left out"),
            (c, l) => format!("; {c} in cool-off and {l} with a late heartbeat left out"),
        };
        if candidates.is_empty() {
            let why = format!("all {saturated} capable agents are saturated or draining{left_out}");
            return pool_decision(query, capable, &why);
        }
        // Only the most capable compete on speed: preferences come first.
        let top = candidates.iter().map(|c| c.capability.0).fold(f64::MIN, f64::max);
        candidates.retain(|c| c.capability.0 >= top - 1e-9);
        let known: Vec<f64> = candidates.iter().filter_map(|c| c.latency).collect();
        let assumed = if known.is_empty() { 1.0 } else { known.iter().sum::<f64>() / known.len() as f64 };
        // Latency (at least 1 ms) times the share of its slots taken once this task is in.
        let cost =
            |c: &Candidate| c.latency.unwrap_or(assumed).max(1.0) * f64::from(c.load + 1) / f64::from(c.max);
        let better = |a: &Candidate, b: &Candidate| {
            let (ca, cb) = (cost(a), cost(b));
            ca < cb - 1e-9 || ((ca - cb).abs() <= 1e-9 && a.last_assigned < b.last_assigned)
        };
        let (chosen, how) = if candidates.len() <= FULL_SCAN {
            let mut best = 0;
            for i in 1..candidates.len() {
                if better(&candidates[i], &candidates[best]) {
                    best = i;
                }
            }
            (best, format!("best of {}", candidates.len()))
        } else {
            // DRAWS distinct candidates at random (a partial shuffle), the best of them chosen.
            let n = candidates.len();
            let mut pick = None;
            for k in 0..DRAWS {
                let j = k + self.draw(n - k);
                candidates.swap(k, j);
                if pick.is_none_or(|p: usize| better(&candidates[k], &candidates[p])) {
                    pick = Some(k);
                }
            }
            (pick.unwrap_or(0), format!("best of {DRAWS} drawn from {n}"))
        };
        let best_cost = candidates.iter().map(&cost).fold(f64::MAX, f64::min);
        let c = &candidates[chosen];
        let chosen_cost = cost(c);
        let speed = best_cost / chosen_cost;
        let (capability, matched, wanted) = c.capability;
        let score = CAPABILITY_WEIGHT * capability + AVAILABILITY_WEIGHT * speed;
        let latency = match c.latency {
            Some(ms) => format!("latency {ms:.1} ms"),
            None => format!("latency unknown, {assumed:.1} ms assumed"),
        };
        let mut reason = format!(
            "capability {capability:.2} ({matched}/{wanted} preferences) x {CAPABILITY_WEIGHT} + speed {speed:.2} ({latency}, {}/{} busy: cost {chosen_cost:.1}, best {best_cost:.1}) x {AVAILABILITY_WEIGHT}; {how}{left_out}",
            c.load, c.max
        );
        let agent_id = c.id.clone();
        if let Some(mut agent) = self.inner.agents.get_mut(&agent_id) {
            if matches!(agent.breaker, Breaker::Probing { .. }) {
                reason.push_str("; a probe after its cool-off");
            }
            agent.breaker.routed(now);
            agent.load += 1;
            agent.assigned += 1;
            agent.last_assigned = self.inner.assign_clock.fetch_add(1, Ordering::Relaxed) + 1;
        }
        debug!(task_type = %query.task_type, agent = %agent_id, score, reason = %reason, "routed");
        RouteDecision { agent_id, score, reason, capable_agents: capable }
    }

    /// [`Policy::Scored`].
    fn route_scored(&self, query: &RouteQuery) -> RouteDecision {
        /// The best agent so far, with what its reason says.
        struct Best {
            score: f64,
            last_assigned: u64,
            id: String,
            capability: (f64, usize, usize),
            load: u32,
            max: u32,
        }
        let (best, capable, saturated) = {
            let Some(ids) = self.inner.by_type.get(&query.task_type) else {
                return pool_decision(query, 0, "no live agent serves this task type");
            };
            let mut best: Option<Best> = None;
            let mut saturated = 0;
            for id in ids.iter() {
                let Some(agent) = self.inner.agents.get(id) else { continue };
                let max = agent.heartbeat.max_concurrency.max(1);
                if agent.saturated() {
                    saturated += 1;
                    continue;
                }
                let capability = capability(&agent.heartbeat, query);
                let availability = 1.0 - f64::from(agent.load) / f64::from(max);
                let score = CAPABILITY_WEIGHT * capability.0 + AVAILABILITY_WEIGHT * availability;
                let better = best.as_ref().is_none_or(|b| {
                    score > b.score + 1e-9
                        || ((score - b.score).abs() <= 1e-9 && agent.last_assigned < b.last_assigned)
                });
                if better {
                    let id = id.clone();
                    best = Some(Best {
                        score,
                        last_assigned: agent.last_assigned,
                        id,
                        capability,
                        load: agent.load,
                        max,
                    });
                }
            }
            (best, ids.len() as u32, saturated)
        };
        let Some(Best { score, id: agent_id, capability: (capability, matched, wanted), load, max, .. }) =
            best
        else {
            let why = format!("all {saturated} capable agents are saturated or draining");
            return pool_decision(query, capable, &why);
        };
        let availability = 1.0 - f64::from(load) / f64::from(max);
        let reason = format!(
            "capability {capability:.2} ({matched}/{wanted} preferences) x {CAPABILITY_WEIGHT} + availability {availability:.2} ({load}/{max} busy) x {AVAILABILITY_WEIGHT}"
        );
        if let Some(mut agent) = self.inner.agents.get_mut(&agent_id) {
            agent.load += 1;
            agent.assigned += 1;
            agent.last_assigned = self.inner.assign_clock.fetch_add(1, Ordering::Relaxed) + 1;
        }
        debug!(task_type = %query.task_type, agent = %agent_id, score, reason = %reason, "routed");
        RouteDecision { agent_id, score, reason, capable_agents: capable }
    }

    /// Task types served by live agents, with their schemas.
    pub fn catalog(&self) -> CatalogReply {
        let mut entries: Vec<CatalogEntry> = Vec::new();
        for item in self.inner.by_type.iter() {
            let live: Vec<&String> = item.value().iter().collect();
            let Some(first) = live.first() else { continue };
            let tool = self
                .inner
                .agents
                .get(first.as_str())
                .and_then(|a| a.heartbeat.tools.iter().find(|t| &t.name == item.key()).cloned());
            entries.push(CatalogEntry {
                task_type: item.key().clone(),
                tool,
                live_agents: live.len() as u32,
            });
        }
        entries.sort_by(|a, b| a.task_type.cmp(&b.task_type));
        CatalogReply { entries }
    }

    /// The ids of the live agents, in no order.
    pub fn agent_ids(&self) -> Vec<String> {
        self.inner.agents.iter().map(|a| a.key().clone()).collect()
    }

    /// Every live agent, by id.
    pub fn agents(&self) -> Vec<AgentInfo> {
        let now = self.inner.config.clock.now_ms();
        let mut agents: Vec<AgentInfo> =
            self.inner.agents.iter().map(|a| a.info(now, &self.inner.config)).collect();
        agents.sort_by(|a, b| {
            let id = |i: &AgentInfo| i.heartbeat.as_ref().map(|h| h.agent_id.clone()).unwrap_or_default();
            id(a).cmp(&id(b))
        });
        agents
    }

    /// How routing sees `agent_id` now (`ok`, `cool-off`, `probing`, `late`), if it is live.
    pub fn health_of(&self, agent_id: &str) -> Option<&'static str> {
        let now = self.inner.config.clock.now_ms();
        let agent = self.inner.agents.get(agent_id)?;
        Some(if agent.late(now, &self.inner.config) { "late" } else { agent.breaker.name(now) })
    }

    /// Live agents declaring `task_type`, by id.
    pub fn capable_agents(&self, task_type: &str) -> Vec<String> {
        self.inner.by_type.get(task_type).map(|ids| ids.iter().cloned().collect()).unwrap_or_default()
    }

    /// Changes as they happen, for WatchAgents.
    pub fn subscribe(&self) -> broadcast::Receiver<AgentEvent> {
        self.inner.changes.subscribe()
    }

    pub fn len(&self) -> usize {
        self.inner.agents.len()
    }

    pub fn is_empty(&self) -> bool {
        self.inner.agents.is_empty()
    }

    /// Loads the heartbeats mirrored in KV that are still within the TTL, so a restarted
    /// registry can route at once instead of after the next heartbeat period. Agents whose last
    /// heartbeat is older than the TTL died while no registry was watching (or while this one
    /// was down): their entries are removed and they are returned, to be announced offline so a
    /// dispatcher takes over their directed work.
    pub async fn rebuild_from_kv(&self, bus: &Bus) -> (usize, Vec<AgentOffline>) {
        let agents = bus.agents();
        let mirrored = match agents.all().await {
            Ok(mirrored) => mirrored,
            Err(e) => {
                warn!(error = %e, "cannot read the mirrored heartbeats; agents are known from their next heartbeat");
                return (0, Vec::new());
            }
        };
        let ttl_ms = self.inner.config.heartbeat_ttl.as_millis() as u64;
        let mut loaded = 0;
        let mut dead = Vec::new();
        for (key, hb) in mirrored {
            if now_unix_ms().saturating_sub(hb.sent_unix_ms) <= ttl_ms {
                if self.apply_heartbeat(&key, hb).is_ok() {
                    loaded += 1;
                }
            } else if !self.inner.quiet {
                // A mirror leaves the dead to the registry, which removes and announces them.
                let _ = agents.remove(&key).await;
                dead.push(AgentOffline {
                    agent_id: key.clone(),
                    pool: hb.pool,
                    reason: "ttl_expired".into(),
                    last_seen_unix_ms: hb.sent_unix_ms,
                });
            }
        }
        (loaded, dead)
    }
}

/// Feeds `result` to `registry`'s view of the agent that ran it: its latency and health.
pub fn observe_result(registry: &Registry, result: &hermes_proto::TaskResult) {
    let succeeded = result.status == hermes_proto::TaskStatus::Succeeded as i32;
    let code = result.error.as_ref().map_or("", |e| e.code.as_str());
    let elapsed = Duration::from_millis(result.elapsed_ms);
    registry.observe(&result.agent_id, &result.task_type, elapsed, Outcome::of(succeeded, code));
}

fn pool_decision(query: &RouteQuery, capable: u32, why: &str) -> RouteDecision {
    RouteDecision {
        agent_id: String::new(),
        score: 0.0,
        reason: format!("pool: {why} ({})", query.task_type),
        capable_agents: capable,
    }
}

/// Capability of an agent that declares the task type: 0.5 plus 0.5 × the share of the node's
/// preferences it matches; 1.0 when the node has none.
fn capability(agent: &AgentHeartbeat, query: &RouteQuery) -> (f64, usize, usize) {
    let tags: HashSet<&str> = agent.tags.iter().map(String::as_str).collect();
    let tools: HashSet<&str> = agent.tools.iter().map(|t| t.name.as_str()).collect();
    let mut wanted = 0;
    let mut matched = 0;
    for tag in &query.tags {
        wanted += 1;
        matched += usize::from(tags.contains(tag.as_str()));
    }
    for tool in &query.tools {
        wanted += 1;
        matched += usize::from(tools.contains(tool.as_str()));
    }
    if !query.model.is_empty() {
        wanted += 1;
        matched += usize::from(agent.model == query.model);
    }
    if wanted == 0 {
        return (1.0, 0, 0);
    }
    (0.5 + 0.5 * matched as f64 / wanted as f64, matched, wanted)
}

/// Rejects heartbeats that are malformed, oversized, or claim another agent's subject.
fn validate_heartbeat(subject_agent: &str, hb: &AgentHeartbeat) -> Result<(), hermes_core::Error> {
    let bad = |reason: String| hermes_core::Error::InvalidArgument { field: "heartbeat".into(), reason };
    validate_agent_id(&hb.agent_id)?;
    if hb.agent_id != subject_agent {
        return Err(bad(format!(
            "heartbeat for `{}` arrived on the subject of `{subject_agent}`",
            hb.agent_id
        )));
    }
    if hb.deregister {
        return Ok(());
    }
    if hb.max_concurrency == 0 {
        return Err(bad("max_concurrency must be at least 1".to_owned()));
    }
    if hb.task_types.is_empty() || hb.task_types.len() > MAX_TASK_TYPES_PER_AGENT {
        return Err(bad(format!(
            "declares {} task types; 1 to {MAX_TASK_TYPES_PER_AGENT} are allowed",
            hb.task_types.len()
        )));
    }
    if hb.tools.len() > MAX_TASK_TYPES_PER_AGENT || hb.tags.len() > MAX_TAGS_PER_AGENT {
        return Err(bad(format!(
            "declares {} tools and {} tags; at most {MAX_TASK_TYPES_PER_AGENT} and {MAX_TAGS_PER_AGENT}",
            hb.tools.len(),
            hb.tags.len()
        )));
    }
    for task_type in &hb.task_types {
        validate_task_type(task_type)?;
    }
    if let Some(tool) = hb.tools.iter().find(|t| t.params_schema_json.len() > MAX_SCHEMA_BYTES) {
        return Err(bad(format!("tool `{}` has a schema over {MAX_SCHEMA_BYTES} bytes", tool.name)));
    }
    Ok(())
}

/// Keeps a [`Registry::mirror`] current from the agents' heartbeats until `shutdown` is cancelled;
/// load it first with [`Registry::rebuild_from_kv`]. Agents leave it when they deregister or when
/// its owner [`forget`](Registry::forget)s them on the registry's offline notice; results free
/// the slots routing reserved when the owner calls [`Registry::task_finished`].
pub async fn follow(bus: Bus, mirror: Registry, shutdown: CancellationToken) -> anyhow::Result<()> {
    let mut heartbeats = bus.client().subscribe(bus.topology().all_heartbeats()).await?;
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            msg = heartbeats.next() => {
                let Some(msg) = msg else { break };
                // A heartbeat the registry rejects is rejected here too; the registry logs it.
                let _ = mirror.apply_heartbeat_message(&msg.subject, &msg.payload);
            }
        }
    }
    Ok(())
}

/// Runs the registry's NATS side until `shutdown` is cancelled.
/// Keeps `hermes_agents_online` (live agents by task type) and `hermes_pool_agents` (by pool)
/// current at every scrape, for as long as the registry exists. A series whose last agent left
/// reads 0.
fn export_metrics(registry: &Registry) {
    use hermes_core::metrics::{Labels, labels};
    let inner = Arc::downgrade(&registry.inner);
    let seen = std::sync::Mutex::new(BTreeSet::<(bool, Labels)>::new());
    hermes_core::metrics::global().on_scrape(move || {
        let Some(inner) = inner.upgrade() else { return };
        let metrics = hermes_core::metrics::global();
        let mut live: std::collections::BTreeMap<(bool, Labels), i64> = Default::default();
        for entry in inner.by_type.iter() {
            live.insert((false, labels(&[("task_type", entry.key())])), entry.value().len() as i64);
        }
        for agent in inner.agents.iter() {
            *live.entry((true, labels(&[("pool", &agent.heartbeat.pool)]))).or_default() += 1;
        }
        let gauge = |by_pool: bool| if by_pool { &metrics.pool_agents } else { &metrics.agents_online };
        let mut seen = seen.lock().unwrap_or_else(|p| p.into_inner());
        for key in seen.iter().filter(|k| !live.contains_key(*k)) {
            gauge(key.0).get_or_create(&key.1).set(0);
        }
        for (key, count) in live {
            gauge(key.0).get_or_create(&key.1).set(count);
            seen.insert(key);
        }
    });
}

/// A registry with `config`, its `hermes.v1.Registry` API added to `cx`'s gRPC server (which
/// must be listening): what `hermes-registry` and `hermes up` both start. Its table is kept by
/// [`run`], which the caller spawns (`hermes up` keeps the handle, to restart it in tests).
pub fn start(config: RegistryConfig, cx: &mut hermes_runtime::Context) -> anyhow::Result<Registry> {
    let registry = Registry::new(config);
    let limit = cx.grpc_max_message_bytes();
    let grpc = RegistryGrpc::new(registry.clone(), cx.shutdown()).into_service();
    cx.grpc("hermes.v1.Registry")?.add_service(grpc.max_decoding_message_size(limit));
    Ok(registry)
}

pub async fn run(bus: Bus, registry: Registry, shutdown: CancellationToken) -> anyhow::Result<()> {
    export_metrics(&registry);
    let topology = bus.topology().clone();
    // A bucket made by a release whose entries never expired: its delete markers piled up.
    match bus.agents().expire_entries(bus.jetstream()).await {
        Ok(true) => info!(
            event = "agents_bucket_bounded",
            "the agents bucket's entries now expire a day after their last write"
        ),
        Ok(false) => {}
        Err(e) => {
            warn!(error = %e, "cannot set the agents bucket's max age; its delete markers are not bounded")
        }
    }
    let (loaded, dead) = registry.rebuild_from_kv(&bus).await;
    let mut heartbeats = bus.client().subscribe(topology.all_heartbeats()).await?;
    let mut catalog = bus.client().queue_subscribe(topology.catalog(), topology.registry_queue()).await?;
    let mut agents_list =
        bus.client().queue_subscribe(topology.agents_list(), topology.registry_queue()).await?;
    let mut routes = bus.client().queue_subscribe(topology.route(), topology.registry_queue()).await?;
    // Every result, as a plain subscriber: the latency and health it lists and routes by. (Its
    // reservations are not freed by them: dispatchers route from views of their own.)
    let mut results = bus.client().subscribe(topology.all_results()).await?;
    let sweep_every =
        (registry.inner.config.heartbeat_ttl / 4).clamp(Duration::from_millis(50), Duration::from_secs(1));
    let mut sweep = tokio::time::interval(sweep_every);
    info!(agents = loaded, dead = dead.len(), "registry serving");
    let publish_offline = |offline: AgentOffline| {
        let bus = bus.clone();
        async move {
            let subject = bus.topology().agent_offline();
            if let Err(e) = bus.client().publish(subject, offline.encode_to_vec().into()).await {
                warn!(error = %e, "cannot publish agent offline");
            }
        }
    };
    // Announced a little later, so a dispatcher starting in the same process (or alongside this
    // registry after a restart of both) is subscribed by then; the node deadlines are the backstop.
    let late_bus = bus.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(3)).await;
        for offline in dead {
            info!(agent = %offline.agent_id, event = "agent_offline", "agent died while no registry watched");
            let subject = late_bus.topology().agent_offline();
            if let Err(e) = late_bus.client().publish(subject, offline.encode_to_vec().into()).await {
                warn!(error = %e, "cannot publish agent offline");
            }
        }
    });
    async {
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                Some(msg) = heartbeats.next() => {
                    match registry.apply_heartbeat_message(&msg.subject, &msg.payload) {
                        Ok(Some(offline)) => publish_offline(offline).await,
                        Ok(None) => {}
                        Err(reason) => {
                            warn!(subject = %msg.subject, reason = %reason, event = "heartbeat_rejected", "heartbeat rejected");
                        }
                    }
                }
                Some(msg) = routes.next() => {
                    if let Some(reply) = msg.reply {
                        let decisions = match RouteRequest::decode(msg.payload.clone()) {
                            Ok(req) => req.queries.iter().map(|q| registry.route(q)).collect(),
                            Err(e) => {
                                warn!(error = %e, "malformed route request");
                                Vec::new()
                            }
                        };
                        let body = RouteReply { decisions }.encode_to_vec();
                        if let Err(e) = bus.client().publish(reply, body.into()).await {
                            debug!(error = %e, "route reply failed");
                        }
                    }
                }
                Some(msg) = results.next() => {
                    if let Ok(result) = hermes_proto::TaskResult::decode(msg.payload) {
                        observe_result(&registry, &result);
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
                Some(msg) = agents_list.next() => {
                    if let Some(reply) = msg.reply {
                        let body = hermes_proto::ListAgentsResponse { agents: registry.agents() }.encode_to_vec();
                        if let Err(e) = bus.client().publish(reply, body.into()).await {
                            debug!(error = %e, "agents reply failed");
                        }
                    }
                }
                _ = sweep.tick() => {
                    for offline in registry.expire() {
                        publish_offline(offline).await;
                    }
                }
            }
        }
    }
    .await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn beat(id: &str, types: &[&str], max: u32) -> AgentHeartbeat {
        AgentHeartbeat {
            agent_id: id.into(),
            task_types: types.iter().map(|t| t.to_string()).collect(),
            max_concurrency: max,
            ..Default::default()
        }
    }

    fn query(task_type: &str) -> RouteQuery {
        RouteQuery { task_type: task_type.into(), ..Default::default() }
    }

    #[test]
    fn malformed_and_spoofed_heartbeats_are_rejected_with_a_reason() {
        let r = Registry::new(RegistryConfig::default());
        assert!(r.apply_heartbeat("", beat("", &["a"], 1)).unwrap_err().to_string().contains("agent_id"));
        assert!(
            r.apply_heartbeat("x", beat("x", &["a.*"], 1)).unwrap_err().to_string().contains("task_type")
        );
        assert!(
            r.apply_heartbeat("x", beat("x", &["a"], 0)).unwrap_err().to_string().contains("max_concurrency")
        );
        let many: Vec<String> = (0..300).map(|i| format!("t{i}")).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert!(
            r.apply_heartbeat("x", beat("x", &refs, 1)).unwrap_err().to_string().contains("300 task types")
        );
        assert!(
            r.apply_heartbeat("y", beat("x", &["a"], 1)).unwrap_err().to_string().contains("subject of `y`")
        );
        assert!(r.is_empty());
    }

    #[test]
    fn load_spreads_evenly_across_equal_agents() {
        let r = Registry::new(RegistryConfig::default());
        for id in ["a1", "a2", "a3"] {
            r.apply_heartbeat(id, beat(id, &["t"], 100)).unwrap();
        }
        let mut counts = std::collections::HashMap::new();
        for _ in 0..300 {
            *counts.entry(r.route(&query("t")).agent_id).or_insert(0) += 1;
        }
        assert_eq!(counts.values().copied().collect::<Vec<_>>(), vec![100, 100, 100]);
    }

    #[test]
    fn saturated_agents_are_skipped_and_results_free_them() {
        let r = Registry::new(RegistryConfig::default());
        r.apply_heartbeat("a1", beat("a1", &["t"], 1)).unwrap();
        assert_eq!(r.route(&query("t")).agent_id, "a1");
        let pool = r.route(&query("t"));
        assert_eq!(pool.agent_id, "");
        assert!(pool.reason.contains("saturated"), "{}", pool.reason);
        r.task_finished("a1");
        assert_eq!(r.route(&query("t")).agent_id, "a1");
        let none = r.route(&query("other"));
        assert_eq!((none.agent_id.as_str(), none.capable_agents), ("", 0));
    }

    /// An agent that left pooled work waiting gets no directed work until a heartbeat says the
    /// wait is over: a directed task would pass the tenants' lanes by (docs/security.md).
    #[test]
    fn an_agent_with_pooled_work_waiting_gets_no_directed_work() {
        for policy in [Policy::Balanced, Policy::Scored] {
            let r = Registry::new(RegistryConfig { policy, ..Default::default() });
            let mut busy = beat("a1", &["t"], 4);
            busy.backlogged = true;
            r.apply_heartbeat("a1", busy).unwrap();
            let pool = r.route(&query("t"));
            assert_eq!(pool.agent_id, "", "{policy:?}");
            assert!(pool.reason.contains("saturated"), "{}", pool.reason);
            r.apply_heartbeat("a1", beat("a1", &["t"], 4)).unwrap();
            assert_eq!(r.route(&query("t")).agent_id, "a1", "{policy:?}");
        }
    }

    #[test]
    fn preferences_raise_the_score() {
        let r = Registry::new(RegistryConfig::default());
        let mut gpu = beat("gpu", &["t"], 10);
        gpu.tags = vec!["gpu".into()];
        r.apply_heartbeat("gpu", gpu).unwrap();
        r.apply_heartbeat("cpu", beat("cpu", &["t"], 10)).unwrap();
        let q = RouteQuery { task_type: "t".into(), tags: vec!["gpu".into()], ..Default::default() };
        let d = r.route(&q);
        assert_eq!(d.agent_id, "gpu");
        assert!((d.score - 1.0).abs() < 1e-9, "{}", d.score);
        assert!(d.reason.contains("1/1 preferences"), "{}", d.reason);
    }

    #[test]
    fn offline_agents_leave_the_catalogue_and_routes() {
        let r =
            Registry::new(RegistryConfig { heartbeat_ttl: Duration::from_millis(50), ..Default::default() });
        r.apply_heartbeat("a1", beat("a1", &["math.evaluate", "time.now"], 4)).unwrap();
        r.apply_heartbeat("a2", beat("a2", &["math.evaluate"], 4)).unwrap();
        assert_eq!(r.capable_agents("math.evaluate"), vec!["a1", "a2"]);
        assert_eq!(r.catalog().entries.len(), 2);
        let mut bye = beat("a2", &[], 0);
        bye.deregister = true;
        let offline = r.apply_heartbeat("a2", bye).unwrap().unwrap();
        assert_eq!(offline.reason, "deregistered");
        assert_eq!(r.capable_agents("math.evaluate"), vec!["a1"]);
        std::thread::sleep(Duration::from_millis(80));
        let expired = r.expire();
        assert_eq!(expired.len(), 1);
        assert_eq!(expired[0].reason, "ttl_expired");
        assert_eq!(r.route(&query("time.now")).agent_id, "");
        assert!(r.catalog().entries.is_empty());
    }

    /// A registry on a clock the test moves, and the clock.
    fn on_clock(policy: Policy) -> (Registry, Arc<AtomicU64>) {
        let now = Arc::new(AtomicU64::new(1_000));
        let config =
            RegistryConfig { policy, clock: Clock::manual(now.clone()), seed: 7, ..Default::default() };
        (Registry::new(config), now)
    }

    /// Routes `n` tasks of `t`, each finished at once; the count each agent got.
    fn spread(r: &Registry, n: usize) -> std::collections::BTreeMap<String, usize> {
        let mut counts = std::collections::BTreeMap::new();
        for _ in 0..n {
            let d = r.route(&query("t"));
            r.task_finished(&d.agent_id);
            *counts.entry(d.agent_id).or_insert(0) += 1;
        }
        counts
    }

    #[test]
    fn a_slow_agent_gets_less_and_the_reason_names_the_terms() {
        let (r, _) = on_clock(Policy::Balanced);
        for id in ["fast", "slow"] {
            r.apply_heartbeat(id, beat(id, &["t"], 4)).unwrap();
        }
        r.observe("fast", "t", Duration::from_millis(10), Outcome::Succeeded);
        r.observe("slow", "t", Duration::from_millis(100), Outcome::Succeeded);
        let d = r.route(&query("t"));
        assert_eq!(d.agent_id, "fast");
        assert!(d.reason.contains("speed 1.00 (latency 10.0 ms, 0/4 busy"), "{}", d.reason);
        assert!(d.reason.contains("best of 2"), "{}", d.reason);
        // Each task finished before the next: the fast one always costs less.
        r.task_finished("fast");
        let counts = spread(&r, 100);
        assert_eq!(counts.get("fast"), Some(&100), "{counts:?}");
        // The old policy knows nothing of latency: equal agents take turns.
        let (old, _) = on_clock(Policy::Scored);
        for id in ["fast", "slow"] {
            old.apply_heartbeat(id, beat(id, &["t"], 4)).unwrap();
        }
        old.observe("slow", "t", Duration::from_millis(100), Outcome::Succeeded);
        assert_eq!(spread(&old, 100).get("slow"), Some(&50));
    }

    #[test]
    fn an_agent_failing_on_its_own_cools_off_then_one_probe_brings_it_back() {
        let (r, now) = on_clock(Policy::Balanced);
        for id in ["a1", "a2"] {
            r.apply_heartbeat(id, beat(id, &["t"], 10)).unwrap();
        }
        // Failures of the tool's dependency say nothing of the agent.
        for _ in 0..5 {
            r.observe("a1", "t", Duration::from_millis(1), Outcome::OtherFailure);
        }
        assert_eq!(spread(&r, 10).get("a1"), Some(&5));
        for _ in 0..3 {
            r.observe("a1", "t", Duration::from_millis(1), Outcome::AgentFault);
        }
        let d = r.route(&query("t"));
        assert_eq!(d.agent_id, "a2");
        assert!(d.reason.contains("1 in cool-off left out"), "{}", d.reason);
        r.task_finished("a2");
        assert_eq!(spread(&r, 20).get("a1"), None, "no task goes to an agent in cool-off");
        let listed = r.agents();
        assert_eq!(listed[0].health, "cool-off");
        assert!(listed[0].cool_off_until_unix_ms > now_unix_ms());
        // The cool-off is over: one task goes to it, as a probe, and no other until it answers.
        now.fetch_add(5_000, Ordering::Relaxed);
        let counts = spread(&r, 10);
        assert_eq!(counts.get("a1"), Some(&1), "{counts:?}");
        assert_eq!(r.agents()[0].health, "probing");
        r.observe("a1", "t", Duration::from_millis(1), Outcome::Succeeded);
        assert_eq!(r.agents()[0].health, "ok");
        assert_eq!(spread(&r, 10).get("a1"), Some(&5));
    }

    #[test]
    fn an_agent_whose_heartbeat_is_late_is_left_out_until_its_next_one() {
        let (r, now) = on_clock(Policy::Balanced);
        for id in ["a1", "a2"] {
            let mut hb = beat(id, &["t"], 10);
            hb.heartbeat_period_ms = 1_000;
            r.apply_heartbeat(id, hb).unwrap();
        }
        now.fetch_add(1_500, Ordering::Relaxed);
        let mut hb = beat("a2", &["t"], 10);
        hb.heartbeat_period_ms = 1_000;
        r.apply_heartbeat("a2", hb).unwrap();
        now.fetch_add(1_000, Ordering::Relaxed);
        let d = r.route(&query("t"));
        assert_eq!(d.agent_id, "a2");
        assert!(d.reason.contains("1 with a late heartbeat left out"), "{}", d.reason);
        assert_eq!(r.agents()[0].health, "late");
        let mut hb = beat("a1", &["t"], 10);
        hb.heartbeat_period_ms = 1_000;
        r.apply_heartbeat("a1", hb).unwrap();
        assert_eq!(r.agents()[0].health, "ok");
    }

    #[test]
    fn past_a_small_pool_three_agents_are_drawn_and_the_slow_one_never_wins() {
        let (r, _) = on_clock(Policy::Balanced);
        for i in 0..40 {
            let id = format!("a{i:02}");
            r.apply_heartbeat(&id, beat(&id, &["t"], 8)).unwrap();
            let ms = if i == 0 { 500 } else { 10 };
            r.observe(&id, "t", Duration::from_millis(ms), Outcome::Succeeded);
        }
        let d = r.route(&query("t"));
        assert!(d.reason.contains("best of 3 drawn from 40"), "{}", d.reason);
        r.task_finished(&d.agent_id);
        let counts = spread(&r, 2_000);
        assert_eq!(counts.get("a00"), None, "{counts:?}");
        // The draw spreads the work: every other agent got some.
        assert_eq!(counts.len(), 39, "{counts:?}");
        // Preferences come before speed: the one agent matching the node's tag gets its task.
        let mut tagged = beat("tagged", &["t"], 8);
        tagged.tags = vec!["gpu".into()];
        r.apply_heartbeat("tagged", tagged).unwrap();
        r.observe("tagged", "t", Duration::from_millis(900), Outcome::Succeeded);
        let q = RouteQuery { task_type: "t".into(), tags: vec!["gpu".into()], ..Default::default() };
        assert_eq!(r.route(&q).agent_id, "tagged");
    }
}
