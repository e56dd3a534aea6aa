//! The goal service: the goal lifecycle, and every change to a goal goes through here. The
//! caller gate (`gate.rs`) calls it to submit, get, list, watch and cancel goals and to decide
//! approvals, once it has checked who may; the workers call it to apply results, plans,
//! deadlines, takeovers and summaries. It knows no caller: roles, tenants' views and the audit
//! trail are the gate's. Each change is one compare-and-set of the
//! goal's state in KV, computed by a pure transition of [`engine`], followed by its effects,
//! published by the [`EffectsPublisher`].
//!
//! The service holds no worker's state: it reaches the workers only through the channel handles
//! of [`Followups`], and the workers call it, never the other way round.

use std::collections::HashSet;
use std::sync::Arc;

use dashmap::DashMap;
use futures::Stream;
use hermes_clients::registry::Catalog;
use hermes_core::ids::IdShape;
use hermes_core::plan::validate_plan;
use hermes_core::trace::TraceContext;
use hermes_core::{Bus, Error, GoalId, Result, now_unix_ms};
use hermes_proto::event::Kind;
use hermes_proto::plan_result::Outcome;
use hermes_proto::{
    AgentReport, Approval, Callback, Event, GoalAccepted, GoalSpec, GoalState, GoalStatus, ParallelGroup,
    PlanCreated, PlanResult, TaskResult, TokenUsage,
};
use tracing::{info, warn};

use crate::config::{DispatcherConfig, MAX_GOAL_TEXT_BYTES};
use crate::effects::{EffectsPublisher, Followups};
use crate::engine::{self, Applied, Effects, Limits};
use crate::quota::Quotas;
use crate::store::GoalStore;
use hermes_core::access::tenant_of;

fn total_tokens(state: &GoalState) -> u64 {
    state.tokens.as_ref().map(|t| t.input_tokens + t.output_tokens).unwrap_or(0)
}

/// What SubmitGoal returns.
pub struct Submitted {
    pub goal_id: String,
    pub duplicate: bool,
    /// The signing secret of each of the spec's callbacks, on a new goal only.
    pub callback_secrets: Vec<String>,
}

/// The goal lifecycle, shared by the gRPC adapter and the workers.
pub struct GoalService {
    bus: Bus,
    store: GoalStore,
    catalog: Catalog,
    config: DispatcherConfig,
    effects: EffectsPublisher,
    order: TransitionOrder,
    watchers: std::sync::Arc<crate::watchers::WatchLimits>,
    hub: crate::fanout::EventHub,
    quotas: Quotas,
    records: crate::records::Records,
    webhooks: crate::webhooks::Webhooks,
}

/// What a [`GoalService`] is made of beside its bus and config, opened by the dispatcher's start.
pub(crate) struct GoalParts {
    pub(crate) followups: Followups,
    pub(crate) quotas: Quotas,
    pub(crate) records: crate::records::Records,
    pub(crate) webhooks: crate::webhooks::Webhooks,
    pub(crate) index: crate::goal_index::GoalIndex,
    /// Signs tasks' memory tokens (`hermes_core::task_token`).
    pub(crate) task_key: hermes_core::task_token::TaskKey,
}

impl GoalService {
    /// The service and the receiving ends of its follow-ups, for the workers.
    pub(crate) fn new(bus: Bus, config: DispatcherConfig, parts: GoalParts) -> Self {
        let GoalParts { followups, quotas, records, webhooks, index, task_key } = parts;
        let max_value = bus.client().server_info().max_payload;
        let store = GoalStore::new(bus.goals().clone(), bus.jetstream().clone(), max_value, index);
        let catalog = Catalog::new(bus.clone(), config.catalog_ttl);
        let limits = limits(&config);
        let agents = hermes_registry::Registry::mirror(hermes_registry::RegistryConfig::default());
        let effects = EffectsPublisher::new(
            bus.clone(),
            agents,
            limits,
            config.no_agent_wait,
            followups,
            webhooks.clone(),
            task_key,
        );
        let watchers = crate::watchers::WatchLimits::new(config.max_watches_per_client, config.max_watches);
        let hub = crate::fanout::EventHub::new(bus.clone());
        Self {
            bus,
            store,
            catalog,
            config,
            effects,
            order: TransitionOrder::default(),
            watchers,
            hub,
            quotas,
            records,
            webhooks,
        }
    }

    /// The goal index this replica lists goals from.
    pub(crate) fn index(&self) -> &crate::goal_index::GoalIndex {
        self.store.index()
    }

    /// The webhook endpoints and deliveries.
    pub(crate) fn webhooks(&self) -> &crate::webhooks::Webhooks {
        &self.webhooks
    }

    pub(crate) fn bus(&self) -> &Bus {
        &self.bus
    }

    /// The live agents as this dispatcher sees them, which route its tasks.
    pub(crate) fn agents(&self) -> &hermes_registry::Registry {
        self.effects.agents()
    }

    /// The tenants' quotas.
    pub(crate) fn quotas(&self) -> &Quotas {
        &self.quotas
    }

    /// The task types the agents online now serve, fresh from the registry.
    pub(crate) async fn catalogue(&self) -> Result<hermes_clients::registry::CatalogSnapshot> {
        self.catalog.current().await
    }

    /// Whether goals given as text are accepted (a planner serves this deployment).
    pub(crate) fn plans_text_goals(&self) -> bool {
        self.config.planner
    }

    /// `UNAVAILABLE` at once while the NATS connection is down, so that the API adapters answer
    /// rather than let a request wait out JetStream timeouts; the client retries.
    pub(crate) fn nats_up(&self) -> Result<()> {
        match self.bus.client().connection_state() {
            async_nats::connection::State::Connected => Ok(()),
            _ => Err(Error::Unavailable("the NATS connection (the dispatcher is reconnecting)".into())),
        }
    }

    pub(crate) fn store(&self) -> &GoalStore {
        &self.store
    }

    pub(crate) fn config(&self) -> &DispatcherConfig {
        &self.config
    }

    pub(crate) fn followups(&self) -> &Followups {
        self.effects.followups()
    }

    fn limits(&self) -> Limits {
        limits(&self.config)
    }

    /// When [`engine::expire`] next has something to do for this goal.
    pub(crate) fn next_deadline(&self, state: &GoalState) -> Option<u64> {
        engine::next_deadline(state, self.limits())
    }

    /// Commits a transition of `goal_id` by compare-and-set, then publishes its effects. `apply`
    /// gets the current state, the effects to fill and the time; it may run again after a
    /// conflict, and returns `None` when nothing changes. A goal that does not exist changes
    /// nothing. Transitions of one goal commit and publish one at a time in this process, so its
    /// events are stored in `seq` order.
    pub(crate) async fn transition<T>(
        &self,
        goal_id: &str,
        mut apply: impl FnMut(&mut GoalState, &mut Effects, u64) -> Option<T>,
    ) -> Result<Option<(GoalState, T)>> {
        let _order = self.order.lock(goal_id).await;
        // What the committed transition changed for the tenant's quotas (the closure may run
        // again after a conflict; the last run is the one committed).
        let mut before = (false, 0u64, 0f64);
        let updated = self
            .store
            .update(goal_id, |state| {
                before = (engine::is_terminal(state.status), total_tokens(state), state.cost_usd);
                let mut effects = Effects::default();
                let now = now_unix_ms();
                let value = apply(state, &mut effects, now)?;
                state.updated_unix_ms = now;
                Some((value, effects))
            })
            .await;
        match updated {
            Ok(Some(updated)) => {
                let (value, effects) = updated.value;
                self.effects.publish(&updated.state, effects).await?;
                let state = &updated.state;
                let tenant = tenant_of(state);
                let (spent, cost) =
                    (total_tokens(state).saturating_sub(before.1), (state.cost_usd - before.2).max(0.0));
                self.quotas.charge(tenant, spent, cost).await;
                if !before.0 && engine::is_terminal(state.status) {
                    self.quotas.release(tenant, goal_id).await;
                }
                Ok(Some((updated.state, value)))
            }
            Ok(None) | Err(Error::NotFound { .. }) => Ok(None),
            Err(e) => {
                // The write may have landed with only its answer lost (a timeout while a cluster
                // elects a leader): its effects would then never be sent, since the retried
                // cause finds its work done. The goal's in-flight tasks are published again.
                self.effects.followups().unsent(goal_id);
                Err(e)
            }
        }
    }

    /// Validates and stores a goal, then dispatches its first nodes. The goal's trace is the
    /// current span's when spans are exported, else `caller_trace` (the context its caller sent),
    /// else a new one.
    pub async fn submit(&self, spec: GoalSpec, caller_trace: Option<&TraceContext>) -> Result<Submitted> {
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
        if spec.callbacks.len() > crate::webhooks::MAX_CALLBACKS {
            return Err(Error::InvalidArgument {
                field: "callbacks".into(),
                reason: format!(
                    "names {}, over the limit of {}",
                    spec.callbacks.len(),
                    crate::webhooks::MAX_CALLBACKS
                ),
            });
        }
        for callback in &spec.callbacks {
            crate::webhooks::check_endpoint(&callback.url, &callback.events)?;
            crate::webhooks::check_format(&callback.format)?;
            if !callback.secret.is_empty() {
                crate::webhooks::secret_key(&callback.secret)?;
            }
        }
        let goal_id = if spec.idempotency_key.is_empty() {
            GoalId::generate()
        } else {
            GoalId::from_idempotency_key(&spec.idempotency_key)
        };
        // A retried submit must not be validated against a catalogue that changed since.
        if !spec.idempotency_key.is_empty() && self.store.load(goal_id.as_str()).await?.is_some() {
            return Ok(Submitted {
                goal_id: goal_id.to_string(),
                duplicate: true,
                callback_secrets: Vec::new(),
            });
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
        // The SubmitGoal span's context when traces are exported, else the caller's; a fresh
        // trace id otherwise.
        let trace = hermes_core::trace::propagate(caller_trace).unwrap_or_else(TraceContext::new_root);
        let mut state = GoalState {
            goal_id: goal_id.to_string(),
            status: GoalStatus::Running as i32,
            nodes: validated.as_ref().map(|v| engine::initial_nodes(&v.plan)).unwrap_or_default(),
            plan: validated.as_ref().map(|v| v.plan.clone()),
            created_unix_ms: now,
            updated_unix_ms: now,
            deadline_unix_ms: now + timeout_ms,
            traceparent: trace.to_header(),
            // The callbacks' secrets are kept with their endpoints only.
            spec: Some(GoalSpec {
                plan: None,
                callbacks: spec
                    .callbacks
                    .iter()
                    .map(|c| Callback {
                        secret: String::new(),
                        token: String::new(),
                        authorization: String::new(),
                        ..c.clone()
                    })
                    .collect(),
                ..spec.clone()
            }),
            result_key: rand::random::<[u8; 32]>().to_vec(),
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
            ..Default::default()
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
                        repairs: Vec::new(),
                    })),
                    ..Default::default()
                });
                engine::dispatch_ready(&mut state, self.limits(), now, &mut effects);
            }
            None => engine::start_planning(&mut state, now, &mut effects),
        }
        effects.number(&mut state);
        let _order = self.order.lock(&state.goal_id).await;
        // A place under the tenant's running-goals quota, given back if the goal is not stored.
        let tenant = tenant_of(&state).map(str::to_owned);
        self.quotas.admit(tenant.as_deref(), &state.goal_id).await?;
        let callback_secrets = match self.store_callbacks(&state, &spec.callbacks).await {
            Ok(secrets) => secrets,
            Err(e) => {
                self.quotas.release(tenant.as_deref(), &state.goal_id).await;
                return Err(e);
            }
        };
        let created = self.store.create(&state).await;
        // Stored by a racing submit of the same key (`Ok(false)`), the goal keeps its place.
        if created.is_err() {
            self.quotas.release(tenant.as_deref(), &state.goal_id).await;
            // As in `transition`: the goal may be stored with only the answer lost.
            self.effects.followups().unsent(&state.goal_id);
        }
        if !created? {
            return Ok(Submitted {
                goal_id: goal_id.to_string(),
                duplicate: true,
                callback_secrets: Vec::new(),
            });
        }
        info!(goal_id = %goal_id, nodes = state.nodes.len(), event = "goal_accepted", "goal accepted");
        tracing::Span::current().record("goal_id", state.goal_id.as_str());
        self.effects.publish(&state, effects).await?;
        Ok(Submitted { goal_id: goal_id.to_string(), duplicate: false, callback_secrets })
    }

    /// Stores a new goal's callbacks as its endpoints, before the goal, so its first transition
    /// finds them; returns each one's secret. A callback stored by an earlier try of the same
    /// submit (whose goal was not stored) keeps its secret, which is returned.
    async fn store_callbacks(&self, state: &GoalState, callbacks: &[Callback]) -> Result<Vec<String>> {
        let mut secrets = Vec::with_capacity(callbacks.len());
        for (n, callback) in callbacks.iter().enumerate() {
            let secret = crate::webhooks::secret_or_new(&callback.secret)?;
            let endpoint = hermes_proto::WebhookEndpoint {
                id: crate::webhooks::callback_id(&state.goal_id, n),
                tenant: tenant_of(state).unwrap_or_default().to_owned(),
                url: callback.url.clone(),
                events: callback.events.clone(),
                secrets: vec![secret.clone()],
                goal_id: state.goal_id.clone(),
                created_unix_ms: state.created_unix_ms,
                format: callback.format.clone(),
                token: callback.token.clone(),
                authorization: callback.authorization.clone(),
                ..Default::default()
            };
            if self.webhooks.create(&endpoint).await? {
                secrets.push(secret);
            } else {
                let stored = self.webhooks.endpoint(&endpoint.id).await?.unwrap_or(endpoint);
                secrets.push(stored.secrets.first().cloned().unwrap_or_default());
            }
        }
        Ok(secrets)
    }

    pub async fn get(&self, goal_id: &str) -> Result<GoalState> {
        self.store
            .load(goal_id)
            .await?
            .map(|(state, _)| state)
            .ok_or_else(|| Error::NotFound { what: "goal", id: goal_id.to_owned() })
    }

    /// The goals `query` asks for (and, with `text`, whose text contains it, lower-cased),
    /// newest first, at most `limit`, and whether more follow. Found through the goal index
    /// (`goal_index.rs`), so a page reads the goals it lists: the same with a hundred goals
    /// stored or a million. Only a text filter walks further, a chunk at a time, until the page
    /// is full. A goal whose stored status no longer matches (the index of another replica's
    /// change not yet read) is left out.
    pub async fn page(
        &self,
        query: &crate::goal_index::PageQuery<'_>,
        text: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<GoalState>, bool)> {
        use futures::{StreamExt as _, TryStreamExt as _};
        let mut out: Vec<GoalState> = Vec::new();
        let mut walk = query.clone();
        loop {
            let chunk = match text {
                None => (limit + 1).saturating_sub(out.len()).max(1),
                Some(_) => 256,
            };
            let places = self.index().page(&walk, chunk);
            let Some((created, id)) = places.last() else { break };
            walk.after = Some((*created, id.to_string()));
            let ids: Vec<Arc<str>> = places.iter().map(|(_, id)| id.clone()).collect();
            let loaded: Vec<Option<(GoalState, u64)>> = futures::stream::iter(ids)
                .map(|id| async move { self.store.load(&id).await })
                .buffered(64)
                .try_collect()
                .await?;
            out.extend(loaded.into_iter().flatten().map(|(state, _)| state).filter(|g| {
                query.status.is_none_or(|s| g.status == s)
                    && text.is_none_or(|t| g.spec.as_ref().is_some_and(|s| s.text.to_lowercase().contains(t)))
            }));
            if out.len() > limit || places.len() < chunk {
                break;
            }
        }
        let more = out.len() > limit;
        out.truncate(limit);
        Ok((out, more))
    }

    /// The goal's events from the start, or those after `after_seq`, ending with its terminal
    /// event. Everything up to and including `after_seq` is skipped (agent events, which have no
    /// `seq`, among them), so a watcher that resumes gets exactly what came after. The caller
    /// (`Gate::watch`) has loaded the goal, so one that never existed is `NotFound` at
    /// once rather than a wait for ever. `client` holds one of its places under
    /// `max_watches_per_client` while the stream lives.
    pub(crate) async fn watch(
        &self,
        goal_id: &str,
        after_seq: u64,
        client: &str,
    ) -> Result<impl Stream<Item = Result<Event>> + Send + use<>> {
        let permit = self.watchers.acquire(client)?;
        let lease = self.hub.subscribe(goal_id).await?;
        info!(goal_id, "watch started");
        struct Cursor {
            lease: crate::fanout::FeedLease,
            index: usize,
            skip_to: u64,
            done: bool,
            _permit: crate::watchers::WatchPermit,
        }
        let cursor = Cursor { lease, index: 0, skip_to: after_seq, done: false, _permit: permit };
        let events = futures::stream::unfold(cursor, |mut cursor| async move {
            while !cursor.done {
                let event = match cursor.lease.feed.next(cursor.index).await {
                    Ok(event) => event,
                    Err(e) => {
                        cursor.done = true;
                        return Some((Err(e), cursor));
                    }
                };
                cursor.index += 1;
                cursor.done = engine::is_terminal_event(&event);
                // Everything up to and including `skip_to` was seen; agent events have no seq.
                if cursor.skip_to > 0 {
                    if event.seq == 0 || event.seq < cursor.skip_to {
                        continue;
                    }
                    if event.seq == cursor.skip_to {
                        cursor.skip_to = 0;
                        continue;
                    }
                }
                return Some((Ok(Event::clone(&event)), cursor));
            }
            None
        });
        Ok(events)
    }

    pub async fn cancel(&self, goal_id: &str, reason: &str) -> Result<GoalState> {
        let reason = if reason.is_empty() { "cancelled by request" } else { reason };
        let cancelled = self
            .transition(goal_id, |state, effects, now| {
                engine::cancel(state, reason, now, effects).then_some(())
            })
            .await?;
        match cancelled {
            Some((state, ())) => {
                info!(goal_id, event = "goal_cancelled", "goal cancelled");
                Ok(state)
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
        Ok(self.record_decision(goal_id, call_id, decision).await?.ok_or_else(not_found)?.decision)
    }

    /// Records `decision` on the approval of `call_id` (the first decision wins) and, when this
    /// call recorded it, announces it with `ApprovalDecided`. `None`: no such approval of the goal.
    async fn record_decision(
        &self,
        goal_id: &str,
        call_id: &str,
        decision: hermes_proto::ApprovalDecision,
    ) -> Result<Option<hermes_core::approvals::Decided>> {
        let Some(decided) = self.bus.approvals().decide(goal_id, call_id, decision).await? else {
            return Ok(None);
        };
        if !decided.recorded {
            return Ok(Some(decided));
        }
        let decision = &decided.decision;
        self.publish_unnumbered(
            goal_id,
            Kind::ApprovalDecided(hermes_proto::ApprovalDecided {
                call_id: call_id.to_owned(),
                approved: decision.approved,
                note: decision.note.clone(),
                timed_out: decision.timed_out,
            }),
        )
        .await?;
        info!(
            goal_id,
            call_id,
            approved = decision.approved,
            timed_out = decision.timed_out,
            event = "approval_decided",
            "approval decided"
        );
        Ok(Some(decided))
    }

    /// Publishes an event that is not a transition's (an approval, an agent's tool call): it has
    /// no `seq`, and its message id comes from what it says.
    async fn publish_unnumbered(&self, goal_id: &str, kind: Kind) -> Result<()> {
        let event = Event {
            goal_id: goal_id.to_owned(),
            at_unix_ms: now_unix_ms(),
            kind: Some(kind),
            ..Default::default()
        };
        self.bus.publish_event(&event, &engine::event_msg_id(&event)).await?;
        if crate::webhooks::event_type(&event).is_some() {
            self.webhooks.publish_event(&self.get(goal_id).await?, event).await?;
        }
        Ok(())
    }

    /// Acts for an agent on the attempt it runs (see `AgentReport`): publishes its agent loop's
    /// `ToolCalled` events, stores and announces the approvals it asks for, and records a
    /// timed-out approval. The report must name the node's current attempt with that attempt's
    /// `result_token`, so only a holder of the task's delivery is heard; anything else is
    /// `DENIED`. Returns the approval as stored, for approval reports.
    pub async fn agent_report(&self, report: &AgentReport) -> Result<Option<Approval>> {
        use hermes_proto::agent_report::Kind as Report;
        let goal_id = report.goal_id.as_str();
        let state = self.get(goal_id).await?;
        let index = match engine::authentic_attempt(
            &state,
            &report.node_id,
            &report.task_id,
            &report.result_token,
        ) {
            Ok(index) => index,
            Err(why) => {
                warn!(goal_id, task_id = %report.task_id, claimed_agent = %report.agent_id, event = "report_refused", ?why,
                    "refused an agent report that does not carry its attempt's token");
                return Err(Error::Denied {
                    reason: format!("task {} is not a running attempt of this agent", report.task_id),
                });
            }
        };
        match &report.kind {
            Some(Report::Event(event)) => {
                // The goal, node and attempt are the verified ones, whatever the report said.
                let (node_id, attempt) = (report.node_id.clone(), state.nodes[index].attempt);
                let kind = match &event.kind {
                    Some(Kind::ToolCalled(called)) => {
                        Kind::ToolCalled(hermes_proto::ToolCalled { node_id, attempt, ..called.clone() })
                    }
                    Some(Kind::ModelWaiting(waiting)) => {
                        Kind::ModelWaiting(hermes_proto::ModelWaiting { node_id, attempt, ..waiting.clone() })
                    }
                    _ => {
                        return Err(Error::Denied {
                            reason: "agents may report only ToolCalled and ModelWaiting events".into(),
                        });
                    }
                };
                self.publish_unnumbered(goal_id, kind).await?;
                Ok(None)
            }
            Some(Report::RequestApproval(asked)) => {
                hermes_core::ids::check_id("call_id", &asked.call_id, 256, IdShape::Dotted)?;
                let approval = Approval {
                    goal_id: goal_id.to_owned(),
                    node_id: report.node_id.clone(),
                    decision: None,
                    ..asked.clone()
                };
                let (stored, _, created) = self.bus.approvals().create(&approval).await?;
                if stored.goal_id != goal_id {
                    return Err(Error::Denied {
                        reason: format!("approval {} is another goal's", asked.call_id),
                    });
                }
                if created {
                    let required = hermes_proto::ApprovalRequired {
                        call_id: stored.call_id.clone(),
                        node_id: stored.node_id.clone(),
                        tool: stored.tool.clone(),
                        arguments_json: stored.arguments_json.clone(),
                        reason: stored.reason.clone(),
                        expires_unix_ms: stored.expires_unix_ms,
                    };
                    self.publish_unnumbered(goal_id, Kind::ApprovalRequired(required)).await?;
                    info!(goal_id, node_id = %stored.node_id, call_id = %stored.call_id, tool = %stored.tool,
                        event = "approval_required", "waiting for approval");
                }
                Ok(Some(stored))
            }
            // Records of the agent loop (docs/evaluation.md), stamped with the verified goal,
            // node and attempt, whatever the report said.
            Some(Report::ModelExchange(exchange)) => {
                let exchange = hermes_proto::ModelExchange {
                    goal_id: goal_id.to_owned(),
                    node_id: report.node_id.clone(),
                    ..exchange.clone()
                };
                let id = format!("{}:{}", report.task_id, exchange.request_id);
                self.records.record(goal_id, &id, &[exchange]).await?;
                Ok(None)
            }
            Some(Report::ToolExchange(call)) => {
                let call = hermes_proto::ToolExchange {
                    goal_id: goal_id.to_owned(),
                    node_id: report.node_id.clone(),
                    attempt: state.nodes[index].attempt,
                    ..call.clone()
                };
                self.records.record_tool(&report.task_id, &call).await?;
                Ok(None)
            }
            Some(Report::ApprovalTimedOut(call_id)) => {
                let not_found = || Error::NotFound { what: "approval", id: format!("{goal_id}/{call_id}") };
                let Some((approval, _)) = self.bus.approvals().load(call_id).await? else {
                    return Err(not_found());
                };
                if approval.goal_id != goal_id {
                    return Err(not_found());
                }
                if approval.decision.is_none() && now_unix_ms() < approval.expires_unix_ms {
                    return Err(Error::FailedPrecondition(format!("approval {call_id} has not expired yet")));
                }
                let timeout = hermes_proto::ApprovalDecision {
                    approved: false,
                    note: "no decision in time".into(),
                    decided_unix_ms: now_unix_ms(),
                    timed_out: true,
                };
                let decided = self.record_decision(goal_id, call_id, timeout).await?.ok_or_else(not_found)?;
                Ok(Some(Approval { decision: Some(decided.decision), ..decided.approval }))
            }
            None => {
                Err(Error::InvalidArgument { field: "kind".into(), reason: "the report is empty".into() })
            }
        }
    }

    /// Applies a batch of results for one goal in a single compare-and-set. Duplicates and
    /// results for superseded attempts are recognised and ignored, which is what makes
    /// at-least-once delivery of results safe. Returns how many results changed the goal.
    pub async fn apply_results(&self, goal_id: &str, results: &[TaskResult]) -> Result<usize> {
        let limits = self.limits();
        let applied = self
            .transition(goal_id, |state, effects, now| {
                let changed = results
                    .iter()
                    .zip(engine::apply_results(state, results, limits, now, effects))
                    .filter(|(r, applied)| match applied {
                        Applied::Changed => true,
                        Applied::Forged => {
                            warn!(goal_id, task_id = %r.task_id, claimed_agent = %r.agent_id, event = "forged_result",
                                "ignored a result without its attempt's token: it did not come from a holder of the task's delivery");
                            false
                        }
                        Applied::WrongAttempt { issued, claimed } => {
                            warn!(goal_id, task_id = %r.task_id, agent = %r.agent_id, issued = *issued, claimed = *claimed, event = "mismatched_attempt",
                                "ignored a result that reports another attempt than the one issued");
                            false
                        }
                        Applied::Stale => false,
                    })
                    .count();
                (changed > 0).then_some(changed)
            })
            .await?;
        Ok(applied.map(|(_, changed)| changed).unwrap_or(0))
    }

    /// The summarizer's exchange, recorded against the goal.
    pub(crate) async fn record_summary(&self, goal_id: &str, exchange: hermes_proto::ModelExchange) {
        if let Err(e) = self.records.record(goal_id, &format!("{goal_id}:summary"), &[exchange]).await {
            warn!(goal_id, error = %e, "cannot record the summarizer's exchange");
        }
    }

    /// Applies one plan result; stale and duplicate results change nothing. The plan is
    /// validated again here against the live catalogue (it may have changed since the planner
    /// looked) before it is applied.
    pub async fn apply_plan_result(&self, result: &PlanResult) -> Result<()> {
        // Recorded first (deduplicated by id, so a redelivery stores them once): a goal whose
        // plan is applied has its planner's exchanges on record.
        self.records
            .record(&result.goal_id, &format!("{}:{}", result.goal_id, result.request_id), &result.exchanges)
            .await?;
        let validated = match &result.outcome {
            Some(Outcome::Plan(plan)) => {
                let snapshot = self.catalog.snapshot(plan.nodes.iter().map(|n| n.task_type.as_str())).await?;
                Some(validate_plan(plan, &snapshot, self.config.max_nodes).map_err(|e| e.to_proto()))
            }
            _ => None,
        };
        let limits = self.limits();
        let request_id = result.request_id.as_str();
        let applied = self
            .transition(&result.goal_id, |state, effects, now| {
                if !engine::awaits_plan(state, request_id) {
                    return None;
                }
                if let Some(tokens) = &result.tokens
                    && engine::charge(state, None, tokens, limits, now, effects)
                {
                    return Some(());
                }
                let applied = match (&result.outcome, &validated) {
                    (Some(Outcome::NeedsInput(why)), _) => {
                        engine::needs_input(state, request_id, why, now, effects)
                    }
                    (Some(Outcome::Error(error)), _) | (Some(Outcome::Plan(_)), Some(Err(error))) => {
                        engine::plan_failed(state, request_id, error.clone(), now, effects)
                    }
                    (Some(Outcome::Plan(_)), Some(Ok(valid)))
                        if state.status == GoalStatus::Planning as i32 =>
                    {
                        engine::apply_plan(
                            state,
                            request_id,
                            valid.clone(),
                            result.repairs.clone(),
                            limits,
                            now,
                            effects,
                        )
                    }
                    (Some(Outcome::Plan(_)), Some(Ok(valid))) => engine::apply_replan(
                        state,
                        request_id,
                        valid.plan.clone(),
                        result.repairs.clone(),
                        limits,
                        now,
                        effects,
                    )
                    .unwrap_or_else(|e| engine::plan_failed(state, request_id, e.to_wire(), now, effects)),
                    _ => {
                        let error = hermes_core::error::wire_error(
                            hermes_core::ErrorCode::Internal,
                            "the planner sent an empty plan result",
                        );
                        engine::plan_failed(state, request_id, error, now, effects)
                    }
                };
                (applied == Applied::Changed).then_some(())
            })
            .await?;
        if applied.is_some() {
            info!(goal_id = %result.goal_id, request_id, corrections = result.corrections, event = "plan_created", "plan result applied");
        }
        Ok(())
    }

    /// Applies the passed deadlines of one goal. When nothing was due after all (a result
    /// arrived, or a person is deciding), returns the goal's next deadline for the timers to
    /// look again; after a change, the effects publisher has told them.
    pub(crate) async fn expire(&self, goal_id: &str) -> Result<Option<u64>> {
        let human: HashSet<String> = self.bus.approvals().pending_nodes(goal_id).await.unwrap_or_default();
        let limits = self.limits();
        let expired = self
            .transition(goal_id, |state, effects, now| {
                (engine::expire(state, limits, now, effects, &|node| human.contains(node))
                    == Applied::Changed)
                    .then_some(())
            })
            .await?;
        if let Some((state, ())) = expired {
            info!(goal_id, status = state.status, event = "deadline_passed", "deadline applied");
            return Ok(None);
        }
        Ok(self.store.load_current(goal_id).await?.and_then(|(state, _)| self.next_deadline(&state)))
    }

    /// Moves a node off an agent that went offline (see [`engine::reassign`]). Returns whether
    /// the task was still its node's current attempt.
    pub(crate) async fn reassign(
        &self,
        goal_id: &str,
        node_id: &str,
        task_id: &str,
        why: &str,
    ) -> Result<bool> {
        let limits = self.limits();
        let moved = self
            .transition(goal_id, |state, effects, now| {
                (engine::reassign(state, node_id, task_id, why, limits, now, effects) == Applied::Changed)
                    .then_some(())
            })
            .await?;
        Ok(moved.is_some())
    }

    /// Fails a node still waiting on attempt `task_id` with `error` (see [`engine::fail_attempt`]).
    pub(crate) async fn fail_attempt(
        &self,
        goal_id: &str,
        node_id: &str,
        task_id: &str,
        error: hermes_proto::Error,
    ) -> Result<()> {
        self.transition(goal_id, |state, effects, now| {
            (engine::fail_attempt(state, node_id, task_id, error.clone(), now, effects) == Applied::Changed)
                .then_some(())
        })
        .await?;
        Ok(())
    }

    /// Whether a live agent serves `task_type` now.
    pub(crate) async fn served(&self, task_type: &str) -> bool {
        self.catalog.current().await.is_ok_and(|s| s.contains_all(std::iter::once(task_type)))
    }

    /// Completes a summarizing goal with its answer, charging the summarizer's tokens. The nodes
    /// are done: a budget crossed here is recorded, and the answer still written.
    pub(crate) async fn finish_summary(
        &self,
        goal_id: &str,
        output: String,
        usage: Option<TokenUsage>,
    ) -> Result<()> {
        let limits = self.limits();
        self.transition(goal_id, |state, effects, now| {
            if let Some(tokens) = &usage {
                let _ = engine::charge(state, None, tokens, limits, now, effects);
            }
            (engine::finish_summary(state, output.clone(), now, effects) == Applied::Changed).then_some(())
        })
        .await?;
        Ok(())
    }

    /// [`Self::republish_in_flight`] for a goal whose committed effects were not sent, or whose
    /// write's outcome is unknown (the timers worker's `unsent` goals), and the webhooks of its
    /// end when it has ended.
    pub(crate) async fn republish_unsent(&self, state: &GoalState) -> Result<()> {
        self.republish_in_flight(state).await?;
        // An ended goal's transition may have been committed with none of its effects sent: its
        // webhooks go out again from its state (deduplicated by their ids when they were stored).
        if let Some(event) = crate::webhooks::terminal_event(state) {
            self.webhooks.publish_event(state, event).await?;
        }
        Ok(())
    }

    /// Waits until the goal's transitions in progress in this process are published: results
    /// that arrive meanwhile (a wide submit's first ones, while it still publishes its tasks) are
    /// then applied together, in one transition, rather than the first alone and the rest after.
    pub(crate) async fn transitions_published(&self, goal_id: &str) {
        drop(self.order.lock(goal_id).await);
    }

    /// Publishes again the tasks of the goal's in-flight attempts (see [`engine::in_flight_tasks`]),
    /// for a dispatcher that starts or reconnects, or a goal whose effects were not sent; once,
    /// without the effects publisher's patience (the timers worker tries again).
    pub(crate) async fn republish_in_flight(&self, state: &GoalState) -> Result<()> {
        let effects = engine::in_flight_tasks(state, self.limits());
        if effects.tasks.is_empty() {
            return Ok(());
        }
        info!(goal_id = %state.goal_id, tasks = effects.tasks.len(), "re-publishing in-flight tasks");
        let _order = self.order.lock(&state.goal_id).await;
        self.effects.publish_within(state, effects, std::time::Duration::ZERO).await
    }
}

fn limits(config: &DispatcherConfig) -> Limits {
    Limits {
        node_timeout_ms: config.node_timeout.as_millis() as u64,
        planner: config.planner,
        summarizer: config.summarizer.is_some(),
        prices: config.prices,
    }
}

/// One lock per goal with a transition in progress here: a transition holds it from its
/// compare-and-set until its effects are published, so this process stores each goal's events
/// in `seq` order. (Across replicas, the CAS orders the numbers; a watcher can tell a gap.)
#[derive(Default)]
struct TransitionOrder {
    locks: Arc<DashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

/// Holds a goal's transition order until dropped.
struct OrderGuard {
    locks: Arc<DashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    goal_id: String,
    guard: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl TransitionOrder {
    /// Waits for the goal's earlier transitions in this process to be published.
    async fn lock(&self, goal_id: &str) -> OrderGuard {
        let lock = self.locks.entry(goal_id.to_owned()).or_default().clone();
        let guard = lock.lock_owned().await;
        OrderGuard { locks: self.locks.clone(), goal_id: goal_id.to_owned(), guard: Some(guard) }
    }
}

impl Drop for OrderGuard {
    fn drop(&mut self) {
        drop(self.guard.take());
        // The last holder removes the lock, so finished goals leave nothing behind.
        self.locks.remove_if(&self.goal_id, |_, lock| Arc::strong_count(lock) == 1);
    }
}
