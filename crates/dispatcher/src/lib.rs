//! The dispatcher: it owns the gRPC API and the goal lifecycle. A submitted plan is validated,
//! stored in KV, and its ready nodes are published as tasks; results are consumed from the one
//! shared results consumer and applied to the goal by compare-and-set, which dispatches the nodes
//! that became ready and completes the goal. Every transition is also an event on
//! `hermes.event.<goal_id>`, which WatchGoal replays.
//!
//! All state is in JetStream, so any dispatcher replica can apply any result.

mod dlq;
pub mod engine;
mod grpc;
mod metrics;
mod plans;
mod routing;
pub mod service;
pub mod store;
pub mod summarize;
mod timers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use dashmap::DashMap;
use hermes_core::bus::{ConsumerSpec, Handled};
use hermes_core::ids::IdShape;
use hermes_core::plan::validate_plan;
use hermes_core::trace::TraceContext;
use hermes_core::{Bus, Delivery, Error, GoalId, Result, now_unix_ms};
use hermes_proto::event::Kind;
use hermes_proto::{
    Event, GoalAccepted, GoalSpec, GoalState, GoalStatus, ParallelGroup, PlanCreated, TaskResult,
};
use std::sync::atomic::{AtomicBool, Ordering};

use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

use crate::engine::{Applied, Effects, Limits};
use crate::store::GoalStore;
use hermes_clients::registry::Catalog;

/// Longest goal text accepted.
pub const MAX_GOAL_TEXT_BYTES: usize = 16 * 1024;

/// Dispatcher settings.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// Where the gRPC API listens.
    pub grpc_listen: SocketAddr,
    pub max_nodes: usize,
    /// Whole-goal timeout when the goal does not set one.
    pub goal_timeout: Duration,
    /// Per-attempt deadline when the node does not set one.
    pub node_timeout: Duration,
    /// How long a catalogue snapshot is reused for plan validation.
    pub catalog_ttl: Duration,
    /// Results applied at once; results of one goal are applied one at a time.
    pub result_concurrency: usize,
    /// How long a node waits for an agent serving its task type before it fails with
    /// `NO_CAPABLE_AGENT`.
    pub no_agent_wait: Duration,
    /// A planner service serves this deployment: goals given as text are accepted and failed
    /// nodes of such goals are replanned.
    pub planner: bool,
    /// Writes the answer of goals given as text from their nodes' outputs.
    pub summarizer: Option<summarize::Summarizer>,
    /// LLM prices for goals' estimated cost and cost budgets (0: cost is not estimated).
    pub prices: engine::Prices,
    /// Largest gRPC request decoded; a larger one is refused with `INVALID_ARGUMENT` naming it.
    pub grpc_max_message_bytes: usize,
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            grpc_listen: ([127, 0, 0, 1], 50051).into(),
            max_nodes: hermes_core::plan::DEFAULT_MAX_NODES,
            goal_timeout: Duration::from_secs(600),
            node_timeout: Duration::from_secs(180),
            catalog_ttl: Duration::from_secs(2),
            result_concurrency: 256,
            no_agent_wait: Duration::from_secs(30),
            planner: false,
            summarizer: None,
            prices: engine::Prices::default(),
            grpc_max_message_bytes: hermes_core::grpc::DEFAULT_MAX_MESSAGE_BYTES,
        }
    }
}

/// The goal lifecycle, shared by the gRPC handlers and the results loop.
pub struct GoalService {
    bus: Bus,
    store: GoalStore,
    catalog: Catalog,
    config: DispatcherConfig,
    /// Results waiting to be applied, per goal. One task at a time drains a goal's inbox and
    /// applies everything in it with one CAS, so a wide fan-out costs one KV write per batch
    /// rather than a storm of conflicting writes. Across replicas, CAS alone keeps updates correct.
    inboxes: DashMap<String, Arc<Inbox>>,
    /// Tasks sent to a pool that no live agent serves, by (goal, node).
    waiting: DashMap<(String, String), routing::WaitingTask>,
    /// Goals waiting for their summary; a background task writes them.
    summaries_tx: tokio::sync::mpsc::UnboundedSender<String>,
    summaries_rx: std::sync::Mutex<Option<tokio::sync::mpsc::UnboundedReceiver<String>>>,
    /// Goals by their next deadline (see [`timers`]).
    timers: timers::Timers,
    /// One lock per goal with a transition in progress here: a transition holds it from its
    /// compare-and-set until its events are stored, so this process stores each goal's events
    /// in `seq` order. (Across replicas, the CAS orders the numbers; a watcher can tell a gap.)
    order: DashMap<String, Arc<tokio::sync::Mutex<()>>>,
}

/// Holds a goal's transition order until dropped (see [`GoalService::order`]).
pub(crate) struct OrderGuard<'a> {
    service: &'a GoalService,
    goal_id: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl Drop for OrderGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        // The last holder removes the lock, so finished goals leave nothing behind.
        self.service.order.remove_if(&self.goal_id, |_, lock| Arc::strong_count(lock) == 1);
    }
}

/// What SubmitGoal returns.
pub struct Submitted {
    pub goal_id: String,
    pub duplicate: bool,
}

impl GoalService {
    pub fn new(bus: Bus, config: DispatcherConfig) -> Self {
        let max_value = bus.client().server_info().max_payload;
        let store = GoalStore::new(bus.goals().clone(), max_value);
        let catalog = Catalog::new(bus.clone(), config.catalog_ttl);
        let (summaries_tx, summaries_rx) = tokio::sync::mpsc::unbounded_channel();
        Self {
            bus,
            store,
            catalog,
            config,
            inboxes: DashMap::new(),
            waiting: DashMap::new(),
            summaries_tx,
            summaries_rx: std::sync::Mutex::new(Some(summaries_rx)),
            timers: Default::default(),
            order: DashMap::new(),
        }
    }

    /// Waits for the goal's earlier transitions in this process to be published; held until the
    /// returned guard drops.
    pub(crate) async fn order(&self, goal_id: &str) -> OrderGuard<'_> {
        let lock = self.order.entry(goal_id.to_owned()).or_default().clone();
        let guard = lock.lock_owned().await;
        OrderGuard { service: self, goal_id: goal_id.to_owned(), guard: Some(guard) }
    }

    fn limits(&self) -> Limits {
        Limits {
            node_timeout_ms: self.config.node_timeout.as_millis() as u64,
            planner: self.config.planner,
            summarizer: self.config.summarizer.is_some(),
            prices: self.config.prices,
        }
    }

    /// Validates and stores a goal, then dispatches its first nodes.
    pub async fn submit(&self, spec: GoalSpec) -> Result<Submitted> {
        let plan = match (&spec.plan, spec.text.trim().is_empty()) {
            (Some(_), false) => {
                return Err(Error::InvalidArgument {
                    field: "spec".into(),
                    reason: "give either `text` or `plan`, not both".into(),
                })
            }
            (Some(plan), true) => Some(plan.clone()),
            (None, false) if !self.config.planner => {
                return Err(Error::FailedPrecondition(
                    "no planner configured: goals given as text need a planner with an LLM (set HERMES_LLM_BASE_URL and HERMES_LLM_MODEL for `hermes up`); submit an explicit plan instead".into(),
                ))
            }
            (None, false) if spec.text.len() > MAX_GOAL_TEXT_BYTES => {
                return Err(Error::InvalidArgument {
                    field: "text".into(),
                    reason: format!("is {} bytes, over the limit of {MAX_GOAL_TEXT_BYTES}", spec.text.len()),
                })
            }
            (None, false) => None,
            (None, true) => {
                return Err(Error::InvalidArgument {
                    field: "spec".into(),
                    reason: "the goal has neither `text` nor `plan`".into(),
                })
            }
        };
        if !(spec.max_cost_usd.is_finite() && spec.max_cost_usd >= 0.0) {
            return Err(Error::InvalidArgument {
                field: "max_cost_usd".into(),
                reason: format!("must be a non-negative number of dollars, not {}", spec.max_cost_usd),
            });
        }
        if spec.max_cost_usd > 0.0 && self.config.prices == engine::Prices::default() {
            return Err(Error::InvalidArgument {
                field: "max_cost_usd".into(),
                reason: "this dispatcher has no LLM prices configured (HERMES_LLM_PRICE_INPUT_PER_MTOK, HERMES_LLM_PRICE_OUTPUT_PER_MTOK), so it cannot enforce a cost budget".into(),
            });
        }
        if !spec.idempotency_key.is_empty() {
            hermes_core::ids::check_id("idempotency_key", &spec.idempotency_key, 256, IdShape::Printable)?;
        }
        if !spec.session_id.is_empty() {
            hermes_core::ids::check_id("session_id", &spec.session_id, 200, IdShape::Dotted)?;
        }
        let goal_id = if spec.idempotency_key.is_empty() {
            GoalId::generate()
        } else {
            GoalId::from_idempotency_key(&spec.idempotency_key)
        };
        // A retried submit must not be validated against a catalogue that changed since.
        if !spec.idempotency_key.is_empty() && self.store.load(goal_id.as_str()).await?.is_some() {
            return Ok(Submitted { goal_id: goal_id.to_string(), duplicate: true });
        }

        let validated = match &plan {
            Some(plan) => {
                let snapshot = self.catalog.snapshot(plan.nodes.iter().map(|n| n.task_type.as_str())).await?;
                Some(validate_plan(plan, &snapshot, self.config.max_nodes)?)
            }
            None => None,
        };

        let now = now_unix_ms();
        let timeout_ms =
            if spec.timeout_ms > 0 { spec.timeout_ms } else { self.config.goal_timeout.as_millis() as u64 };
        // The SubmitGoal span's context when traces are exported; a fresh trace id otherwise.
        let trace = TraceContext::current().unwrap_or_else(TraceContext::new_root);
        let mut state = GoalState {
            goal_id: goal_id.to_string(),
            status: GoalStatus::Running as i32,
            nodes: validated.as_ref().map(|v| engine::initial_nodes(&v.plan)).unwrap_or_default(),
            plan: validated.as_ref().map(|v| v.plan.clone()),
            created_unix_ms: now,
            updated_unix_ms: now,
            deadline_unix_ms: now + timeout_ms,
            traceparent: trace.to_header(),
            spec: Some(GoalSpec { plan: None, ..spec.clone() }),
            ..Default::default()
        };
        let mut effects = Effects::default();
        effects.events.push(Event {
            goal_id: state.goal_id.clone(),
            at_unix_ms: now,
            session_id: spec.session_id.clone(),
            kind: Some(Kind::GoalAccepted(GoalAccepted {
                session_id: spec.session_id.clone(),
                idempotency_key: spec.idempotency_key.clone(),
                text: spec.text.clone(),
                labels: spec.labels.clone(),
                plan_nodes: state.nodes.len() as u32,
            })),
            seq: 0,
        });
        match validated {
            Some(validated) => {
                effects.events.push(Event {
                    goal_id: state.goal_id.clone(),
                    at_unix_ms: now,
                    kind: Some(Kind::PlanCreated(PlanCreated {
                        plan: Some(validated.plan),
                        groups: validated
                            .groups
                            .into_iter()
                            .map(|node_ids| ParallelGroup { node_ids })
                            .collect(),
                    })),
                    seq: 0,
                    session_id: String::new(),
                });
                engine::dispatch_ready(&mut state, self.limits(), now, &mut effects);
            }
            None => engine::start_planning(&mut state, now, &mut effects),
        }
        effects.number(&mut state);
        let _order = self.order(&state.goal_id).await;
        if !self.store.create(&state).await? {
            return Ok(Submitted { goal_id: goal_id.to_string(), duplicate: true });
        }
        info!(goal_id = %goal_id, nodes = state.nodes.len(), event = "goal_accepted", "goal accepted");
        tracing::Span::current().record("goal_id", state.goal_id.as_str());
        self.publish_effects(&state, effects).await?;
        Ok(Submitted { goal_id: goal_id.to_string(), duplicate: false })
    }

    pub async fn get(&self, goal_id: &str) -> Result<GoalState> {
        self.store
            .load(goal_id)
            .await?
            .map(|(state, _)| state)
            .ok_or_else(|| Error::NotFound { what: "goal", id: goal_id.to_owned() })
    }

    pub async fn cancel(&self, goal_id: &str, reason: &str) -> Result<GoalState> {
        let reason = if reason.is_empty() { "cancelled by request" } else { reason };
        // Commit and publish in order: this goal's events are stored in `seq` order.
        let _order = self.order(goal_id).await;
        let updated = self
            .store
            .update(goal_id, |state| {
                let mut effects = Effects::default();
                engine::cancel(state, reason, now_unix_ms(), &mut effects).then_some(effects)
            })
            .await?;
        match updated {
            Some(updated) => {
                info!(goal_id, event = "goal_cancelled", "goal cancelled");
                self.publish_effects(&updated.state, updated.value).await?;
                Ok(updated.state)
            }
            None => self.get(goal_id).await,
        }
    }

    /// Records a human's decision on a tool call waiting for approval, and announces it. A call
    /// already decided (or timed out) keeps its decision, which is returned.
    pub async fn decide_approval(
        &self,
        goal_id: &str,
        call_id: &str,
        approve: bool,
        note: &str,
    ) -> Result<hermes_proto::ApprovalDecision> {
        let not_found = || Error::NotFound { what: "approval", id: format!("{goal_id}/{call_id}") };
        hermes_core::ids::check_id("call_id", call_id, 256, IdShape::Dotted)?;
        let decision = hermes_proto::ApprovalDecision {
            approved: approve,
            note: note.to_owned(),
            decided_unix_ms: now_unix_ms(),
            timed_out: false,
        };
        let decided = self.bus.approvals().decide(goal_id, call_id, decision).await?.ok_or_else(not_found)?;
        if decided.recorded {
            let event = Event {
                goal_id: goal_id.to_owned(),
                at_unix_ms: now_unix_ms(),
                kind: Some(Kind::ApprovalDecided(hermes_proto::ApprovalDecided {
                    call_id: call_id.to_owned(),
                    approved: approve,
                    note: note.to_owned(),
                    timed_out: false,
                })),
                seq: 0,
                session_id: String::new(),
            };
            let msg_id = engine::event_msg_id(&event);
            self.bus.publish_event(&event, &msg_id).await?;
            info!(goal_id, call_id, approved = approve, event = "approval_decided", "approval decided");
        }
        Ok(decided.decision)
    }

    /// The newest goals first.
    pub async fn list(&self, limit: usize) -> Result<Vec<GoalState>> {
        let keys = self.store.keys().await?;
        let mut goals = Vec::with_capacity(keys.len());
        for key in keys {
            if let Some((state, _)) = self.store.load(&key).await? {
                goals.push(state);
            }
        }
        goals.sort_by_key(|g| std::cmp::Reverse(g.created_unix_ms));
        goals.truncate(limit);
        Ok(goals)
    }

    /// Applies a batch of results for one goal in a single compare-and-set. Duplicates and
    /// results for superseded attempts are recognised and ignored, which is what makes
    /// at-least-once delivery of results safe. Returns how many results changed the goal.
    pub async fn apply_results(&self, goal_id: &str, results: &[TaskResult]) -> Result<usize> {
        let limits = self.limits();
        // Commit and publish in order: this goal's events are stored in `seq` order.
        let _order = self.order(goal_id).await;
        let outcome = self
            .store
            .update(goal_id, |state| {
                let mut effects = Effects::default();
                let now = now_unix_ms();
                let changed = results
                    .iter()
                    .filter(|r| engine::apply_result(state, r, limits, now, &mut effects) == Applied::Changed)
                    .count();
                if changed == 0 {
                    return None;
                }
                state.updated_unix_ms = now;
                Some((changed, effects))
            })
            .await;
        match outcome {
            Ok(Some(updated)) => {
                let (changed, effects) = updated.value;
                self.publish_effects(&updated.state, effects).await?;
                Ok(changed)
            }
            Ok(None) => Ok(0),
            // A result for a goal that does not exist cannot be applied; drop it.
            Err(Error::NotFound { .. }) => Ok(0),
            Err(e) => Err(e),
        }
    }

    /// Publishes a committed transition's events, then its tasks. Each publish is sent before any
    /// ack is awaited, which keeps wide fan-outs fast while preserving order on the connection.
    async fn publish_effects(&self, state: &GoalState, mut effects: Effects) -> Result<()> {
        use prost::Message as _;
        let topology = self.bus.topology();
        // Inputs over the inline limit (several large refs resolved together) travel as an
        // artifact; the executor loads them back.
        for task in &mut effects.tasks {
            if task.inputs_json.len() > self.bus.artifacts().inline_limit() {
                let inputs = std::mem::take(&mut task.inputs_json);
                let (stub, reference) = self.bus.artifacts().offload_json(inputs, &task.goal_id).await?;
                task.inputs_json = stub;
                task.memory_refs.extend(reference);
            }
        }
        let decisions = self.route(state, &effects.tasks).await;
        let subjects = self.apply_decisions(&mut effects.events, &effects.tasks, &decisions);
        // Messages continue the span this runs in (SubmitGoal, apply_plan, apply_results); work
        // started by a timer or a restart continues the goal's root span.
        let root = TraceContext::parse(&state.traceparent);
        let in_span = TraceContext::current();
        let trace = in_span.clone().or_else(|| root.clone());
        let mut pending = Vec::with_capacity(effects.events.len() + effects.tasks.len());
        for event in &effects.events {
            pending.push((
                topology.event(&event.goal_id),
                hermes_core::redact::event(event).encode_to_vec(),
                engine::event_msg_id(event),
                trace.clone(),
            ));
        }
        // One span per dispatched node: the agent's task span is its child.
        let mut dispatch_spans = Vec::with_capacity(effects.tasks.len());
        for (task, (subject, decision)) in effects.tasks.iter().zip(subjects.into_iter().zip(&decisions)) {
            let span = tracing::info_span!(
                "dispatch_node",
                otel.name = %format_args!("dispatch {}", task.task_type),
                otel.kind = "producer",
                goal_id = %task.goal_id,
                node_id = %task.node_id,
                task_id = %task.task_id,
                task_type = %task.task_type,
                attempt = task.attempt,
                agent = %decision.agent_id,
            );
            if in_span.is_none() {
                hermes_core::trace::follow(&span, root.as_ref());
            }
            let context = TraceContext::of(&span).or_else(|| trace.clone());
            pending.push((subject, task.encode_to_vec(), task.task_id.clone(), context));
            dispatch_spans.push(span);
        }
        for request in &effects.plan_requests {
            let msg_id = request.request_id.clone();
            pending.push((topology.plan_request(), request.encode_to_vec(), msg_id, trace.clone()));
        }
        metrics::record(state, &effects.events);
        // Sent one after the other, so they are stored in order (a goal's events by `seq`, each
        // `TaskDispatched` before its task); the acks are awaited together. (Publishing the futures
        // concurrently, as a `buffered` stream, stored runs of a wide fan-out's events reversed.)
        let mut acks = Vec::with_capacity(pending.len());
        for (subject, body, msg_id, trace) in pending {
            acks.push(self.bus.send_bytes(subject, body.into(), &msg_id, trace.as_ref()).await?);
        }
        for ack in futures::future::join_all(acks).await {
            ack?;
        }
        drop(dispatch_spans);
        if effects.summarize {
            let _ = self.summaries_tx.send(state.goal_id.clone());
        }
        if effects.stop_agents {
            // Agents running the goal's tasks abandon them at their next step. Best effort:
            // results that still arrive are ignored, since the goal has ended.
            let subject = self.bus.topology().cancel(&state.goal_id);
            let reason = state.error.as_ref().map(|e| e.message.clone()).unwrap_or_default();
            if let Err(e) = self.bus.client().publish(subject, reason.into()).await {
                warn!(goal_id = %state.goal_id, error = %e, "cannot tell agents that the goal ended");
            }
        }
        self.schedule_timer(state);
        Ok(())
    }
}

/// Starts the dispatcher on `cx`, which must be connected: binds the gRPC port (unless a service
/// composed before it did), the results and plan-result consumers, spawns the workers as named
/// tasks and adds the `hermes.v1.Dispatcher` API to the context's gRPC server. Fails fast with a
/// clear error.
pub async fn start(
    config: DispatcherConfig,
    cx: &mut hermes_runtime::Context,
) -> anyhow::Result<Arc<GoalService>> {
    use anyhow::Context as _;
    let bus = cx.bus().cloned().context("connect before starting the dispatcher")?;
    let listen = config.grpc_listen;
    cx.grpc_listen(listen, config.grpc_max_message_bytes, hermes_runtime::GRPC_LIMIT_SETTING).await?;
    let topology = bus.topology().clone();
    let results = bus
        .durable_consumer(ConsumerSpec {
            stream: topology.results_stream(),
            name: topology.results_consumer().to_owned(),
            filter_subject: topology.all_results(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 10,
            max_ack_pending: 20_000,
        })
        .await
        .context("cannot bind the results consumer")?;
    let plan_results = bus
        .durable_consumer(ConsumerSpec {
            stream: topology.plans_stream(),
            name: topology.plan_results_consumer().to_owned(),
            filter_subject: topology.plan_result(),
            ack_wait: Duration::from_secs(30),
            max_deliver: 10,
            max_ack_pending: 10_000,
        })
        .await
        .context("cannot bind the plan results consumer")?;
    let service = Arc::new(GoalService::new(bus, config));
    // Drained in reverse: the API stops first, the results consumer (which hands back what it
    // pulled but did not start) last.
    let s = service.clone();
    cx.spawn_loop("results", move |stop| results_loop(s, results, stop));
    let s = service.clone();
    cx.spawn_loop("agents", move |stop| routing::watch_agents(s, stop));
    let s = service.clone();
    cx.spawn_loop("summaries", move |stop| summaries_loop(s, stop));
    let s = service.clone();
    cx.spawn_loop("plans", move |stop| plans::plan_results_loop(s, plan_results, stop));
    let s = service.clone();
    cx.spawn_loop("dlq", move |stop| dlq::poison_loop(s, stop));
    let s = service.clone();
    cx.spawn_loop("timers", move |stop| timers::timers_loop(s, stop));
    let bus = service.bus.clone();
    cx.spawn_loop("queue-depth", move |stop| metrics::queue_depth_loop(bus, stop));
    let api = grpc::server(service.clone(), cx.shutdown(), cx.grpc_max_message_bytes());
    cx.grpc("hermes.v1.Dispatcher")?.add_service(api);
    info!(grpc = ?cx.grpc_addr(), "dispatcher started");
    Ok(service)
}

/// Results of one goal waiting to be applied.
#[derive(Default)]
struct Inbox {
    pending: std::sync::Mutex<Vec<Arc<Delivery<TaskResult>>>>,
    draining: AtomicBool,
}

/// Applies everything in a goal's inbox, batch by batch, until it stays empty. Only the task that
/// set `draining` runs this.
async fn drain_inbox(service: &GoalService, goal_id: &str, inbox: &Inbox) {
    loop {
        let batch = std::mem::take(&mut *inbox.pending.lock().unwrap_or_else(|p| p.into_inner()));
        if batch.is_empty() {
            inbox.draining.store(false, Ordering::Release);
            // A result may have arrived between the take and the store; take it over unless
            // another task already did.
            let empty = inbox.pending.lock().unwrap_or_else(|p| p.into_inner()).is_empty();
            if empty || inbox.draining.swap(true, Ordering::AcqRel) {
                break;
            }
            continue;
        }
        let results: Vec<TaskResult> = batch.iter().map(|d| d.message.clone()).collect();
        // The batch is applied under the span of its first result's task; the others are
        // linked, so each agent task's trace shows where its result went.
        let span = tracing::info_span!("apply_results", goal_id, results = batch.len());
        hermes_core::trace::follow(&span, batch[0].trace.as_ref());
        for other in &batch[1..] {
            hermes_core::trace::link(&span, other.trace.as_ref());
        }
        match service.apply_results(goal_id, &results).instrument(span).await {
            // Redelivery of an applied result is harmless (it is recognised as stale), so the
            // ack need not wait for the server's confirmation.
            Ok(_) => {
                for delivery in &batch {
                    delivery.settle(&service.bus, "result", Handled::DoneUnconfirmed).await;
                }
            }
            Err(e) => {
                warn!(goal_id, error = %e, results = batch.len(), "cannot apply results; will retry");
                for delivery in &batch {
                    delivery
                        .settle(&service.bus, "result", Handled::Retry { after: Duration::from_millis(500) })
                        .await;
                }
            }
        }
    }
    service.inboxes.remove_if(goal_id, |_, i| {
        !i.draining.load(Ordering::Acquire) && i.pending.lock().map(|p| p.is_empty()).unwrap_or(false)
    });
}

/// Writes the answers of goals whose nodes are all done, a few at a time.
async fn summaries_loop(service: Arc<GoalService>, shutdown: CancellationToken) {
    let Some(mut goals) = service.summaries_rx.lock().ok().and_then(|mut rx| rx.take()) else { return };
    let mut running = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(goal_id) = goals.recv() => {
                let service = service.clone();
                running.spawn(async move {
                    if let Err(e) = service.summarize(&goal_id).await {
                        warn!(goal_id, error = %e, "cannot write the goal's answer");
                    }
                });
            }
        }
        while running.try_join_next().is_some() {}
    }
    while running.join_next().await.is_some() {}
}

async fn results_loop(
    service: Arc<GoalService>,
    consumer: async_nats::jetstream::consumer::PullConsumer,
    shutdown: CancellationToken,
) {
    let concurrency = service.config.result_concurrency;
    let mut messages = match consumer.stream().max_messages_per_batch(concurrency).messages().await {
        Ok(m) => m,
        Err(e) => {
            warn!(error = %e, "cannot pull results");
            return;
        }
    };
    // Shutting down, the loop hands back what was pulled but not started, for another replica,
    // then finishes what is being applied.
    let bus = service.bus.clone();
    hermes_core::bus::consume_concurrently(
        &bus,
        "result",
        &mut messages,
        concurrency,
        &shutdown,
        |delivery: Arc<Delivery<TaskResult>>| {
            let service = service.clone();
            async move {
                let goal_id = delivery.message.goal_id.clone();
                let inbox = service.inboxes.entry(goal_id.clone()).or_default().clone();
                inbox.pending.lock().unwrap_or_else(|p| p.into_inner()).push(delivery);
                if !inbox.draining.swap(true, Ordering::AcqRel) {
                    drain_inbox(&service, &goal_id, &inbox).await;
                }
                // The inbox's drainer settles it, with the batch it was applied in.
                Handled::Kept
            }
        },
    )
    .await;
}
