//! The caller gate: everything a door's request goes through before it reaches the goal
//! lifecycle, in one place and in one order. The doors (`grpc.rs`, `http.rs`, `http/a2a.rs`)
//! hold a [`Gate`] and only map their wire to its operations and its answers back; they import
//! neither the goal service nor the bus.
//!
//! 1. [`site::Site`] (HTTP only, as a layer on every route): the request is this server's own
//!    (its `Host`, its `Origin` when it changes state, its body type), so a web page the user
//!    visits cannot drive a local `hermes up`.
//! 2. [`Gate::authenticate`]: the [`Caller`], built once per request (first thing in each gRPC
//!    handler, from what a tonic interceptor kept of the call; an axum extractor for HTTP and
//!    A2A) from its credentials (a static API token, or an OIDC token whose issuer's keys may
//!    have to be fetched: [`Tokens::authenticate`]), its door, its peer and the trace context it
//!    sent (`traceparent`). Nothing but the request's size is looked at before it: an
//!    anonymous caller learns nothing but `401`.
//! 3. Each operation of the gate, then: the bus must be up ([`Gate::enter`]), the caller must
//!    hold the role the operation needs, the goal must be its tenant's (another tenant's is
//!    `NOT_FOUND`, as a missing one), the call is made, its answer is the caller's view
//!    (redacted without the secrets role), and a state change is audited, refused or not.
//!
//! Any new door adds a way to build a [`Caller`] and calls the same operations, so no rule has
//! a second implementation.

pub(crate) mod site;
mod webhooks;

use std::net::SocketAddr;
use std::sync::Arc;

use futures::Stream;
use hermes_core::access::{Need, Principal, TENANT_LABEL, Tokens, tenant_of};
use hermes_core::ids::{IdShape, check_id};
use hermes_core::trace::TraceContext;
use hermes_core::{Bus, Error, Result};
use hermes_proto::{
    AgentInfo, Approval, ApprovalDecision, AuditRecord, DeadLetter, Event, GoalSpec, GoalState,
    ModelExchange, SessionState, ToolExchange,
};
use tracing::Instrument as _;

use crate::audit::{Action, Audit};
use crate::dead_letters::DeadLetters;
use crate::goals::{GoalService, Submitted};
use crate::records::Records;

/// The door a request came through, for the audit trail and the span names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Door {
    Grpc,
    Http,
    A2a,
}

impl Door {
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Door::Grpc => "grpc",
            Door::Http => "http",
            Door::A2a => "a2a",
        }
    }
}

/// Who calls, through which door, from where, in which trace: built once per request by
/// [`Gate::authenticate`], then handed to every operation.
#[derive(Debug, Clone)]
pub(crate) struct Caller {
    /// The authenticated principal; its `origin` says `<door> <peer>` for the audit trail.
    pub principal: Principal,
    pub door: Door,
    pub peer: Option<SocketAddr>,
    /// The trace context the caller sent (`traceparent`), which a submitted goal joins.
    pub trace: Option<TraceContext>,
}

impl Caller {
    /// Who holds this caller's places under the per-client cap on event streams: its token's
    /// name when auth is on (so one token cannot take every place from many addresses), else
    /// its address.
    fn client(&self) -> String {
        match &self.principal.tenant {
            Some(_) => format!("token:{}", self.principal.name),
            None => self.peer.map(|p| p.ip().to_string()).unwrap_or_default(),
        }
    }

    fn require(&self, need: Need) -> Result<()> {
        self.principal.require(need)
    }
}

/// The gate of every door: the goal lifecycle and the stores the doors may reach, each behind
/// the operations below. Cheap to share (`Arc`).
pub(crate) struct Gate {
    goals: Arc<GoalService>,
    dead_letters: DeadLetters,
    audit: Audit,
    records: Records,
    access: Arc<Tokens>,
    bus: Bus,
    /// Which failed authentications get an audit record.
    failed: Arc<crate::audit::FailedAuth>,
    /// The tenants whose lanes of the pool are known to be in the lanes bucket.
    lanes: std::sync::Mutex<std::collections::HashSet<String>>,
}

impl Gate {
    pub(crate) fn new(goals: Arc<GoalService>, audit: Audit, records: Records, access: Arc<Tokens>) -> Gate {
        let bus = goals.bus().clone();
        let failed = Arc::default();
        // Written by the dispatcher's start (lib.rs), before the API serves.
        let lanes = std::sync::Mutex::new(access.current().tenant_weights().into_keys().collect());
        Gate {
            dead_letters: DeadLetters::new(bus.clone()),
            goals,
            audit,
            records,
            access,
            bus,
            failed,
            lanes,
        }
    }

    /// Makes sure `tenant`'s lane of the pool is in the lanes bucket, which agents follow to pull
    /// from it, before its first task can wait there. The tokens file's tenants are written at
    /// start; a tenant named only by an OIDC token's claim is written by its first submit, with
    /// weight 1.
    async fn ensure_lane(&self, tenant: &str) -> Result<()> {
        if self.lanes.lock().unwrap_or_else(|p| p.into_inner()).contains(tenant) {
            return Ok(());
        }
        // Boxed: once a tenant, and every submit's future would otherwise carry its 9 KB.
        Box::pin(hermes_core::lanes::ensure(&self.bus, tenant)).await?;
        self.lanes.lock().unwrap_or_else(|p| p.into_inner()).insert(tenant.to_owned());
        Ok(())
    }

    /// The caller of a request through `door` from `peer`, by its `Authorization` value
    /// (`Bearer <token>`; anyone with auth off), in the trace it sent.
    pub(crate) async fn authenticate(
        &self,
        authorization: Option<&str>,
        door: Door,
        peer: Option<SocketAddr>,
        trace: Option<TraceContext>,
    ) -> Result<Caller> {
        let principal = match self.access.authenticate(authorization).await {
            Ok(principal) => principal.at(door.as_str(), peer),
            Err(refused) => {
                self.failed_authentication(door, peer, &refused);
                return Err(refused);
            }
        };
        Ok(Caller { principal, door, peer, trace })
    }

    /// Counts a call refused for its credentials, and audits it as the rate limit allows
    /// ([`crate::audit::FailedAuth`]), off the call's path: the refusal is answered at once.
    fn failed_authentication(&self, door: Door, peer: Option<SocketAddr>, refused: &hermes_core::Error) {
        let labels = hermes_core::metrics::labels(&[("door", door.as_str())]);
        hermes_core::metrics::global().auth_failures.get_or_create(&labels).inc();
        let address = peer.map(|p| p.ip().to_string()).unwrap_or_else(|| "unknown".into());
        let Some(unrecorded) = self.failed.admit(&address, std::time::Instant::now()) else { return };
        let who = Principal::unauthenticated(format!("{} {address}", door.as_str()));
        let detail = match unrecorded {
            0 => String::new(),
            n => format!("{n} earlier failure(s) from this address not recorded (rate limit)"),
        };
        let reason = match refused {
            hermes_core::Error::Unauthenticated(reason) => reason.clone(),
            other => other.to_string(),
        };
        let (audit, outcome) =
            (self.audit.clone(), Err::<(), _>(hermes_core::Error::Unauthenticated(reason)));
        tokio::spawn(async move {
            audit.record(&who, Action::AuthFailed, door.as_str(), &detail, &outcome).await;
        });
    }

    /// Whether callers must authenticate.
    pub(crate) fn auth_enabled(&self) -> bool {
        self.access.current().enabled()
    }

    /// Whether goals given as text are accepted (a planner serves this deployment).
    pub(crate) fn plans_text_goals(&self) -> bool {
        self.goals.plans_text_goals()
    }

    /// The start of every operation, after authentication: the bus is up (`UNAVAILABLE` at once
    /// while it reconnects, rather than a request waiting out JetStream's timeouts), and the
    /// caller holds a role that grants `need`.
    fn enter(&self, caller: &Caller, need: Need) -> Result<()> {
        self.goals.nats_up()?;
        caller.require(need)
    }

    /// [`Gate::enter`]'s readiness alone, before an audited operation: a call refused because
    /// the bus is down is not an action (its record could not be stored either, and waiting for
    /// the audit stream would hold the caller's `UNAVAILABLE` back).
    fn ready(&self) -> Result<()> {
        self.goals.nats_up()
    }

    /// The goal, whole, if it is the caller's tenant's: for calls that show the caller some of
    /// it, or only check it exists for the caller. Another tenant's goal is `NOT_FOUND`.
    async fn goal_of(&self, caller: &Caller, goal_id: &str) -> Result<GoalState> {
        let state = self.goals.get(goal_id).await?;
        match caller.principal.sees(&state) {
            true => Ok(state),
            false => Err(Error::NotFound { what: "goal", id: goal_id.to_owned() }),
        }
    }

    /// `items` less those of goals the caller may not read (`goal_of`; `None`: no goal, kept),
    /// each goal read once. With auth off, all of them.
    async fn readable_only<T>(
        &self,
        caller: &Caller,
        items: Vec<T>,
        goal_of: impl Fn(&T) -> Option<&str>,
    ) -> Vec<T> {
        if caller.principal.scope().is_none() {
            return items;
        }
        let mut seen = std::collections::HashMap::<String, bool>::new();
        let mut kept = Vec::new();
        for item in items {
            let visible = match goal_of(&item) {
                None => true,
                Some(goal_id) => match seen.get(goal_id) {
                    Some(v) => *v,
                    None => {
                        let v = self.goal_of(caller, goal_id).await.is_ok();
                        seen.insert(goal_id.to_owned(), v);
                        v
                    }
                },
            };
            if visible {
                kept.push(item);
            }
        }
        kept
    }

    /// Submits a goal for the caller: it belongs to the caller's tenant, and its idempotency
    /// key is the tenant's own, so two tenants using one key get two goals. The goal's trace
    /// follows the caller's (`traceparent`), through any door. Audited.
    pub(crate) async fn submit(&self, caller: &Caller, spec: GoalSpec) -> Result<Submitted> {
        let name = match caller.door {
            Door::Grpc => "SubmitGoal",
            Door::Http => "POST /v1/goals",
            Door::A2a => "SendMessage",
        };
        let span = tracing::info_span!(
            "submit_goal",
            otel.name = name,
            otel.kind = "server",
            goal_id = tracing::field::Empty
        );
        hermes_core::trace::follow(&span, caller.trace.as_ref());
        self.ready()?;
        let submitted = async {
            self.enter(caller, Need::Submit)?;
            let who = &caller.principal;
            self.goals.quotas().check_submit(who.tenant.as_deref()).await?;
            let mut spec = spec;
            match &who.tenant {
                Some(tenant) => {
                    self.ensure_lane(tenant).await?;
                    spec.labels.insert(TENANT_LABEL.to_owned(), tenant.clone());
                    if !spec.idempotency_key.is_empty() {
                        spec.idempotency_key = format!("{tenant}/{}", spec.idempotency_key);
                    }
                }
                // With auth off goals carry no tenant: a `tenant` label the client wrote would
                // put the goal's pooled tasks in a lane no agent serves.
                None => {
                    spec.labels.remove(TENANT_LABEL);
                }
            }
            self.goals.submit(spec, caller.trace.as_ref()).await
        }
        .instrument(span)
        .await;
        let (target, detail) = match &submitted {
            Ok(s) if s.duplicate => (s.goal_id.as_str(), "a repeat of an earlier submit"),
            Ok(s) => (s.goal_id.as_str(), ""),
            Err(_) => ("", ""),
        };
        self.audit.record(&caller.principal, Action::Submit, target, detail, &submitted).await;
        submitted
    }

    /// The goal as the caller may read it (redacted without the secrets role).
    pub(crate) async fn get(&self, caller: &Caller, goal_id: &str) -> Result<GoalState> {
        self.enter(caller, Need::Read)?;
        Ok(caller.principal.view(self.goal_of(caller, goal_id).await?))
    }

    /// The newest goals of the caller's tenant first (every tenant's with auth off or the
    /// platform role) that `query` and `text` ask for, at most `limit`, and whether more follow.
    /// The caller's scope replaces `query.tenant`.
    pub(crate) async fn list(
        &self,
        caller: &Caller,
        query: crate::goal_index::PageQuery<'_>,
        text: Option<&str>,
        limit: usize,
    ) -> Result<(Vec<GoalState>, bool)> {
        self.enter(caller, Need::Read)?;
        let query = crate::goal_index::PageQuery { tenant: caller.principal.scope(), ..query };
        let (mut goals, more) = self.goals.page(&query, text, limit).await?;
        goals.retain(|g| caller.principal.sees(g));
        Ok((goals.into_iter().map(|g| caller.principal.view(g)).collect(), more))
    }

    /// Goals created or changing status and approvals asked for or decided, from now on, those
    /// of the caller's tenant only (every tenant's with auth off or the platform role); `Lagged`
    /// when the caller fell behind and should list again.
    pub(crate) fn changes(
        &self,
        caller: &Caller,
    ) -> Result<impl futures::Stream<Item = Change> + Send + use<>> {
        use futures::StreamExt as _;
        use tokio_stream::wrappers::{BroadcastStream, errors::BroadcastStreamRecvError};
        self.enter(caller, Need::Read)?;
        let index = self.goals.index().clone();
        let scope: Option<Arc<str>> = caller.principal.scope().map(Arc::from);
        let goals = BroadcastStream::new(index.subscribe()).map(|e| match e {
            Ok(entry) => Change::Goal(entry),
            Err(BroadcastStreamRecvError::Lagged(_)) => Change::Lagged,
        });
        let approvals = BroadcastStream::new(index.subscribe_approvals()).map(|e| match e {
            Ok(approval) => Change::Approval(approval),
            Err(BroadcastStreamRecvError::Lagged(_)) => Change::Lagged,
        });
        Ok(futures::stream::select(goals, approvals).filter(move |change| {
            let visible = match (&scope, change) {
                (None, _) | (_, Change::Lagged) => true,
                (Some(scope), Change::Goal(entry)) => *entry.tenant == **scope,
                (Some(scope), Change::Approval(a)) => index.tenant(&a.goal_id).is_some_and(|t| t == *scope),
            };
            std::future::ready(visible)
        }))
    }

    /// Cancels a goal of the caller's tenant. Audited.
    pub(crate) async fn cancel(&self, caller: &Caller, goal_id: &str, reason: &str) -> Result<GoalState> {
        self.ready()?;
        let mut goal_tenant = None;
        let cancelled = async {
            self.enter(caller, Need::Submit)?;
            goal_tenant = tenant_of(&self.goal_of(caller, goal_id).await?).map(str::to_owned);
            Ok(caller.principal.view(self.goals.cancel(goal_id, reason).await?))
        }
        .await;
        self.audit.record(&caller.principal, Action::Cancel, goal_id, reason, &cancelled).await;
        self.audit
            .record_across(
                &caller.principal,
                goal_tenant.as_deref(),
                Action::Cancel,
                goal_id,
                reason,
                &cancelled,
            )
            .await;
        cancelled
    }

    /// A goal's events after `after_seq` (see `GoalService::watch`), the stream holding one of
    /// the caller's places under the per-client cap while it lives.
    pub(crate) async fn watch(
        &self,
        caller: &Caller,
        goal_id: &str,
        after_seq: u64,
    ) -> Result<impl Stream<Item = Result<Event>> + Send + use<>> {
        self.enter(caller, Need::Read)?;
        // The one read of the goal: it exists, and is the caller's.
        self.goal_of(caller, goal_id).await?;
        self.goals.watch(goal_id, after_seq, &caller.client()).await
    }

    /// Decides a tool call waiting for a person. The note says who decided when auth is on. A
    /// call decided earlier keeps that decision, which is returned (and audited as such).
    pub(crate) async fn decide(
        &self,
        caller: &Caller,
        goal_id: &str,
        call_id: &str,
        approve: bool,
        note: &str,
    ) -> Result<ApprovalDecision> {
        let who = &caller.principal;
        self.ready()?;
        // A malformed call id is refused before anything is audited: the record names the call.
        check_id("call_id", call_id, 256, IdShape::Dotted)?;
        let mut goal_tenant = None;
        let decided = async {
            self.enter(caller, Need::Approve)?;
            let goal = self
                .goal_of(caller, goal_id)
                .await
                .map_err(|_| Error::NotFound { what: "approval", id: format!("{goal_id}/{call_id}") })?;
            goal_tenant = tenant_of(&goal).map(str::to_owned);
            let note = match (who.tenant.is_some(), note.is_empty()) {
                (true, true) => format!("by {}", who.name),
                (true, false) => format!("{note} (by {})", who.name),
                (false, _) => note.to_owned(),
            };
            self.goals.decide_approval(goal_id, call_id, approve, &note).await
        }
        .await;
        let action = if approve { Action::Approve } else { Action::Deny };
        // A call decided earlier keeps that decision: say so, rather than record this one as done.
        let detail = match &decided {
            Ok(d) if d.approved != approve || d.timed_out => {
                format!("already decided: approved={}", d.approved)
            }
            _ => note.to_owned(),
        };
        let target = format!("{goal_id}/{call_id}");
        self.audit.record(who, action, &target, &detail, &decided).await;
        self.audit
            .record_across(&caller.principal, goal_tenant.as_deref(), action, &target, &detail, &decided)
            .await;
        decided
    }

    /// The pending approvals of the goals the caller may read.
    pub(crate) async fn pending_approvals(&self, caller: &Caller) -> Result<Vec<Approval>> {
        self.enter(caller, Need::Read)?;
        let pending = self.bus.approvals().pending().await?;
        Ok(self.readable_only(caller, pending, |a| Some(a.goal_id.as_str())).await)
    }

    /// The calls of `goal` waiting for a person. The goal is one the gate gave the caller (by
    /// [`Gate::get`], which checked its tenant), which is what entitles it to them. (Its view may
    /// be redacted, labels included, so the tenant is not checked again on it.)
    pub(crate) async fn goal_approvals(&self, caller: &Caller, goal: &GoalState) -> Result<Vec<Approval>> {
        self.enter(caller, Need::Read)?;
        let mut pending = self.bus.approvals().pending().await?;
        pending.retain(|a| a.goal_id == goal.goal_id);
        Ok(pending)
    }

    /// Whether call `call_id` of `goal`, whose approval a stream replays, was decided since (the
    /// stream's caller has read the goal already).
    pub(crate) async fn decided(&self, goal: &GoalState, call_id: &str) -> bool {
        matches!(self.bus.approvals().load(call_id).await,
            Ok(Some((approval, _))) if approval.goal_id == goal.goal_id && approval.decision.is_some())
    }

    /// The dead letters the caller may see (operators only): with auth on, those of its
    /// tenant's goals, and those that name no goal (see `DeadLetter.goal_id`).
    pub(crate) async fn dead_letters(&self, caller: &Caller, limit: usize) -> Result<Vec<DeadLetter>> {
        self.enter(caller, Need::Operate)?;
        let letters = self.dead_letters.list(limit).await?;
        // One that names no goal is every operator's.
        Ok(self
            .readable_only(caller, letters, |l| (!l.goal_id.is_empty()).then_some(l.goal_id.as_str()))
            .await)
    }

    /// One dead letter (operators only): another tenant's is `NOT_FOUND`, and one that names no
    /// goal comes without its payload with auth on.
    pub(crate) async fn dead_letter(&self, caller: &Caller, sequence: u64) -> Result<DeadLetter> {
        self.enter(caller, Need::Operate)?;
        let mut letter = self.dead_letters.get(sequence).await?;
        if caller.principal.scope().is_some() {
            if letter.goal_id.is_empty() {
                letter.decoded = "(withheld: it names no goal, so it is no tenant's)".into();
            } else if self.goal_of(caller, &letter.goal_id).await.is_err() {
                return Err(Error::NotFound { what: "dead letter", id: sequence.to_string() });
            }
        }
        Ok(letter)
    }

    /// Replays a dead letter (operators only, of its goal's tenant). Audited.
    pub(crate) async fn replay_dead_letter(&self, caller: &Caller, sequence: u64) -> Result<(String, u64)> {
        self.ready()?;
        let mut goal_tenant = None;
        let replayed = async {
            let letter = self.dead_letter(caller, sequence).await?;
            if !letter.goal_id.is_empty() {
                goal_tenant =
                    self.goals.get(&letter.goal_id).await.ok().and_then(|g| tenant_of(&g).map(str::to_owned));
            }
            if caller.principal.scope().is_some() && letter.goal_id.is_empty() {
                return Err(Error::FailedPrecondition(format!(
                    "dead letter {sequence} names no goal, so it is no tenant's: it is not replayed"
                )));
            }
            self.dead_letters.replay(sequence).await
        }
        .await;
        let target = sequence.to_string();
        self.audit.record(&caller.principal, Action::Replay, &target, "", &replayed).await;
        self.audit
            .record_across(&caller.principal, goal_tenant.as_deref(), Action::Replay, &target, "", &replayed)
            .await;
        replayed
    }

    /// The tool-result cache's entries by tool (operators only): with auth on, the caller's
    /// tenant's.
    pub(crate) async fn tool_cache_stats(
        &self,
        caller: &Caller,
        tool: Option<&str>,
    ) -> Result<std::collections::BTreeMap<String, hermes_core::tool_cache::ToolStats>> {
        self.enter(caller, Need::Operate)?;
        let tenant = caller.principal.scope();
        hermes_core::tool_cache::stats(&self.bus, tenant, tool).await
    }

    /// Removes cached tool results (operators only, their tenant's with auth on). Audited.
    pub(crate) async fn clear_tool_cache(&self, caller: &Caller, tool: Option<&str>) -> Result<usize> {
        self.enter(caller, Need::Operate)?;
        let tenant = caller.principal.scope();
        let cleared = hermes_core::tool_cache::clear(&self.bus, tenant, tool).await;
        self.audit.record(&caller.principal, Action::CacheClear, tool.unwrap_or("*"), "", &cleared).await;
        cleared
    }

    /// Up to `limit` audit records after `after_seq`, oldest first (operators only): the
    /// caller's tenant's, or all of them with auth off.
    pub(crate) async fn audit(
        &self,
        caller: &Caller,
        limit: usize,
        after_seq: u64,
    ) -> Result<Vec<AuditRecord>> {
        self.enter(caller, Need::Operate)?;
        self.audit.list(caller.principal.scope(), limit, after_seq).await
    }

    /// An artifact `goal_id` produced, its metadata and its content, if the caller may read the
    /// goal. Another goal's artifact is `NOT_FOUND`, as a missing one, and so is one stored under
    /// this goal's id by another tenant: an artifact is owned by the goal's tenant (an agent's) or
    /// by the tenant that stored it through the Memory API, naming any goal it liked. Without the
    /// secrets role the content is redacted as the goal's outputs are (`Principal::view_artifact`).
    pub(crate) async fn artifact(
        &self,
        caller: &Caller,
        goal_id: &str,
        reference: &str,
    ) -> Result<(hermes_core::artifacts::ArtifactInfo, Vec<u8>)> {
        self.enter(caller, Need::Read)?;
        let goal = self.goal_of(caller, goal_id).await?;
        let artifacts = self.bus.artifacts();
        let not_found = || Error::NotFound { what: "artifact", id: format!("{goal_id}/{reference}") };
        // A malformed or missing reference is not found; the store failing is said as it is.
        let info = artifacts.info(reference).await.map_err(|e| match e {
            Error::NotFound { .. } | Error::InvalidArgument { .. } => not_found(),
            other => other,
        })?;
        let goal_tenant = tenant_of(&goal).unwrap_or_default();
        let foreign = !info.tenant.is_empty() && info.tenant != goal_tenant;
        if info.goal_id != goal_id || foreign {
            return Err(not_found());
        }
        let bytes = artifacts.get(reference).await?;
        Ok((info, caller.principal.view_artifact(&goal, bytes)))
    }

    /// The recorded model exchanges and agent tool calls of a goal the caller may read
    /// (docs/evaluation.md); without the secrets role, answers and outputs are redacted.
    pub(crate) async fn exchanges(
        &self,
        caller: &Caller,
        goal_id: &str,
    ) -> Result<(Vec<ModelExchange>, Vec<ToolExchange>)> {
        self.enter(caller, Need::Read)?;
        self.goal_of(caller, goal_id).await?;
        let exchanges = self.records.list(goal_id).await?;
        let tools = self.records.list_tools(goal_id).await?;
        if caller.require(Need::Secrets).is_ok() {
            return Ok((exchanges, tools));
        }
        let redact = hermes_core::redact::redact_json_text;
        Ok((
            exchanges.into_iter().map(|e| ModelExchange { content: redact(&e.content), ..e }).collect(),
            tools.into_iter().map(|t| ToolExchange { output_json: redact(&t.output_json), ..t }).collect(),
        ))
    }

    /// Every live agent as this dispatcher routes to it: its last heartbeat, and as load its own
    /// count then plus the tasks routed to it since, less their results.
    pub(crate) async fn agents(&self, caller: &Caller) -> Result<Vec<AgentInfo>> {
        self.enter(caller, Need::Read)?;
        Ok(self.goals.agents().agents())
    }

    /// The task types the agents online now serve, fresh from the registry.
    pub(crate) async fn catalogue(
        &self,
        caller: &Caller,
    ) -> Result<hermes_clients::registry::CatalogSnapshot> {
        self.enter(caller, Need::Read)?;
        self.goals.catalogue().await
    }

    /// The memory sessions of the caller's tenant.
    pub(crate) async fn sessions(&self, caller: &Caller) -> Result<Vec<SessionState>> {
        self.enter(caller, Need::Read)?;
        let memory = hermes_clients::memory::MemoryClient::new(&self.bus);
        memory.sessions(caller.principal.tenant.as_deref().unwrap_or("")).await
    }

    /// One session of the caller's tenant (empty when it has no turns, as another tenant's
    /// session of that name is to this one).
    pub(crate) async fn session(&self, caller: &Caller, session_id: &str) -> Result<SessionState> {
        self.enter(caller, Need::Read)?;
        check_id("session_id", session_id, 200, IdShape::Dotted)?;
        let memory = hermes_clients::memory::MemoryClient::new(&self.bus);
        memory.session(caller.principal.tenant.as_deref().unwrap_or(""), session_id).await
    }
}

/// One change [`Gate::changes`] reports.
pub(crate) enum Change {
    Goal(Arc<hermes_proto::GoalIndexEntry>),
    Approval(Arc<hermes_proto::Approval>),
    Lagged,
}

/// A goal id argument of any door: `INVALID_ARGUMENT` naming the field unless it is an id's
/// shape, before anything is looked up.
pub(crate) fn goal_id_arg(goal_id: &str) -> Result<&str> {
    check_id("goal_id", goal_id, 128, IdShape::Word)?;
    Ok(goal_id)
}

/// How many goals a list returns: `requested`, 100 when it is 0, at most 1000.
pub(crate) fn list_limit(requested: usize) -> usize {
    match requested {
        0 => 100,
        n => n.min(1000),
    }
}
