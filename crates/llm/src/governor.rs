//! Fleet-wide limits on model calls: concurrency, requests and tokens per minute, tenants'
//! shares of each, and the cooldown a provider asks for, kept in NATS so that every process of a
//! deployment counts against the same figures (docs/llm.md, "Fleet-wide limits").
//!
//! Each limited model (a provider's base URL and a model name) has one entry in the KV bucket
//! `hermes_model_limits`: its leases (calls in flight, each with an expiry), its waiting line,
//! its last two minutes of requests and tokens, and its cooldown. Every change is a
//! compare-and-set of that one entry, so a call is admitted only against the figures as they are
//! when its admission is stored: concurrent calls cannot all pass a check that together they
//! would exceed.
//!
//! - **Concurrency.** A call holds a lease while it runs. The holder renews it every third of
//!   [`LimitSettings::lease_ttl_secs`]; a lease not renewed by its expiry (its process was killed)
//!   counts as free, and the next writer drops it.
//! - **Requests and tokens per minute.** Admission adds one request and the call's prompt plus
//!   its `max_tokens` (or [`LimitSettings::default_completion_tokens`]) to the current minute;
//!   the call's real usage replaces the reservation when it ends. The minute before counts in
//!   proportion to how much of it is still within the last 60 seconds.
//! - **Tenants.** A tenant's share of a limit is its weight over the weights of the tenants
//!   using the model (holding, waiting or counted in the last two minutes). While others are
//!   active, a tenant may not take the part of a rate limit that their shares reserve, and the
//!   waiting line lets a freed slot go to the tenant holding the fewest slots for its weight.
//! - **Cooldown.** A 429 or 503 with `Retry-After` from the provider stops every process's calls
//!   to the model until the time it names (at most [`MAX_COOLDOWN`]).
//!
//! A call that must wait takes a ticket in the waiting line, watches the entry and is told by
//! [`CallScope::observer`] that it waits and when it goes on. It waits at most until the
//! scope's deadline (the goal's), then fails `TIMEOUT`.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use bytes::Bytes;
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use tokio::sync::{oneshot, watch};
use tracing::{debug, warn};

use crate::LlmError;

/// The bucket holding every limited model's entry.
pub const BUCKET: &str = "hermes_model_limits";

/// Longest cooldown honoured from a provider's `Retry-After`.
pub const MAX_COOLDOWN: Duration = Duration::from_secs(600);

/// How long a waiting call goes without looking at the entry, when no change wakes it.
const WAIT_POLL: Duration = Duration::from_millis(250);

/// Writes to a model's entry that may conflict in a row before a call gives up on it.
const MAX_CONFLICTS: u32 = 200;

/// The limits of one model, all optional.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ModelLimits {
    /// Calls in flight at once across the fleet.
    pub max_concurrent: Option<u32>,
    /// Requests admitted in any 60 seconds.
    pub requests_per_minute: Option<u64>,
    /// Prompt and completion tokens in any 60 seconds (reserved at admission, corrected after).
    pub tokens_per_minute: Option<u64>,
}

impl ModelLimits {
    fn any(&self) -> bool {
        self.max_concurrent.is_some()
            || self.requests_per_minute.is_some()
            || self.tokens_per_minute.is_some()
    }
}

/// `[llm.limits]`: fleet-wide limits on model calls, by model name. Off (nothing limited) until a
/// model is named.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LimitSettings {
    /// Limits by model name (`gpt-4o-mini`, `qwen2.5:7b-instruct`); `"*"` applies to every model
    /// not named.
    pub models: BTreeMap<String, ModelLimits>,
    /// Tenants' weights for their shares of each limit (1 for a tenant not named; the empty
    /// tenant is that of goals with auth off).
    pub tenants: BTreeMap<String, u32>,
    /// A lease's lifetime without renewal: the longest a killed process keeps its slot.
    pub lease_ttl_secs: u64,
    /// Completion tokens reserved for a call that sets no `max_tokens`.
    pub default_completion_tokens: u64,
}

impl Default for LimitSettings {
    fn default() -> Self {
        Self {
            models: BTreeMap::new(),
            tenants: BTreeMap::new(),
            lease_ttl_secs: 30,
            default_completion_tokens: 1024,
        }
    }
}

impl LimitSettings {
    /// Whether any model is limited.
    pub fn active(&self) -> bool {
        self.models.values().any(ModelLimits::any)
    }

    /// The limits of `model`: its own, else those of `"*"`.
    pub fn for_model(&self, model: &str) -> Option<&ModelLimits> {
        self.models.get(model).or_else(|| self.models.get("*")).filter(|l| l.any())
    }

    /// Refuses settings that cannot work, naming the key.
    pub fn validate(&self) -> Result<(), LlmError> {
        for (model, limits) in &self.models {
            if limits.max_concurrent == Some(0)
                || limits.requests_per_minute == Some(0)
                || limits.tokens_per_minute == Some(0)
            {
                return Err(LlmError::Config(format!(
                    "llm.limits.models.\"{model}\": a limit of 0 would stop every call; leave it out for no limit"
                )));
            }
        }
        if let Some((tenant, _)) = self.tenants.iter().find(|(_, w)| **w == 0) {
            return Err(LlmError::Config(format!(
                "llm.limits.tenants.\"{tenant}\": a weight must be at least 1"
            )));
        }
        if self.lease_ttl_secs == 0 {
            return Err(LlmError::Config("llm.limits.lease_ttl_secs must be at least 1".into()));
        }
        Ok(())
    }

    fn weight(&self, tenant: &str) -> f64 {
        f64::from(self.tenants.get(tenant).copied().unwrap_or(1).max(1))
    }
}

/// Why a call waits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WaitReason {
    Concurrency,
    RequestsPerMinute,
    TokensPerMinute,
    Cooldown,
}

impl WaitReason {
    pub fn as_str(self) -> &'static str {
        match self {
            WaitReason::Concurrency => "concurrency",
            WaitReason::RequestsPerMinute => "requests_per_minute",
            WaitReason::TokensPerMinute => "tokens_per_minute",
            WaitReason::Cooldown => "cooldown",
        }
    }
}

/// Told when a call starts and stops waiting for the fleet's limits (the executor reports it as
/// the node's `ModelWaiting` event).
pub trait WaitObserver: Send + Sync {
    fn waiting(&self, model: &str, reason: WaitReason);
    fn resumed(&self, model: &str, waited: Duration);
}

/// Who a model call is for: the tenant whose share it uses, the deadline its wait counts
/// against, and who hears that it waits. Set around a task's or a goal's work with [`scoped`].
#[derive(Clone, Default)]
pub struct CallScope {
    pub tenant: String,
    pub deadline: Option<Instant>,
    pub observer: Option<Arc<dyn WaitObserver>>,
}

tokio::task_local! {
    static SCOPE: CallScope;
}

/// Runs `work` with `scope` as the scope of its model calls.
pub async fn scoped<F: Future>(scope: CallScope, work: F) -> F::Output {
    SCOPE.scope(scope, work).await
}

fn current_scope() -> CallScope {
    SCOPE.try_with(Clone::clone).unwrap_or_default()
}

static INSTALLED: RwLock<Option<Arc<Governor>>> = RwLock::new(None);

/// Makes `governor` the one every OpenAI-compatible client of this process asks (the latest
/// installed wins). Services install it once connected, with [`Governor::start`].
pub fn install(governor: Option<Arc<Governor>>) {
    *INSTALLED.write().unwrap_or_else(|p| p.into_inner()) = governor;
}

/// The installed governor, when one is.
pub fn installed() -> Option<Arc<Governor>> {
    INSTALLED.read().unwrap_or_else(|p| p.into_inner()).clone()
}

/// The limiter of one process, over the shared bucket.
pub struct Governor {
    store: kv::Store,
    settings: LimitSettings,
    /// Names this process's leases for an operator reading the bucket: its bus name and pid.
    holder: String,
    /// One watch of each model's entry for all of this process's waiting calls, while any wait
    /// ([`Governor::watch_entry`]): a watch per call would be a JetStream consumer per call.
    watches: Arc<Mutex<HashMap<String, watch::Sender<u64>>>>,
    /// Changes waiting for each entry's writer ([`Governor::change`]); a key is present while its
    /// writer runs.
    queues: Mutex<HashMap<String, Vec<Queued>>>,
}

/// A change queued for a model's entry, applied in order with the others of its batch: `true`
/// when it changed the state (one returning `false` leaves it as it was).
type Op = Box<dyn FnMut(&mut ModelState, u64) -> bool + Send>;

struct Queued {
    op: Op,
    /// The batch's outcome: stored, or why not.
    done: oneshot::Sender<Result<(), String>>,
}

impl std::fmt::Debug for Governor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Governor").field("holder", &self.holder).finish_non_exhaustive()
    }
}

/// A model's entry in the bucket.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct ModelState {
    #[serde(default)]
    leases: BTreeMap<String, Lease>,
    #[serde(default)]
    waiting: BTreeMap<String, Ticket>,
    /// Minute (unix ms / 60 000) to what was admitted in it.
    #[serde(default)]
    windows: BTreeMap<u64, Window>,
    #[serde(default)]
    cooldown_until_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Lease {
    tenant: String,
    holder: String,
    since_ms: u64,
    expires_ms: u64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
struct Ticket {
    tenant: String,
    since_ms: u64,
    /// Renewed while the caller waits; a ticket not seen for a lease's lifetime is dropped.
    seen_ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Window {
    requests: u64,
    tokens: u64,
    /// Tenant to (requests, tokens).
    #[serde(default)]
    tenants: BTreeMap<String, (u64, u64)>,
}

/// Requests and tokens counted within the last 60 seconds.
type Used = (f64, f64);

/// What the entry says of one call asking now.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Decision {
    Admit,
    Wait(WaitReason),
}

impl ModelState {
    /// Drops expired leases, stale tickets and minutes older than the one before `now`.
    fn prune(&mut self, now_ms: u64, ttl_ms: u64) {
        self.leases.retain(|_, l| l.expires_ms > now_ms);
        self.waiting.retain(|_, t| t.seen_ms + ttl_ms > now_ms);
        let minute = now_ms / 60_000;
        self.windows.retain(|m, _| *m + 1 >= minute);
    }

    /// Requests and tokens within the last 60 seconds, in all and by tenant: the current minute
    /// plus the part of the minute before still within them.
    fn used(&self, now_ms: u64) -> (Used, BTreeMap<&str, Used>) {
        let minute = now_ms / 60_000;
        let past = 1.0 - (now_ms % 60_000) as f64 / 60_000.0;
        let mut total = (0.0, 0.0);
        let mut tenants: BTreeMap<&str, (f64, f64)> = BTreeMap::new();
        for (m, window) in &self.windows {
            let share = if *m == minute {
                1.0
            } else if *m + 1 == minute {
                past
            } else {
                continue;
            };
            total.0 += window.requests as f64 * share;
            total.1 += window.tokens as f64 * share;
            for (tenant, (r, t)) in &window.tenants {
                let entry = tenants.entry(tenant.as_str()).or_default();
                entry.0 += *r as f64 * share;
                entry.1 += *t as f64 * share;
            }
        }
        (total, tenants)
    }

    /// Whether a call of `tenant` asking for `tokens` may start now, `ticket` being its place in
    /// line (if it has one).
    fn decide(
        &self,
        limits: &ModelLimits,
        settings: &LimitSettings,
        tenant: &str,
        tokens: u64,
        ticket: Option<&str>,
        now_ms: u64,
    ) -> Decision {
        if self.cooldown_until_ms > now_ms {
            return Decision::Wait(WaitReason::Cooldown);
        }
        if let Some(max) = limits.max_concurrent {
            let free = (max as usize).saturating_sub(self.leases.len());
            if self.ahead_of(settings, tenant, ticket) >= free {
                return Decision::Wait(WaitReason::Concurrency);
            }
        }
        let (total, by_tenant) = self.used(now_ms);
        // The tenants using the model: counted lately, holding a slot or waiting.
        let mut active: BTreeMap<&str, (f64, f64)> = by_tenant;
        for name in self.leases.values().map(|l| &l.tenant).chain(self.waiting.values().map(|t| &t.tenant)) {
            active.entry(name.as_str()).or_default();
        }
        active.entry(tenant).or_default();
        let weights: f64 = active.keys().map(|t| settings.weight(t)).sum();
        // What a limit leaves this tenant: all of it, less what the other active tenants use or
        // their shares reserve, whichever is more.
        let allowance = |limit: f64, pick: fn(&(f64, f64)) -> f64| {
            let others: f64 = active
                .iter()
                .filter(|(t, _)| **t != tenant)
                .map(|(t, used)| pick(used).max(limit * settings.weight(t) / weights))
                .sum();
            limit - others
        };
        let mine = active.get(tenant).copied().unwrap_or_default();
        if let Some(rpm) = limits.requests_per_minute {
            let rpm = rpm as f64;
            if total.0 + 1.0 > rpm + 1e-9 || mine.0 + 1.0 > allowance(rpm, |u| u.0) + 1e-9 {
                return Decision::Wait(WaitReason::RequestsPerMinute);
            }
        }
        if let Some(tpm) = limits.tokens_per_minute {
            let tpm = tpm as f64;
            let ask = tokens as f64;
            // A call larger than the whole limit goes alone, into an empty minute, rather than
            // never.
            let alone = total.1 < 1.0 && ask > tpm;
            if !alone && (total.1 + ask > tpm + 1e-9 || mine.1 + ask > allowance(tpm, |u| u.1) + 1e-9) {
                return Decision::Wait(WaitReason::TokensPerMinute);
            }
        }
        Decision::Admit
    }

    /// Waiting calls that go before one of `tenant` holding `ticket` (or arriving now): the line
    /// is ordered by each tenant's slots held per weight, counting its earlier waiting calls as
    /// held, then by arrival.
    fn ahead_of(&self, settings: &LimitSettings, tenant: &str, ticket: Option<&str>) -> usize {
        let mut held: BTreeMap<&str, usize> = BTreeMap::new();
        for lease in self.leases.values() {
            *held.entry(lease.tenant.as_str()).or_default() += 1;
        }
        let mut line: Vec<(&str, u64, &str)> =
            self.waiting.iter().map(|(id, t)| (t.tenant.as_str(), t.since_ms, id.as_str())).collect();
        let newcomer = "~";
        if ticket.is_none() {
            line.push((tenant, u64::MAX, newcomer));
        }
        line.sort_by_key(|(_, since, id)| (*since, *id));
        let mut ranked: Vec<(f64, u64, &str)> = Vec::with_capacity(line.len());
        let mut counted: BTreeMap<&str, usize> = BTreeMap::new();
        for (t, since, id) in line {
            let k = counted.entry(t).or_default();
            *k += 1;
            let rank = (held.get(t).copied().unwrap_or(0) + *k) as f64 / settings.weight(t);
            ranked.push((rank, since, id));
        }
        let me = ticket.unwrap_or(newcomer);
        let Some(&(my_rank, my_since, _)) = ranked.iter().find(|(_, _, id)| *id == me) else { return 0 };
        ranked.iter().filter(|(rank, since, id)| (*rank, *since, *id) < (my_rank, my_since, me)).count()
    }

    fn admit(&mut self, lease_id: &str, lease: Lease, tokens: u64, now_ms: u64) {
        let window = self.windows.entry(now_ms / 60_000).or_default();
        window.requests += 1;
        window.tokens += tokens;
        let mine = window.tenants.entry(lease.tenant.clone()).or_default();
        mine.0 += 1;
        mine.1 += tokens;
        self.leases.insert(lease_id.to_owned(), lease);
    }

    /// Ends a lease and replaces the tokens reserved in `minute` by those used.
    fn release(&mut self, lease_id: &str, tenant: &str, minute: u64, reserved: u64, used: u64) {
        self.leases.remove(lease_id);
        if let Some(window) = self.windows.get_mut(&minute) {
            window.tokens = (window.tokens + used).saturating_sub(reserved);
            if let Some(mine) = window.tenants.get_mut(tenant) {
                mine.1 = (mine.1 + used).saturating_sub(reserved);
            }
        }
    }
}

/// A model's place in the bucket: base64url of the base URL and the model name.
fn state_key(base_url: &str, model: &str) -> String {
    use base64::Engine as _;
    let id = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("{base_url} {model}"));
    format!("model.{id}")
}

/// A model's state as `entry` holds it, with the revision to write over (`None`: no entry yet).
fn decode(key: &str, entry: Option<kv::Entry>) -> (ModelState, Option<u64>) {
    match entry {
        Some(entry) if entry.operation == kv::Operation::Put => {
            let state = serde_json::from_slice(&entry.value).unwrap_or_else(|e| {
                warn!(key, error = %e, "unreadable model limits entry; starting it afresh");
                ModelState::default()
            });
            (state, Some(entry.revision))
        }
        Some(entry) => (ModelState::default(), Some(entry.revision)),
        None => (ModelState::default(), None),
    }
}

fn unavailable(e: impl std::fmt::Display) -> LlmError {
    LlmError::Transport(format!("the fleet's model limits ({BUCKET}): {e}"))
}

impl Governor {
    /// Opens (creating it if needed) the shared bucket and returns a governor, or `None` when
    /// `settings` limit nothing.
    pub async fn start(
        bus: &hermes_core::Bus,
        settings: &LimitSettings,
    ) -> Result<Option<Arc<Governor>>, LlmError> {
        settings.validate()?;
        if !settings.active() {
            return Ok(None);
        }
        let store = bus
            .ensure_bucket(kv::Config {
                bucket: BUCKET.to_owned(),
                description: "Fleet-wide model limits: leases, waiting lines, rate windows, cooldowns".into(),
                history: 1,
                num_replicas: bus.config().replicas,
                ..Default::default()
            })
            .await
            .map_err(unavailable)?;
        let holder = format!("{}-{}", bus.config().name, std::process::id());
        let (watches, queues) = (Arc::default(), Mutex::default());
        Ok(Some(Arc::new(Governor { store, settings: settings.clone(), holder, watches, queues })))
    }

    /// Whether calls to `model` are limited.
    pub fn limits(&self, model: &str) -> Option<&ModelLimits> {
        self.settings.for_model(model)
    }

    /// Tokens to reserve for `request`: its prompt (estimated at four characters a token) and
    /// its `max_tokens`, or [`LimitSettings::default_completion_tokens`].
    pub fn reservation(&self, request: &crate::ChatRequest) -> u64 {
        let prompt: usize =
            request.messages.iter().map(|m| crate::estimate_tokens(&m.content) + 4).sum::<usize>()
                + request
                    .tools
                    .iter()
                    .map(|t| crate::estimate_tokens(&t.parameters.to_string()) + 8)
                    .sum::<usize>();
        prompt as u64 + request.max_tokens.map_or(self.settings.default_completion_tokens, u64::from)
    }

    fn ttl_ms(&self) -> u64 {
        self.settings.lease_ttl_secs.max(1) * 1000
    }

    /// The latest revision of `key`'s entry as this process's one watch of it delivers it; the
    /// watch starts with the first waiting call and stops when none is left.
    fn watch_entry(&self, key: &str) -> watch::Receiver<u64> {
        let mut watches = self.watches.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(sender) = watches.get(key) {
            return sender.subscribe();
        }
        let (sender, receiver) = watch::channel(0);
        watches.insert(key.to_owned(), sender.clone());
        let (store, key) = (self.store.clone(), key.to_owned());
        let weak = Arc::downgrade(&self.watches);
        tokio::spawn(async move {
            loop {
                let mut updates = match store.watch(&key).await {
                    Ok(updates) => Some(updates),
                    Err(e) => {
                        debug!(key, error = %e, "cannot watch a model limits entry; waiting calls poll it");
                        None
                    }
                };
                let polling = updates.is_none();
                loop {
                    let next = async {
                        match updates.as_mut() {
                            Some(u) => u.next().await,
                            None => std::future::pending().await,
                        }
                    };
                    tokio::select! {
                        _ = sender.closed() => {
                            // Under the lock a new waiter subscribes, so none is missed here.
                            let Some(watches) = weak.upgrade() else { return };
                            let mut watches = watches.lock().unwrap_or_else(|p| p.into_inner());
                            if sender.receiver_count() == 0 {
                                watches.remove(&key);
                                return;
                            }
                        }
                        update = next => match update {
                            Some(Ok(entry)) => {
                                sender.send_replace(entry.revision);
                            }
                            // The watch ended or failed: open it again.
                            _ => break,
                        },
                        _ = tokio::time::sleep(WAIT_POLL), if polling => break,
                    }
                }
            }
        });
        receiver
    }

    async fn read(&self, key: &str) -> Result<(ModelState, Option<u64>), LlmError> {
        Ok(decode(key, self.store.entry(key).await.map_err(unavailable)?))
    }

    /// Stores `state` if the entry is still at `revision`; `false` when another writer was first.
    async fn write(&self, key: &str, state: &ModelState, revision: Option<u64>) -> Result<bool, LlmError> {
        let value = Bytes::from(serde_json::to_vec(state).map_err(unavailable)?);
        let written = match revision {
            Some(revision) => self.store.update(key, value, revision).await.map(|_| ()).map_err(|e| {
                matches!(e.kind(), kv::UpdateErrorKind::WrongLastRevision)
                    .then_some(())
                    .ok_or_else(|| unavailable(e))
            }),
            None => self.store.create(key, value).await.map(|_| ()).map_err(|e| {
                matches!(e.kind(), kv::CreateErrorKind::AlreadyExists)
                    .then_some(())
                    .ok_or_else(|| unavailable(e))
            }),
        };
        match written {
            Ok(()) => Ok(true),
            Err(Ok(())) => Ok(false),
            Err(Err(e)) => Err(e),
        }
    }

    /// Applies `change` to the entry and stores it; `change` returns what the caller wants back,
    /// or `None` to change nothing. This process's changes to one entry are combined: one writer
    /// task reads the entry, applies every change queued meanwhile in order, and stores them in
    /// one compare-and-set, again from the top while other processes get in first. Its calls at
    /// once cost the bus one write, not one each and a conflict for all but one.
    async fn change<T: Send + 'static>(
        self: &Arc<Self>,
        key: &str,
        mut change: impl FnMut(&mut ModelState, u64) -> Option<T> + Send + 'static,
    ) -> Result<Option<T>, LlmError> {
        let out: Arc<Mutex<Option<T>>> = Arc::default();
        let slot = out.clone();
        let op: Op = Box::new(move |state, now| {
            let result = change(state, now);
            let changed = result.is_some();
            *slot.lock().unwrap_or_else(|p| p.into_inner()) = result;
            changed
        });
        let (done, stored) = oneshot::channel();
        let lead = {
            let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
            match queues.get_mut(key) {
                Some(queue) => {
                    queue.push(Queued { op, done });
                    false
                }
                None => {
                    queues.insert(key.to_owned(), vec![Queued { op, done }]);
                    true
                }
            }
        };
        if lead {
            // A task, not this call: a caller that stops waiting must not strand the batch.
            tokio::spawn(self.clone().write_queued(key.to_owned()));
        }
        match stored.await {
            Ok(Ok(())) => Ok(out.lock().unwrap_or_else(|p| p.into_inner()).take()),
            Ok(Err(message)) => Err(LlmError::Transport(message)),
            Err(_) => Err(unavailable("its writer stopped")),
        }
    }

    /// The writer of `key`: stores what is queued for it, batch after batch, until nothing is.
    async fn write_queued(self: Arc<Self>, key: String) {
        loop {
            let mut batch = {
                let mut queues = self.queues.lock().unwrap_or_else(|p| p.into_inner());
                let batch = queues.get_mut(&key).map(std::mem::take).unwrap_or_default();
                if batch.is_empty() {
                    queues.remove(&key);
                    return;
                }
                batch
            };
            let outcome = self.apply(&key, &mut batch).await.map_err(|e| match e {
                LlmError::Transport(message) => message,
                other => other.to_string(),
            });
            for queued in batch {
                let _ = queued.done.send(outcome.clone());
            }
        }
    }

    /// Reads the entry, applies `batch` and stores it, again from the top while other writers
    /// get in first.
    async fn apply(&self, key: &str, batch: &mut [Queued]) -> Result<(), LlmError> {
        for _ in 0..MAX_CONFLICTS {
            let (mut state, revision) = self.read(key).await?;
            let now = hermes_core::now_unix_ms();
            let before = state.clone();
            state.prune(now, self.ttl_ms());
            for queued in batch.iter_mut() {
                let mut next = state.clone();
                if (queued.op)(&mut next, now) {
                    state = next;
                }
            }
            if state == before && revision.is_some() {
                return Ok(());
            }
            if self.write(key, &state, revision).await? {
                return Ok(());
            }
        }
        Err(unavailable("too many writers at once; try again"))
    }

    /// Waits for the fleet's limits to admit one call to `model` at `base_url` that may use
    /// `tokens` (prompt plus completion), for the current [`CallScope`]. The permit must be
    /// [`Permit::finish`]ed; dropped, it is released in the background.
    pub async fn admit(
        self: &Arc<Self>,
        base_url: &str,
        model: &str,
        tokens: u64,
    ) -> Result<Permit, LlmError> {
        let limits = self.limits(model).cloned().unwrap_or_default();
        let scope = current_scope();
        let key = state_key(base_url, model);
        let lease_id = uuid::Uuid::new_v4().simple().to_string();
        let started = Instant::now();
        let ticket_id = format!("{:013}-{}", hermes_core::now_unix_ms(), &lease_id[..12]);
        // Set once the ticket is in the entry: then it is removed however the wait ends.
        let mut ticket: Option<TicketGuard> = None;
        let mut reported: Option<WaitReason> = None;
        let mut watch = None;
        let ttl = self.ttl_ms();
        let admitted = loop {
            let outcome = {
                let (this, limits, tenant) = (self.clone(), limits.clone(), scope.tenant.clone());
                let (ticket, lease, name) = (ticket_id.clone(), lease_id.clone(), model.to_owned());
                self.change(&key, move |state, now| {
                    let mine = state.waiting.contains_key(&ticket).then_some(ticket.as_str());
                    let decision = state.decide(&limits, &this.settings, &tenant, tokens, mine, now);
                    slots_in_use(&name, state.leases.len());
                    match decision {
                        Decision::Admit => {
                            state.waiting.remove(&ticket);
                            let held = Lease {
                                tenant: tenant.clone(),
                                holder: this.holder.clone(),
                                since_ms: now,
                                expires_ms: now + ttl,
                            };
                            state.admit(&lease, held, tokens, now);
                            Some(Ok(now / 60_000))
                        }
                        Decision::Wait(reason) => {
                            match state.waiting.get_mut(&ticket) {
                                // Renewed at a third of its lifetime, so a live waiter never goes
                                // stale; a younger ticket needs no write.
                                Some(t) if t.seen_ms + ttl / 3 > now => {}
                                Some(t) => t.seen_ms = now,
                                None => {
                                    let place =
                                        Ticket { tenant: tenant.clone(), since_ms: now, seen_ms: now };
                                    state.waiting.insert(ticket.clone(), place);
                                }
                            }
                            Some(Err(reason))
                        }
                    }
                })
                .await
            };
            let reason = match outcome {
                Ok(Some(Ok(minute))) => break minute,
                Ok(Some(Err(reason))) => reason,
                Ok(None) => WaitReason::Concurrency,
                Err(e) => return Err(e),
            };
            if ticket.is_none() {
                ticket = Some(TicketGuard {
                    governor: self.clone(),
                    key: key.clone(),
                    id: ticket_id.clone(),
                    done: false,
                });
            }
            if reported.is_none() {
                debug!(model, reason = reason.as_str(), "waiting for a model slot");
                let labels = hermes_core::metrics::labels(&[("model", model), ("kind", "waited")]);
                hermes_core::metrics::global().model_throttles.get_or_create(&labels).inc();
                if let Some(observer) = &scope.observer {
                    observer.waiting(model, reason);
                }
            }
            reported = Some(reason);
            if scope.deadline.is_some_and(|d| Instant::now() >= d) {
                return Err(LlmError::Saturated {
                    model: model.to_owned(),
                    reason: reason.as_str(),
                    waited_ms: started.elapsed().as_millis() as u64,
                });
            }
            let watch = watch.get_or_insert_with(|| self.watch_entry(&key));
            let pause = scope
                .deadline
                .map_or(WAIT_POLL, |d| d.saturating_duration_since(Instant::now()).min(WAIT_POLL));
            match tokio::time::timeout(pause, watch.changed()).await {
                Ok(Ok(())) => {
                    watch.borrow_and_update();
                }
                // The process's watch stopped (its governor is gone): poll.
                Ok(Err(_)) => tokio::time::sleep(pause).await,
                Err(_) => {}
            }
        };
        if let Some(mut t) = ticket.take() {
            // Admission removed the ticket from the entry.
            t.done = true;
        }
        let waited = started.elapsed();
        let reason = reported.map_or("none", WaitReason::as_str);
        let labels = hermes_core::metrics::labels(&[("model", model), ("reason", reason)]);
        hermes_core::metrics::global().model_wait.get_or_create(&labels).observe(waited.as_secs_f64());
        if reported.is_some()
            && let Some(observer) = &scope.observer
        {
            observer.resumed(model, waited);
        }
        let renewal = self.clone().renew(key.clone(), lease_id.clone());
        Ok(Permit {
            governor: self.clone(),
            key,
            lease_id,
            tenant: scope.tenant,
            minute: admitted,
            reserved: tokens,
            renewal: Some(tokio::spawn(renewal)),
            finished: false,
        })
    }

    /// Keeps a lease alive while its call runs.
    async fn renew(self: Arc<Self>, key: String, lease_id: String) {
        let period = Duration::from_millis(self.ttl_ms() / 3).max(Duration::from_millis(100));
        loop {
            tokio::time::sleep(period).await;
            let (ttl, id) = (self.ttl_ms(), lease_id.clone());
            let renewed = self
                .change(&key, move |state, now| {
                    let lease = state.leases.get_mut(&id)?;
                    lease.expires_ms = now + ttl;
                    Some(())
                })
                .await;
            match renewed {
                Ok(Some(())) => {}
                Ok(None) => {
                    warn!(lease = %lease_id, "a model call outlived its lease (renewals could not be stored in time)");
                    return;
                }
                Err(e) => warn!(error = %e, "cannot renew a model call's lease; trying again"),
            }
        }
    }

    /// Stops every process's calls to `model` until `retry_after` from now (at most
    /// [`MAX_COOLDOWN`]); a later cooldown already set stays.
    pub async fn cool_down(self: &Arc<Self>, base_url: &str, model: &str, retry_after: Duration) {
        let until = hermes_core::now_unix_ms() + retry_after.min(MAX_COOLDOWN).as_millis() as u64;
        let key = state_key(base_url, model);
        let labels = hermes_core::metrics::labels(&[("model", model), ("kind", "provider")]);
        hermes_core::metrics::global().model_throttles.get_or_create(&labels).inc();
        let set = self
            .change(&key, move |state, _| {
                (state.cooldown_until_ms < until).then(|| state.cooldown_until_ms = until)
            })
            .await;
        match set {
            Ok(_) => warn!(
                model,
                cooldown_ms = retry_after.as_millis() as u64,
                event = "model_cooldown",
                "the provider asked to wait; every process waits"
            ),
            Err(e) => warn!(model, error = %e, "cannot store the provider's cooldown; only this call waits"),
        }
    }
}

/// Sets `hermes_model_slots_in_use` for `model`.
fn slots_in_use(model: &str, leases: usize) {
    let labels = hermes_core::metrics::labels(&[("model", model)]);
    hermes_core::metrics::global().model_slots_in_use.get_or_create(&labels).set(leases as i64);
}

/// A place in a model's waiting line: removed from the entry when the wait ends without a slot
/// (a deadline, an error, the call dropped).
struct TicketGuard {
    governor: Arc<Governor>,
    key: String,
    id: String,
    /// Admission already removed it.
    done: bool,
}

impl Drop for TicketGuard {
    fn drop(&mut self) {
        if !self.done {
            let id = std::mem::take(&mut self.id);
            spawn_change(self.governor.clone(), self.key.clone(), move |state: &mut ModelState| {
                state.waiting.remove(&id).map(|_| ())
            });
        }
    }
}

fn spawn_change(
    governor: Arc<Governor>,
    key: String,
    mut change: impl FnMut(&mut ModelState) -> Option<()> + Send + 'static,
) {
    if let Ok(handle) = tokio::runtime::Handle::try_current() {
        handle.spawn(async move {
            if let Err(e) = governor.change(&key, move |state, _| change(state)).await {
                warn!(error = %e, "cannot update the model limits entry");
            }
        });
    }
}

/// An admitted call's lease.
pub struct Permit {
    governor: Arc<Governor>,
    key: String,
    lease_id: String,
    tenant: String,
    minute: u64,
    reserved: u64,
    renewal: Option<tokio::task::JoinHandle<()>>,
    finished: bool,
}

impl Permit {
    /// Ends the lease; `used` tokens (prompt and completion) replace the reservation.
    pub async fn finish(mut self, used: u64) {
        self.finished = true;
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        let (lease_id, tenant, minute, reserved) =
            (self.lease_id.clone(), self.tenant.clone(), self.minute, self.reserved);
        let released = self
            .governor
            .change(&self.key, move |state, _| {
                state.release(&lease_id, &tenant, minute, reserved, used);
                Some(())
            })
            .await;
        if let Err(e) = released {
            warn!(error = %e, "cannot release a model call's lease; it frees when it expires");
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        if let Some(renewal) = self.renewal.take() {
            renewal.abort();
        }
        if !self.finished {
            let (lease_id, tenant, minute, reserved) =
                (self.lease_id.clone(), self.tenant.clone(), self.minute, self.reserved);
            spawn_change(self.governor.clone(), self.key.clone(), move |state| {
                state.release(&lease_id, &tenant, minute, reserved, reserved);
                Some(())
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_030_000; // 30 s into a minute

    fn limits(concurrent: Option<u32>, rpm: Option<u64>, tpm: Option<u64>) -> ModelLimits {
        ModelLimits { max_concurrent: concurrent, requests_per_minute: rpm, tokens_per_minute: tpm }
    }

    fn lease(tenant: &str) -> Lease {
        Lease { tenant: tenant.into(), holder: "p".into(), since_ms: NOW, expires_ms: NOW + 30_000 }
    }

    fn wait(state: &mut ModelState, id: &str, tenant: &str, since: u64) {
        state.waiting.insert(id.into(), Ticket { tenant: tenant.into(), since_ms: since, seen_ms: NOW });
    }

    #[test]
    fn a_slot_goes_to_the_line_before_a_newcomer_and_to_the_tenant_holding_least_for_its_weight() {
        let settings = LimitSettings::default();
        let two = limits(Some(2), None, None);
        let mut state = ModelState::default();
        state.leases.insert("l1".into(), lease("a"));
        assert_eq!(state.decide(&two, &settings, "a", 10, None, NOW), Decision::Admit);
        state.leases.insert("l2".into(), lease("a"));
        assert_eq!(
            state.decide(&two, &settings, "b", 10, None, NOW),
            Decision::Wait(WaitReason::Concurrency)
        );
        // One slot frees; `a` waited first, but holds one already: `b`, holding none, goes first.
        state.leases.remove("l2");
        wait(&mut state, "t-a", "a", NOW - 500);
        wait(&mut state, "t-b", "b", NOW - 100);
        assert_eq!(state.decide(&two, &settings, "b", 10, Some("t-b"), NOW), Decision::Admit);
        assert_eq!(
            state.decide(&two, &settings, "a", 10, Some("t-a"), NOW),
            Decision::Wait(WaitReason::Concurrency)
        );
        // A newcomer of `b` does not pass the line either.
        assert_eq!(
            state.decide(&two, &settings, "c", 10, None, NOW),
            Decision::Wait(WaitReason::Concurrency)
        );
        // With weight 3, `a` holding one slot still ranks first.
        let weighted = LimitSettings { tenants: [("a".to_owned(), 3)].into(), ..Default::default() };
        assert_eq!(state.decide(&two, &weighted, "a", 10, Some("t-a"), NOW), Decision::Admit);
        assert_eq!(
            state.decide(&two, &weighted, "b", 10, Some("t-b"), NOW),
            Decision::Wait(WaitReason::Concurrency)
        );
    }

    #[test]
    fn expired_leases_and_stale_tickets_free_their_places() {
        let mut state = ModelState::default();
        state.leases.insert("dead".into(), Lease { expires_ms: NOW - 1, ..lease("a") });
        state.leases.insert("live".into(), lease("a"));
        state
            .waiting
            .insert("gone".into(), Ticket { tenant: "a".into(), since_ms: 0, seen_ms: NOW - 31_000 });
        state.windows.insert(NOW / 60_000 - 2, Window::default());
        state.windows.insert(NOW / 60_000 - 1, Window::default());
        state.prune(NOW, 30_000);
        assert_eq!(state.leases.keys().collect::<Vec<_>>(), ["live"]);
        assert!(state.waiting.is_empty());
        assert_eq!(state.windows.len(), 1, "only the minute before is kept");
    }

    #[test]
    fn rates_count_the_last_sixty_seconds_and_reserve_other_tenants_shares() {
        let settings = LimitSettings::default();
        let rpm = limits(None, Some(10), None);
        let mut state = ModelState::default();
        // 8 requests in the minute before, half of which is still within the last 60 s: 4 count.
        let before = state.windows.entry(NOW / 60_000 - 1).or_default();
        before.requests = 8;
        before.tenants.insert("a".into(), (8, 0));
        for _ in 0..5 {
            assert_eq!(state.decide(&rpm, &settings, "a", 0, None, NOW), Decision::Admit);
            state.admit(&uuid::Uuid::new_v4().to_string(), lease("a"), 0, NOW);
            state.leases.clear();
        }
        // 4 + 5 = 9 counted: `a` alone may have the tenth...
        assert_eq!(state.decide(&rpm, &settings, "a", 0, None, NOW), Decision::Admit);
        // ...but with `b` waiting, `b`'s share (half) is reserved: `a` has used more than its own.
        wait(&mut state, "t-b", "b", NOW);
        assert_eq!(
            state.decide(&rpm, &settings, "a", 0, None, NOW),
            Decision::Wait(WaitReason::RequestsPerMinute)
        );
        assert_eq!(state.decide(&rpm, &settings, "b", 0, Some("t-b"), NOW), Decision::Admit);
    }

    #[test]
    fn tokens_are_reserved_then_corrected_and_a_cooldown_stops_everyone() {
        let settings = LimitSettings::default();
        let tpm = limits(None, None, Some(1000));
        let mut state = ModelState::default();
        assert_eq!(state.decide(&tpm, &settings, "a", 600, None, NOW), Decision::Admit);
        state.admit("l1", lease("a"), 600, NOW);
        assert_eq!(
            state.decide(&tpm, &settings, "a", 600, None, NOW),
            Decision::Wait(WaitReason::TokensPerMinute)
        );
        // The call used 100: 500 are given back.
        state.release("l1", "a", NOW / 60_000, 600, 100);
        assert_eq!(state.windows[&(NOW / 60_000)].tokens, 100);
        assert_eq!(state.decide(&tpm, &settings, "a", 600, None, NOW), Decision::Admit);
        // A call larger than the whole limit still goes, alone in an empty minute.
        assert_eq!(ModelState::default().decide(&tpm, &settings, "a", 5000, None, NOW), Decision::Admit);
        state.cooldown_until_ms = NOW + 1;
        assert_eq!(state.decide(&tpm, &settings, "b", 1, None, NOW), Decision::Wait(WaitReason::Cooldown));
    }

    #[test]
    fn limits_that_cannot_work_are_refused_with_their_key() {
        let mut settings = LimitSettings::default();
        assert!(!settings.active());
        settings.models.insert("m".into(), limits(Some(0), None, None));
        let err = settings.validate().unwrap_err().to_string();
        assert!(err.contains("llm.limits.models.\"m\""), "{err}");
        settings.models.insert("m".into(), limits(Some(1), None, None));
        settings.tenants.insert("t".into(), 0);
        assert!(settings.validate().unwrap_err().to_string().contains("tenants.\"t\""));
        settings.tenants.clear();
        assert!(settings.validate().is_ok() && settings.active());
        assert!(settings.for_model("other").is_none());
        settings.models.insert("*".into(), limits(None, Some(5), None));
        assert_eq!(settings.for_model("other").unwrap().requests_per_minute, Some(5));
    }
}
