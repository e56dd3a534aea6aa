//! Goal state transitions as pure functions over `GoalState`. Each returns the effects (tasks to
//! publish, events to emit) that must follow once the new state is committed to KV by
//! compare-and-set. Keeping this free of I/O makes every transition unit-testable and lets a
//! retried CAS simply recompute the effects.

use std::collections::HashMap;

use hermes_core::error::wire_error;
use hermes_core::{ErrorCode, GoalId, TaskId, json_ref};
use hermes_proto::event::Kind;
use hermes_proto::{
    CompletedNode, Event, GoalCancelled, GoalCompleted, GoalFailed, GoalNeedsInput, GoalState, GoalStatus,
    NodeState, NodeStatus, ParallelGroup, PlanCreated, PlanPatched, PlanRequest, PlanRequested,
    ReplanContext, TaskDispatched, TaskFailed, TaskMessage, TaskPlan, TaskResult, TaskRetrying, TaskStatus,
    TaskSucceeded, TokenUsage,
};
use serde_json::Value;

/// Retries of a retryable failure when the node does not say.
pub const DEFAULT_MAX_RETRIES: u32 = 2;

/// What must happen after a committed transition, in order: events first, then tasks, so a
/// `TaskDispatched` event is always stored before the task can produce a result.
#[derive(Debug, Default)]
pub struct Effects {
    pub events: Vec<Event>,
    pub tasks: Vec<TaskMessage>,
    /// Plan or replan requests for the planner, published after the events.
    pub plan_requests: Vec<PlanRequest>,
    /// Every node is done and the summarizer should write the answer.
    pub summarize: bool,
    /// The goal ended with nodes running: their agents are told to stop.
    pub stop_agents: bool,
}

impl Effects {
    fn event(&mut self, goal_id: &str, now_ms: u64, kind: Kind) {
        self.events.push(Event {
            goal_id: goal_id.to_owned(),
            at_unix_ms: now_ms,
            kind: Some(kind),
            seq: 0,
            session_id: String::new(),
        });
    }

    /// Numbers the transition's events on from the goal's last `seq`. Call it inside the
    /// compare-and-set, after the transition, so the numbers are committed with the state: a
    /// goal's events then run 1, 2, 3, ... in the order its transitions committed.
    /// Goal-level events also carry the goal's session (see `Event.session_id`).
    pub fn number(&mut self, state: &mut GoalState) {
        let session = state.spec.as_ref().map(|s| s.session_id.as_str()).unwrap_or("");
        for event in &mut self.events {
            state.event_seq += 1;
            event.seq = state.event_seq;
            if is_goal_level(event) {
                event.session_id = session.to_owned();
            }
        }
    }
}

fn is_goal_level(event: &Event) -> bool {
    matches!(
        event.kind,
        Some(
            Kind::GoalAccepted(_)
                | Kind::GoalCompleted(_)
                | Kind::GoalFailed(_)
                | Kind::GoalCancelled(_)
                | Kind::GoalNeedsInput(_)
        )
    )
}

/// What a compare-and-set transition returns: its effects, maybe with more.
pub trait Transition {
    fn effects(&mut self) -> &mut Effects;
}

impl Transition for Effects {
    fn effects(&mut self) -> &mut Effects {
        self
    }
}

impl<T> Transition for (T, Effects) {
    fn effects(&mut self) -> &mut Effects {
        &mut self.1
    }
}

/// Settings a transition needs.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub node_timeout_ms: u64,
    /// A planner serves this dispatcher: failed nodes of text goals are replanned.
    pub planner: bool,
    /// A summarizer model is configured: text goals end with a written answer.
    pub summarizer: bool,
    /// US dollars per million input and output tokens, for goals' estimated cost.
    pub prices: Prices,
}

/// What LLM tokens cost, for the estimate checked against a goal's cost budget.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Prices {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
}

/// Adds an LLM step's tokens to the goal (and to node `index`, when given) and ends the goal
/// with `BUDGET_EXCEEDED` when that takes it over its token or cost budget. Returns whether the
/// goal ended.
pub fn charge(
    state: &mut GoalState,
    index: Option<usize>,
    tokens: &TokenUsage,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> bool {
    if tokens.input_tokens == 0 && tokens.output_tokens == 0 {
        return false;
    }
    let total = state.tokens.get_or_insert_with(Default::default);
    total.input_tokens += tokens.input_tokens;
    total.output_tokens += tokens.output_tokens;
    let used = total.input_tokens + total.output_tokens;
    state.cost_usd += (tokens.input_tokens as f64 * limits.prices.input_per_mtok
        + tokens.output_tokens as f64 * limits.prices.output_per_mtok)
        / 1_000_000.0;
    if let Some(node) = index.and_then(|i| state.nodes.get_mut(i)) {
        let node_tokens = node.tokens.get_or_insert_with(Default::default);
        node_tokens.input_tokens += tokens.input_tokens;
        node_tokens.output_tokens += tokens.output_tokens;
    }
    if is_terminal(state.status) {
        return false;
    }
    let spec = state.spec.clone().unwrap_or_default();
    let over = if spec.max_tokens > 0 && used > spec.max_tokens {
        format!("the goal used {used} tokens, over its budget of {}", spec.max_tokens)
    } else if spec.max_cost_usd > 0.0 && state.cost_usd > spec.max_cost_usd {
        format!(
            "the goal cost an estimated ${:.4}, over its budget of ${:.4}",
            state.cost_usd, spec.max_cost_usd
        )
    } else {
        return false;
    };
    let error = wire_error(ErrorCode::BudgetExceeded, over);
    let event = Kind::GoalFailed(GoalFailed { error: Some(error.clone()) });
    end_goal(state, GoalStatus::Failed, error, event, now_ms, effects);
    true
}

/// Replans of one node before the goal gives up.
pub const MAX_REPLANS: u32 = 2;

pub fn is_terminal(status: i32) -> bool {
    status == GoalStatus::Completed as i32
        || status == GoalStatus::Failed as i32
        || status == GoalStatus::Cancelled as i32
        || status == GoalStatus::NeedsInput as i32
}

/// Whether the goal was given as text, so the planner and summarizer take part in it.
pub fn from_text(state: &GoalState) -> bool {
    state.spec.as_ref().is_some_and(|s| !s.text.trim().is_empty())
}

/// Dispatches every node that is ready: pending, with all dependencies succeeded.
pub fn dispatch_ready(state: &mut GoalState, limits: Limits, now_ms: u64, effects: &mut Effects) {
    if is_terminal(state.status) {
        return;
    }
    let Some(plan) = state.plan.clone() else {
        return;
    };
    let status_of: HashMap<String, i32> = state.nodes.iter().map(|n| (n.node_id.clone(), n.status)).collect();
    for (i, node) in plan.nodes.iter().enumerate() {
        if state.nodes[i].status != NodeStatus::Pending as i32 {
            continue;
        }
        let ready = node.depends_on.iter().all(|d| status_of.get(d) == Some(&(NodeStatus::Succeeded as i32)));
        if !ready {
            continue;
        }
        match resolve_inputs(state, &node.inputs_json) {
            Ok(inputs_json) => {
                // A node replaced by a replan keeps counting attempts, so its task ids (which are
                // also Nats-Msg-Ids) never repeat one used before.
                let attempt = state.nodes[i].attempt + 1;
                publish_attempt(state, i, attempt, inputs_json, limits, now_ms, effects);
            }
            Err(e) => {
                fail_node(state, i, e.to_wire(), now_ms, effects);
                return;
            }
        }
    }
}

fn publish_attempt(
    state: &mut GoalState,
    index: usize,
    attempt: u32,
    inputs_json: String,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) {
    let task = task_message(state, index, attempt, inputs_json, limits, now_ms);
    let node = &mut state.nodes[index];
    node.status = NodeStatus::Dispatched as i32;
    node.attempt = attempt;
    node.task_id = task.task_id.clone();
    node.dispatched_unix_ms = now_ms;
    node.error = None;
    effects.event(
        &state.goal_id,
        now_ms,
        Kind::TaskDispatched(TaskDispatched {
            node_id: task.node_id.clone(),
            task_id: task.task_id.clone(),
            attempt,
            task_type: task.task_type.clone(),
            subject: String::new(),
            ..Default::default()
        }),
    );
    effects.tasks.push(task);
}

/// The task of attempt `attempt` of node `index`, dispatched at `dispatched_ms`.
fn task_message(
    state: &GoalState,
    index: usize,
    attempt: u32,
    inputs_json: String,
    limits: Limits,
    dispatched_ms: u64,
) -> TaskMessage {
    let plan_node = &state.plan.as_ref().expect("plan present").nodes[index];
    let goal_id = GoalId::new(state.goal_id.clone());
    let task_id = TaskId::for_attempt(&goal_id, &plan_node.id, attempt);
    let node_timeout = if plan_node.timeout_ms > 0 { plan_node.timeout_ms } else { limits.node_timeout_ms };
    let deadline = match state.deadline_unix_ms {
        0 => dispatched_ms + node_timeout,
        goal_deadline => goal_deadline.min(dispatched_ms + node_timeout),
    };
    TaskMessage {
        goal_id: state.goal_id.clone(),
        node_id: plan_node.id.clone(),
        task_id: task_id.to_string(),
        attempt,
        task_type: plan_node.task_type.clone(),
        inputs_json,
        deadline_unix_ms: deadline,
        memory_refs: Vec::new(),
        session_id: state.spec.as_ref().map(|s| s.session_id.clone()).unwrap_or_default(),
    }
}

/// The tasks of every node waiting on an attempt, rebuilt from the stored state, for a
/// dispatcher that starts: the dispatcher that stored those attempts may have died before it
/// published them. Publishing again is safe: the same task id is the same `Nats-Msg-Id`
/// (deduplicated for two minutes); an attempt that runs twice counts its first result only, and
/// side effects are claimed in the ledger. Without this, such a node would wait for its deadline.
pub fn in_flight_tasks(state: &GoalState, limits: Limits) -> Effects {
    let mut effects = Effects::default();
    if is_terminal(state.status) || state.plan.is_none() {
        return effects;
    }
    for (index, node) in state.nodes.iter().enumerate() {
        if node.status != NodeStatus::Dispatched as i32 {
            continue;
        }
        let inputs = &state.plan.as_ref().expect("plan present").nodes[index].inputs_json;
        if let Ok(inputs_json) = resolve_inputs(state, inputs) {
            effects.tasks.push(task_message(
                state,
                index,
                node.attempt,
                inputs_json,
                limits,
                node.dispatched_unix_ms,
            ));
        }
    }
    effects
}

/// Why a transition could not use what it was given. Each is the input's fault and carries the
/// code the node or plan fails with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransitionError {
    #[error("inputs: {0}")]
    InputsNotJson(String),
    #[error(
        "the inputs would take about {estimate} bytes once their {refs} $ref(s) are resolved, over the limit of {limit} bytes; pass fewer or smaller references"
    )]
    InputsTooLarge { estimate: usize, refs: usize, limit: usize },
    #[error(transparent)]
    Ref(#[from] json_ref::RefError),
    #[error("the replan changes or drops completed node `{0}`")]
    ReplanChangesCompleted(String),
    #[error("the replan has no replacement for the failed node `{0}`")]
    ReplanMissesFailed(String),
}

impl TransitionError {
    /// `INVALID_ARGUMENT` for a node's inputs, `PLAN_INVALID` for a replan.
    pub fn code(&self) -> ErrorCode {
        match self {
            TransitionError::ReplanChangesCompleted(_) | TransitionError::ReplanMissesFailed(_) => {
                ErrorCode::PlanInvalid
            }
            _ => ErrorCode::InvalidArgument,
        }
    }

    pub fn retryable(&self) -> bool {
        self.code().retryable()
    }

    /// The wire error a node or plan fails with.
    pub fn to_wire(&self) -> hermes_proto::Error {
        wire_error(self.code(), self.to_string())
    }
}

/// Most bytes a node's inputs may take once the dispatcher resolves their `$ref`s to inline
/// outputs; over it the node fails with `INVALID_ARGUMENT` before anything is built.
pub const MAX_DISPATCH_INPUT_BYTES: usize = 8 * 1024 * 1024;

/// Replaces the `$ref`s in a node's inputs with its dependencies' outputs.
fn resolve_inputs(state: &GoalState, inputs_json: &str) -> Result<String, TransitionError> {
    if inputs_json.trim().is_empty() {
        return Ok("{}".to_owned());
    }
    let inputs: Value =
        serde_json::from_str(inputs_json).map_err(|e| TransitionError::InputsNotJson(e.to_string()))?;
    let refs = json_ref::collect_refs(&inputs);
    if refs.is_empty() {
        return Ok(inputs_json.to_owned());
    }
    // Bound the resolved size before materialising it: each ref to an inline output counts with
    // that whole output (refs to artifacts become small stubs, bounded by the executor).
    let mut estimate = inputs_json.len();
    for (_, reference) in &refs {
        if let Some(target) = json_ref::RefTarget::parse(reference)
            && let Some(node) =
                state.nodes.iter().find(|n| n.node_id == target.node_id && n.memory_ref.is_empty())
        {
            estimate = estimate.saturating_add(node.output_json.len());
        }
    }
    if estimate > MAX_DISPATCH_INPUT_BYTES {
        return Err(TransitionError::InputsTooLarge {
            estimate,
            refs: refs.len(),
            limit: MAX_DISPATCH_INPUT_BYTES,
        });
    }
    // A ref to an output kept as an artifact becomes a stub pointing into it; the executor loads
    // the content, so large payloads never pass through the dispatcher.
    let offloaded = |node_id: &str| {
        state
            .nodes
            .iter()
            .find(|n| n.node_id == node_id && !n.memory_ref.is_empty())
            .map(|n| n.memory_ref.clone())
    };
    let inputs = json_ref::map_refs(&inputs, &|target| {
        offloaded(&target.node_id).map(|reference| hermes_core::artifacts::stub_at(&reference, &target.path))
    });
    let output_of = |node_id: &str| {
        state
            .nodes
            .iter()
            .find(|n| n.node_id == node_id && n.status == NodeStatus::Succeeded as i32)
            .and_then(|n| serde_json::from_str(&n.output_json).ok())
    };
    Ok(json_ref::resolve(&inputs, &output_of)?.to_string())
}

/// What applying a result did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// The result changed the goal.
    Changed,
    /// The result is for an attempt that is no longer current, or was already applied.
    Stale,
}

/// Applies a task result: records it, retries or fails the node, dispatches newly ready nodes and
/// completes the goal when every node is done.
pub fn apply_result(
    state: &mut GoalState,
    result: &TaskResult,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    let Some(index) = current_attempt(state, &result.node_id, &result.task_id) else {
        return Applied::Stale;
    };
    let goal_id = state.goal_id.clone();
    if result.status == TaskStatus::Succeeded as i32 {
        let node = &mut state.nodes[index];
        node.status = NodeStatus::Succeeded as i32;
        node.output_json = result.output_json.clone();
        node.memory_ref = result.memory_ref.clone();
        node.agent_id = result.agent_id.clone();
        node.elapsed_ms = result.elapsed_ms;
        node.finished_unix_ms = now_ms;
        effects.event(
            &goal_id,
            now_ms,
            Kind::TaskSucceeded(TaskSucceeded {
                node_id: result.node_id.clone(),
                task_id: result.task_id.clone(),
                attempt: result.attempt,
                agent_id: result.agent_id.clone(),
                elapsed_ms: result.elapsed_ms,
                output_json: result.output_json.clone(),
            }),
        );
        if let Some(tokens) = &result.tokens
            && charge(state, Some(index), tokens, limits, now_ms, effects)
        {
            return Applied::Changed;
        }
        dispatch_ready(state, limits, now_ms, effects);
        complete_if_done(state, limits, now_ms, effects);
        return Applied::Changed;
    }

    let mut error = result
        .error
        .clone()
        .unwrap_or_else(|| wire_error(ErrorCode::Internal, "the agent reported a failure without an error"));
    error.node_id = result.node_id.clone();
    {
        let node = &mut state.nodes[index];
        node.agent_id = result.agent_id.clone();
        node.elapsed_ms = result.elapsed_ms;
        node.errors.push(error.clone());
    }
    effects.event(
        &goal_id,
        now_ms,
        Kind::TaskFailed(TaskFailed {
            node_id: result.node_id.clone(),
            task_id: result.task_id.clone(),
            attempt: result.attempt,
            agent_id: result.agent_id.clone(),
            elapsed_ms: result.elapsed_ms,
            error: Some(error.clone()),
        }),
    );
    // A failed attempt's tokens were spent all the same.
    if let Some(tokens) = &result.tokens
        && charge(state, Some(index), tokens, limits, now_ms, effects)
    {
        return Applied::Changed;
    }
    let plan_node = &state.plan.as_ref().expect("plan present").nodes[index];
    let max_retries = if plan_node.max_retries > 0 { plan_node.max_retries } else { DEFAULT_MAX_RETRIES };
    if error.retryable && result.attempt <= max_retries {
        let next_attempt = result.attempt + 1;
        effects.event(
            &goal_id,
            now_ms,
            Kind::TaskRetrying(TaskRetrying {
                node_id: result.node_id.clone(),
                next_attempt,
                error: Some(error),
            }),
        );
        redispatch(state, index, next_attempt, limits, now_ms, effects);
        return Applied::Changed;
    }
    if limits.planner && from_text(state) && state.status == GoalStatus::Running as i32 {
        if state.nodes[index].replans < MAX_REPLANS {
            request_replan(state, index, error, now_ms, effects);
            return Applied::Changed;
        }
        let chain = error_chain(&state.nodes[index]);
        fail_node(state, index, chain, now_ms, effects);
        return Applied::Changed;
    }
    fail_node(state, index, error, now_ms, effects);
    Applied::Changed
}

/// The error reported when a node keeps failing after its replans: every failure, in order.
fn error_chain(node: &NodeState) -> hermes_proto::Error {
    let last = node.errors.last().cloned().unwrap_or_default();
    let steps: Vec<String> = node
        .errors
        .iter()
        .enumerate()
        .map(|(i, e)| format!("{}) {}: {}", i + 1, e.code, e.message))
        .collect();
    let mut error = wire_error(
        ErrorCode::parse(&last.code).unwrap_or(ErrorCode::Internal),
        format!(
            "node `{}` failed {} times and was replanned {} times: {}",
            node.node_id,
            node.errors.len(),
            node.replans,
            steps.join("; ")
        ),
    );
    error.node_id = node.node_id.clone();
    error
}

/// Asks the planner to replace a failed node and its dependents; completed nodes stay.
fn request_replan(
    state: &mut GoalState,
    index: usize,
    error: hermes_proto::Error,
    now_ms: u64,
    effects: &mut Effects,
) {
    let node_id = state.nodes[index].node_id.clone();
    {
        let node = &mut state.nodes[index];
        node.status = NodeStatus::Failed as i32;
        node.error = Some(error.clone());
        node.finished_unix_ms = now_ms;
    }
    let n = state.nodes[index].replans + 1;
    let request_id = format!("{}:replan:{node_id}:{n}", state.goal_id);
    let plan = state.plan.clone().unwrap_or_default();
    let completed = state
        .nodes
        .iter()
        .filter(|n| n.status == NodeStatus::Succeeded as i32)
        .map(|n| CompletedNode {
            node_id: n.node_id.clone(),
            task_type: plan
                .nodes
                .iter()
                .find(|p| p.id == n.node_id)
                .map(|p| p.task_type.clone())
                .unwrap_or_default(),
            output_summary: hermes_core::topology::truncate_for_message(&n.output_json),
        })
        .collect();
    let previous_errors = state.nodes[index].errors.iter().rev().skip(1).rev().cloned().collect();
    state.status = GoalStatus::Replanning as i32;
    state.plan_request_id = request_id.clone();
    effects.event(
        &state.goal_id.clone(),
        now_ms,
        Kind::PlanRequested(PlanRequested {
            request_id: request_id.clone(),
            failed_node_id: node_id.clone(),
        }),
    );
    effects.plan_requests.push(PlanRequest {
        goal_id: state.goal_id.clone(),
        request_id,
        goal_text: state.spec.as_ref().map(|s| s.text.clone()).unwrap_or_default(),
        session_id: state.spec.as_ref().map(|s| s.session_id.clone()).unwrap_or_default(),
        replan: Some(ReplanContext {
            current_plan: Some(plan),
            failed_node_id: node_id,
            error: Some(error),
            previous_errors,
            completed,
        }),
    });
}

/// Starts a goal given as text: the planner is asked for a plan.
pub fn start_planning(state: &mut GoalState, now_ms: u64, effects: &mut Effects) {
    let request_id = format!("{}:plan", state.goal_id);
    state.status = GoalStatus::Planning as i32;
    state.plan_request_id = request_id.clone();
    effects.event(
        &state.goal_id.clone(),
        now_ms,
        Kind::PlanRequested(PlanRequested { request_id: request_id.clone(), failed_node_id: String::new() }),
    );
    effects.plan_requests.push(PlanRequest {
        goal_id: state.goal_id.clone(),
        request_id,
        goal_text: state.spec.as_ref().map(|s| s.text.clone()).unwrap_or_default(),
        session_id: state.spec.as_ref().map(|s| s.session_id.clone()).unwrap_or_default(),
        replan: None,
    });
}

/// Whether the goal waits on exactly this plan request.
pub fn awaits_plan(state: &GoalState, request_id: &str) -> bool {
    (state.status == GoalStatus::Planning as i32 || state.status == GoalStatus::Replanning as i32)
        && state.plan_request_id == request_id
}

/// Applies the planner's first plan, already validated, and dispatches its ready nodes.
pub fn apply_plan(
    state: &mut GoalState,
    request_id: &str,
    plan: TaskPlan,
    groups: Vec<Vec<String>>,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    if state.status != GoalStatus::Planning as i32 || state.plan_request_id != request_id {
        return Applied::Stale;
    }
    state.nodes = initial_nodes(&plan);
    state.plan = Some(plan.clone());
    state.status = GoalStatus::Running as i32;
    state.plan_request_id.clear();
    effects.event(
        &state.goal_id.clone(),
        now_ms,
        Kind::PlanCreated(PlanCreated {
            plan: Some(plan),
            groups: groups.into_iter().map(|node_ids| ParallelGroup { node_ids }).collect(),
        }),
    );
    dispatch_ready(state, limits, now_ms, effects);
    Applied::Changed
}

/// Applies a replan: the new plan must keep every succeeded node exactly as it was. Nodes that
/// are new or changed start over; nodes still running and unchanged keep running.
pub fn apply_replan(
    state: &mut GoalState,
    request_id: &str,
    plan: TaskPlan,
    reasoning: String,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> Result<Applied, TransitionError> {
    if state.status != GoalStatus::Replanning as i32 || state.plan_request_id != request_id {
        return Ok(Applied::Stale);
    }
    let old_plan = state.plan.clone().unwrap_or_default();
    let failed =
        state.nodes.iter().find(|n| n.status == NodeStatus::Failed as i32).map(|n| n.node_id.clone());
    let failed_id = failed.unwrap_or_default();
    for done in state.nodes.iter().filter(|n| n.status == NodeStatus::Succeeded as i32) {
        let before = old_plan.nodes.iter().find(|n| n.id == done.node_id);
        let after = plan.nodes.iter().find(|n| n.id == done.node_id);
        if before != after {
            return Err(TransitionError::ReplanChangesCompleted(done.node_id.clone()));
        }
    }
    if !plan.nodes.iter().any(|n| n.id == failed_id) {
        return Err(TransitionError::ReplanMissesFailed(failed_id));
    }
    let mut nodes = Vec::with_capacity(plan.nodes.len());
    let mut added = Vec::new();
    for new in &plan.nodes {
        let old_def = old_plan.nodes.iter().find(|n| n.id == new.id);
        let old_state = state.nodes.iter().find(|n| n.node_id == new.id);
        match (old_def, old_state) {
            (Some(def), Some(node))
                if def == new
                    && node.status != NodeStatus::Failed as i32
                    && node.status != NodeStatus::Skipped as i32 =>
            {
                nodes.push(node.clone());
            }
            _ => {
                added.push(new.id.clone());
                let mut fresh = NodeState {
                    node_id: new.id.clone(),
                    status: NodeStatus::Pending as i32,
                    ..Default::default()
                };
                if let Some(node) = old_state {
                    fresh.replans = node.replans + u32::from(node.node_id == failed_id);
                    fresh.errors = node.errors.clone();
                    fresh.attempt = node.attempt;
                }
                nodes.push(fresh);
            }
        }
    }
    let removed: Vec<String> = old_plan
        .nodes
        .iter()
        .filter(|o| !plan.nodes.iter().any(|n| n.id == o.id))
        .map(|o| o.id.clone())
        .collect();
    state.nodes = nodes;
    state.plan = Some(plan.clone());
    state.status = GoalStatus::Running as i32;
    state.plan_request_id.clear();
    state.error = None;
    effects.event(
        &state.goal_id.clone(),
        now_ms,
        Kind::PlanPatched(PlanPatched {
            request_id: request_id.to_owned(),
            failed_node_id: failed_id,
            removed,
            added,
            plan: Some(plan),
            reasoning,
        }),
    );
    dispatch_ready(state, limits, now_ms, effects);
    complete_if_done(state, limits, now_ms, effects);
    Ok(Applied::Changed)
}

/// Ends a goal the planner says cannot be done with the available task types.
pub fn needs_input(
    state: &mut GoalState,
    request_id: &str,
    explanation: &str,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    if !awaits_plan(state, request_id) {
        return Applied::Stale;
    }
    let event = Kind::GoalNeedsInput(GoalNeedsInput { explanation: explanation.to_owned() });
    let error = wire_error(ErrorCode::FailedPrecondition, explanation);
    end_goal(state, GoalStatus::NeedsInput, error, event, now_ms, effects);
    Applied::Changed
}

/// Fails a goal whose plan request failed (PLAN_INVALID after the corrections, or a planner error).
pub fn plan_failed(
    state: &mut GoalState,
    request_id: &str,
    error: hermes_proto::Error,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    if !awaits_plan(state, request_id) {
        return Applied::Stale;
    }
    let event = Kind::GoalFailed(GoalFailed { error: Some(error.clone()) });
    end_goal(state, GoalStatus::Failed, error, event, now_ms, effects);
    Applied::Changed
}

/// Completes a summarizing goal with the summarizer's answer.
pub fn finish_summary(
    state: &mut GoalState,
    output_json: String,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    if state.status != GoalStatus::Summarizing as i32 {
        return Applied::Stale;
    }
    state.status = GoalStatus::Completed as i32;
    state.output_json = output_json.clone();
    state.updated_unix_ms = now_ms;
    effects.event(&state.goal_id.clone(), now_ms, Kind::GoalCompleted(GoalCompleted { output_json }));
    Applied::Changed
}

/// Fails a node and with it the goal; nodes not yet started are skipped.
fn fail_node(
    state: &mut GoalState,
    index: usize,
    error: hermes_proto::Error,
    now_ms: u64,
    effects: &mut Effects,
) {
    let node = &mut state.nodes[index];
    node.status = NodeStatus::Failed as i32;
    node.error = Some(error.clone());
    node.finished_unix_ms = now_ms;
    let event = Kind::GoalFailed(GoalFailed { error: Some(error.clone()) });
    end_goal(state, GoalStatus::Failed, error, event, now_ms, effects);
}

/// Ends the goal: nodes not started are skipped, nodes running are cancelled (with a finish time
/// and the reason; their agents are told to stop), and the terminal event is emitted.
fn end_goal(
    state: &mut GoalState,
    status: GoalStatus,
    error: hermes_proto::Error,
    event: Kind,
    now_ms: u64,
    effects: &mut Effects,
) {
    skip_pending(state);
    let why = match status {
        GoalStatus::Cancelled => format!("the goal was cancelled: {}", error.message),
        _ => format!("the goal ended before this node finished: {}", error.message),
    };
    for node in &mut state.nodes {
        if node.status == NodeStatus::Dispatched as i32 {
            node.status = NodeStatus::Cancelled as i32;
            node.finished_unix_ms = now_ms;
            node.error = Some(wire_error(ErrorCode::Cancelled, why.clone()));
            effects.stop_agents = true;
        }
    }
    state.status = status as i32;
    state.plan_request_id.clear();
    state.error = Some(error);
    state.updated_unix_ms = now_ms;
    effects.event(&state.goal_id.clone(), now_ms, event);
}

fn skip_pending(state: &mut GoalState) {
    for node in &mut state.nodes {
        if node.status == NodeStatus::Pending as i32 {
            node.status = NodeStatus::Skipped as i32;
        }
    }
}

fn complete_if_done(state: &mut GoalState, limits: Limits, now_ms: u64, effects: &mut Effects) {
    if state.status != GoalStatus::Running as i32
        || !state.nodes.iter().all(|n| n.status == NodeStatus::Succeeded as i32)
    {
        return;
    }
    let output = goal_output(state);
    if limits.summarizer && from_text(state) {
        // The raw outputs stay in `output_json` until the summarizer's answer replaces them.
        state.status = GoalStatus::Summarizing as i32;
        state.output_json = output;
        state.updated_unix_ms = now_ms;
        effects.summarize = true;
        return;
    }
    state.status = GoalStatus::Completed as i32;
    state.output_json = output.clone();
    state.updated_unix_ms = now_ms;
    effects.event(&state.goal_id.clone(), now_ms, Kind::GoalCompleted(GoalCompleted { output_json: output }));
}

/// The goal's answer: the output node's output, else the single sink's, else an object of all
/// sinks' outputs keyed by node id.
fn goal_output(state: &GoalState) -> String {
    let plan = state.plan.as_ref().expect("plan present");
    let output_of = |id: &str| {
        state.nodes.iter().find(|n| n.node_id == id).map(|n| n.output_json.clone()).unwrap_or_default()
    };
    if !plan.output_node.is_empty() {
        return output_of(&plan.output_node);
    }
    let sinks: Vec<&str> = plan
        .nodes
        .iter()
        .filter(|n| !plan.nodes.iter().any(|other| other.depends_on.contains(&n.id)))
        .map(|n| n.id.as_str())
        .collect();
    if let [only] = sinks.as_slice() {
        return output_of(only);
    }
    let object: serde_json::Map<String, Value> = sinks
        .iter()
        .map(|id| (id.to_string(), serde_json::from_str(&output_of(id)).unwrap_or(Value::Null)))
        .collect();
    Value::Object(object).to_string()
}

/// Cancels a running goal. Returns false when the goal had already ended.
pub fn cancel(state: &mut GoalState, reason: &str, now_ms: u64, effects: &mut Effects) -> bool {
    if is_terminal(state.status) {
        return false;
    }
    let event = Kind::GoalCancelled(GoalCancelled { reason: reason.to_owned() });
    end_goal(state, GoalStatus::Cancelled, wire_error(ErrorCode::Cancelled, reason), event, now_ms, effects);
    true
}

/// A fresh node table for a plan.
pub fn initial_nodes(plan: &hermes_proto::TaskPlan) -> Vec<NodeState> {
    plan.nodes
        .iter()
        .map(|n| NodeState {
            node_id: n.id.clone(),
            status: NodeStatus::Pending as i32,
            ..Default::default()
        })
        .collect()
}

/// A stable deduplication id for an event: the same transition recomputed after a CAS retry or a
/// crash publishes with the same id, so JetStream stores it once.
pub fn event_msg_id(event: &Event) -> String {
    let goal = &event.goal_id;
    match &event.kind {
        Some(Kind::GoalAccepted(_)) => format!("{goal}:accepted"),
        Some(Kind::PlanCreated(_)) => format!("{goal}:plan"),
        Some(Kind::TaskDispatched(e)) => format!("{goal}:dispatched:{}:{}", e.node_id, e.attempt),
        Some(Kind::TaskSucceeded(e)) => format!("{goal}:succeeded:{}:{}", e.node_id, e.attempt),
        Some(Kind::TaskFailed(e)) => format!("{goal}:failed:{}:{}", e.node_id, e.attempt),
        Some(Kind::TaskRetrying(e)) => format!("{goal}:retrying:{}:{}", e.node_id, e.next_attempt),
        Some(Kind::GoalCompleted(_)) => format!("{goal}:completed"),
        Some(Kind::GoalFailed(_)) => format!("{goal}:goal-failed"),
        Some(Kind::GoalCancelled(_)) => format!("{goal}:cancelled"),
        Some(Kind::ApprovalRequired(e)) => format!("{goal}:approval:{}", e.call_id),
        Some(Kind::ApprovalDecided(e)) => format!("{goal}:decided:{}", e.call_id),
        Some(Kind::PlanRequested(e)) => format!("{goal}:plan-requested:{}", e.request_id),
        Some(Kind::PlanPatched(e)) => format!("{goal}:plan-patched:{}", e.request_id),
        Some(Kind::GoalNeedsInput(_)) => format!("{goal}:needs-input"),
        Some(Kind::ToolCalled(e)) => {
            format!("{goal}:tool:{}:{}:{}:{}", e.node_id, e.attempt, e.step, e.index)
        }
        None => format!("{goal}:empty:{}", event.at_unix_ms),
    }
}

/// Whether an event ends the goal's event stream.
pub fn is_terminal_event(event: &Event) -> bool {
    matches!(
        event.kind,
        Some(Kind::GoalCompleted(_))
            | Some(Kind::GoalFailed(_))
            | Some(Kind::GoalCancelled(_))
            | Some(Kind::GoalNeedsInput(_))
    )
}

/// The index of `node_id` when the goal is running and the node waits on attempt `task_id`; any
/// other message about the node is stale.
fn current_attempt(state: &GoalState, node_id: &str, task_id: &str) -> Option<usize> {
    if is_terminal(state.status) {
        return None;
    }
    let index = state.nodes.iter().position(|n| n.node_id == node_id)?;
    let node = &state.nodes[index];
    (node.status == NodeStatus::Dispatched as i32 && node.task_id == task_id).then_some(index)
}

/// Publishes attempt `next_attempt` of a node, with its inputs resolved again.
fn redispatch(
    state: &mut GoalState,
    index: usize,
    next_attempt: u32,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) {
    let inputs_json = state.plan.as_ref().expect("plan present").nodes[index].inputs_json.clone();
    match resolve_inputs(state, &inputs_json) {
        Ok(inputs) => publish_attempt(state, index, next_attempt, inputs, limits, now_ms, effects),
        Err(e) => fail_node(state, index, e.to_wire(), now_ms, effects),
    }
}

/// Moves a node off an agent that went offline: its current attempt is superseded by a new one
/// (so a late result from that agent is recognised as stale) and dispatched afresh. Reassignment
/// is not a failure of the task and does not use up its retries.
pub fn reassign(
    state: &mut GoalState,
    node_id: &str,
    task_id: &str,
    why: &str,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    let Some(index) = current_attempt(state, node_id, task_id) else {
        return Applied::Stale;
    };
    let next_attempt = state.nodes[index].attempt + 1;
    let mut error = wire_error(ErrorCode::Unavailable, why);
    error.node_id = node_id.to_owned();
    effects.event(
        &state.goal_id.clone(),
        now_ms,
        Kind::TaskRetrying(TaskRetrying { node_id: node_id.to_owned(), next_attempt, error: Some(error) }),
    );
    redispatch(state, index, next_attempt, limits, now_ms, effects);
    Applied::Changed
}

/// How long after a node's deadline its attempt counts as timed out: room for a result that was
/// sent just before the deadline.
pub const NODE_DEADLINE_GRACE_MS: u64 = 5_000;

/// When the attempt of node `index` is due: its dispatch time plus the node's timeout, never
/// after the goal's deadline.
fn node_deadline(state: &GoalState, index: usize, limits: Limits) -> u64 {
    let plan_node = &state.plan.as_ref().expect("plan present").nodes[index];
    let timeout = if plan_node.timeout_ms > 0 { plan_node.timeout_ms } else { limits.node_timeout_ms };
    let due = state.nodes[index].dispatched_unix_ms + timeout;
    match state.deadline_unix_ms {
        0 => due,
        goal => due.min(goal),
    }
}

/// The next time [`expire`] has something to do for this goal, from its persisted deadlines;
/// `None` once the goal has ended.
pub fn next_deadline(state: &GoalState, limits: Limits) -> Option<u64> {
    if is_terminal(state.status) {
        return None;
    }
    let goal = (state.deadline_unix_ms != 0).then_some(state.deadline_unix_ms);
    let nodes = (0..state.nodes.len())
        .filter(|&i| state.plan.is_some() && state.nodes[i].status == NodeStatus::Dispatched as i32)
        .map(|i| node_deadline(state, i, limits) + NODE_DEADLINE_GRACE_MS);
    goal.into_iter().chain(nodes).min()
}

/// Applies the deadlines that have passed: a goal past its deadline fails with `TIMEOUT`
/// whatever state it is in (running, planning, summarizing); an attempt past its node's deadline
/// (plus the grace) fails with a retryable `TIMEOUT`, as if its agent had reported it, so it is
/// retried or fails the goal by the node's policy. A lost task (its agent died, or a dispatcher
/// died before publishing it) therefore never leaves a goal stuck. Nodes for which
/// `waiting_on_human` is true are left alone: their approval timeout governs them.
pub fn expire(
    state: &mut GoalState,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
    waiting_on_human: &dyn Fn(&str) -> bool,
) -> Applied {
    if is_terminal(state.status) {
        return Applied::Stale;
    }
    if state.deadline_unix_ms != 0 && now_ms >= state.deadline_unix_ms {
        let budget_s = state.deadline_unix_ms.saturating_sub(state.created_unix_ms) / 1000;
        let error = wire_error(
            ErrorCode::Timeout,
            format!("the goal did not finish within its {budget_s} s deadline"),
        );
        let event = Kind::GoalFailed(GoalFailed { error: Some(error.clone()) });
        for node in &mut state.nodes {
            if node.status == NodeStatus::Dispatched as i32 {
                node.status = NodeStatus::Failed as i32;
                node.error = Some(error.clone());
                node.finished_unix_ms = now_ms;
            }
        }
        end_goal(state, GoalStatus::Failed, error, event, now_ms, effects);
        return Applied::Changed;
    }
    if state.plan.is_none() {
        return Applied::Stale;
    }
    let overdue: Vec<usize> = (0..state.nodes.len())
        .filter(|&i| {
            state.nodes[i].status == NodeStatus::Dispatched as i32
                && now_ms >= node_deadline(state, i, limits) + NODE_DEADLINE_GRACE_MS
                && !waiting_on_human(&state.nodes[i].node_id)
        })
        .collect();
    let mut changed = Applied::Stale;
    for index in overdue {
        let node = &state.nodes[index];
        let waited_s = now_ms.saturating_sub(node.dispatched_unix_ms) / 1000;
        let result = TaskResult {
            goal_id: state.goal_id.clone(),
            node_id: node.node_id.clone(),
            task_id: node.task_id.clone(),
            attempt: node.attempt,
            status: TaskStatus::Failed as i32,
            agent_id: node.agent_id.clone(),
            error: Some(wire_error(
                ErrorCode::Timeout,
                format!(
                    "no result for attempt {} within the node's deadline ({waited_s} s after dispatch)",
                    node.attempt
                ),
            )),
            ..Default::default()
        };
        if apply_result(state, &result, limits, now_ms, effects) == Applied::Changed {
            changed = Applied::Changed;
        }
    }
    changed
}

/// Fails a node that is still waiting on the attempt `task_id`, with `error`.
pub fn fail_attempt(
    state: &mut GoalState,
    node_id: &str,
    task_id: &str,
    mut error: hermes_proto::Error,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    let Some(index) = current_attempt(state, node_id, task_id) else {
        return Applied::Stale;
    };
    error.node_id = node_id.to_owned();
    fail_node(state, index, error, now_ms, effects);
    Applied::Changed
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_proto::{TaskNode, TaskPlan};
    use serde_json::json;

    const LIMITS: Limits = Limits {
        node_timeout_ms: 1000,
        planner: false,
        summarizer: false,
        prices: Prices { input_per_mtok: 0.0, output_per_mtok: 0.0 },
    };

    /// A running goal over `plan`, nothing dispatched yet.
    fn running(plan: TaskPlan) -> GoalState {
        GoalState {
            goal_id: "g-1".into(),
            status: GoalStatus::Running as i32,
            nodes: initial_nodes(&plan),
            plan: Some(plan),
            ..Default::default()
        }
    }

    fn state() -> GoalState {
        let plan = TaskPlan {
            nodes: vec![
                TaskNode {
                    id: "a".into(),
                    task_type: "t".into(),
                    inputs_json: "{}".into(),
                    ..Default::default()
                },
                TaskNode {
                    id: "b".into(),
                    task_type: "t".into(),
                    inputs_json: "{}".into(),
                    ..Default::default()
                },
                TaskNode {
                    id: "c".into(),
                    task_type: "t".into(),
                    inputs_json: json!({"x": {"$ref": "a.v"}, "y": {"$ref": "b.v"}}).to_string(),
                    depends_on: vec!["a".into(), "b".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        running(plan)
    }

    fn ok(node: &str, attempt: u32, output: Value) -> TaskResult {
        TaskResult {
            goal_id: "g-1".into(),
            node_id: node.into(),
            task_id: format!("g-1.{node}.{attempt}"),
            attempt,
            status: TaskStatus::Succeeded as i32,
            output_json: output.to_string(),
            ..Default::default()
        }
    }

    fn failed(node: &str, attempt: u32, code: ErrorCode) -> TaskResult {
        TaskResult {
            status: TaskStatus::Failed as i32,
            output_json: String::new(),
            error: Some(wire_error(code, "boom")),
            ..ok(node, attempt, Value::Null)
        }
    }

    #[test]
    fn independent_nodes_dispatch_together_and_refs_resolve() {
        let mut s = state();
        let mut fx = Effects::default();
        dispatch_ready(&mut s, LIMITS, 10, &mut fx);
        let ids: Vec<&str> = fx.tasks.iter().map(|t| t.node_id.as_str()).collect();
        assert_eq!(ids, vec!["a", "b"]);
        assert_eq!(fx.tasks[0].task_id, "g-1.a.1");

        let mut fx = Effects::default();
        assert_eq!(apply_result(&mut s, &ok("a", 1, json!({"v": 2})), LIMITS, 11, &mut fx), Applied::Changed);
        assert!(fx.tasks.is_empty());
        let mut fx = Effects::default();
        apply_result(&mut s, &ok("b", 1, json!({"v": 3})), LIMITS, 12, &mut fx);
        assert_eq!(fx.tasks.len(), 1);
        assert_eq!(serde_json::from_str::<Value>(&fx.tasks[0].inputs_json).unwrap(), json!({"x": 2, "y": 3}));

        let mut fx = Effects::default();
        apply_result(&mut s, &ok("c", 1, json!({"done": true})), LIMITS, 13, &mut fx);
        assert_eq!(s.status, GoalStatus::Completed as i32);
        assert_eq!(s.output_json, json!({"done": true}).to_string());
        assert!(is_terminal_event(fx.events.last().unwrap()));
    }

    #[test]
    fn duplicate_and_stale_results_are_ignored() {
        let mut s = state();
        dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
        apply_result(&mut s, &ok("a", 1, json!({"v": 1})), LIMITS, 11, &mut Effects::default());
        let mut fx = Effects::default();
        assert_eq!(apply_result(&mut s, &ok("a", 1, json!({"v": 9})), LIMITS, 12, &mut fx), Applied::Stale);
        assert!(fx.events.is_empty());
        assert_eq!(apply_result(&mut s, &ok("b", 7, json!({})), LIMITS, 12, &mut fx), Applied::Stale);
    }

    #[test]
    fn retryable_failures_retry_then_fail_the_goal() {
        let mut s = state();
        dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
        let mut fx = Effects::default();
        apply_result(&mut s, &failed("a", 1, ErrorCode::Timeout), LIMITS, 11, &mut fx);
        assert_eq!(fx.tasks[0].task_id, "g-1.a.2");
        apply_result(&mut s, &failed("a", 2, ErrorCode::Timeout), LIMITS, 12, &mut Effects::default());
        let mut fx = Effects::default();
        apply_result(&mut s, &failed("a", 3, ErrorCode::Timeout), LIMITS, 13, &mut fx);
        assert!(fx.tasks.is_empty());
        assert_eq!(s.status, GoalStatus::Failed as i32);
        assert_eq!(s.nodes[2].status, NodeStatus::Skipped as i32);
    }

    #[test]
    fn tool_errors_are_not_retried() {
        let mut s = state();
        dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
        let mut fx = Effects::default();
        apply_result(&mut s, &failed("b", 1, ErrorCode::ToolError), LIMITS, 11, &mut fx);
        assert!(fx.tasks.is_empty());
        assert_eq!(s.status, GoalStatus::Failed as i32);
        assert_eq!(s.error.as_ref().unwrap().node_id, "b");
    }

    #[test]
    fn events_are_numbered_on_from_the_goal_s_last_seq() {
        let mut s = running(TaskPlan {
            nodes: vec![TaskNode { id: "a".into(), task_type: "t".into(), ..Default::default() }],
            ..Default::default()
        });
        let mut fx = Effects::default();
        dispatch_ready(&mut s, LIMITS, 1, &mut fx);
        fx.number(&mut s);
        let first: Vec<u64> = fx.events.iter().map(|e| e.seq).collect();
        assert_eq!(first, (1..=fx.events.len() as u64).collect::<Vec<_>>());
        let mut fx = Effects::default();
        apply_result(&mut s, &ok("a", 1, json!({})), LIMITS, 2, &mut fx);
        fx.number(&mut s);
        let next = first.len() as u64 + 1;
        assert_eq!(fx.events.first().map(|e| e.seq), Some(next));
        assert_eq!(s.event_seq, first.len() as u64 + fx.events.len() as u64);
    }

    #[test]
    fn cancel_skips_pending_nodes_once() {
        let plan = TaskPlan {
            nodes: vec![
                TaskNode { id: "a".into(), task_type: "t".into(), ..Default::default() },
                TaskNode {
                    id: "b".into(),
                    task_type: "t".into(),
                    depends_on: vec!["a".into()],
                    ..Default::default()
                },
            ],
            ..Default::default()
        };
        let mut s = running(plan);
        dispatch_ready(&mut s, LIMITS, 1, &mut Effects::default());
        let mut fx = Effects::default();
        assert!(cancel(&mut s, "user asked", 2, &mut fx));
        assert_eq!(s.status, GoalStatus::Cancelled as i32);
        // The running node is cancelled, with a finish time and why; its agent is told.
        assert_eq!(s.nodes[0].status, NodeStatus::Cancelled as i32);
        assert_eq!(s.nodes[0].finished_unix_ms, 2);
        assert_eq!(s.nodes[0].error.as_ref().unwrap().code, "CANCELLED");
        assert!(s.nodes[0].error.as_ref().unwrap().message.contains("user asked"));
        assert!(fx.stop_agents);
        assert_eq!(s.nodes[1].status, NodeStatus::Skipped as i32);
        assert!(is_terminal_event(&fx.events[0]));
        assert!(!cancel(&mut s, "again", 3, &mut Effects::default()));
        // A late result for the running node is ignored.
        let late = ok("a", 1, json!({}));
        assert_eq!(apply_result(&mut s, &late, LIMITS, 4, &mut Effects::default()), Applied::Stale);
    }

    #[test]
    fn reassignment_supersedes_the_attempt_and_late_results_are_stale() {
        let plan = TaskPlan {
            nodes: vec![TaskNode { id: "a".into(), task_type: "t".into(), ..Default::default() }],
            ..Default::default()
        };
        let mut s = running(plan);
        let limits = LIMITS;
        dispatch_ready(&mut s, limits, 1, &mut Effects::default());
        let mut fx = Effects::default();
        assert_eq!(
            reassign(&mut s, "a", "g-1.a.1", "agent x went offline", limits, 2, &mut fx),
            Applied::Changed
        );
        assert_eq!(fx.tasks[0].task_id, "g-1.a.2");
        // The same notice twice does nothing the second time.
        assert_eq!(
            reassign(&mut s, "a", "g-1.a.1", "again", limits, 3, &mut Effects::default()),
            Applied::Stale
        );
        let late = ok("a", 1, json!({}));
        assert_eq!(apply_result(&mut s, &late, limits, 4, &mut Effects::default()), Applied::Stale);
        let err = wire_error(ErrorCode::NoCapableAgent, "none");
        assert_eq!(
            fail_attempt(&mut s, "a", "g-1.a.1", err.clone(), 5, &mut Effects::default()),
            Applied::Stale
        );
        assert_eq!(fail_attempt(&mut s, "a", "g-1.a.2", err, 5, &mut Effects::default()), Applied::Changed);
        assert_eq!(s.status, GoalStatus::Failed as i32);
    }

    #[test]
    fn an_overdue_attempt_times_out_and_is_retried_and_a_goal_past_its_deadline_fails() {
        let mut s = state();
        s.deadline_unix_ms = 100_000;
        let mut fx = Effects::default();
        dispatch_ready(&mut s, LIMITS, 10, &mut fx);
        // Node timeout 1 s (LIMITS) plus the grace: nothing is due before.
        let due = 10 + 1000 + NODE_DEADLINE_GRACE_MS;
        assert_eq!(next_deadline(&s, LIMITS), Some(due));
        let never = |_: &str| false;
        assert_eq!(expire(&mut s, LIMITS, due - 1, &mut Effects::default(), &never), Applied::Stale);
        // "b" waits on a person; "a" is retried as attempt 2 with a TIMEOUT.
        let mut fx = Effects::default();
        assert_eq!(expire(&mut s, LIMITS, due, &mut fx, &|node| node == "b"), Applied::Changed);
        assert_eq!(s.nodes[0].attempt, 2);
        assert_eq!(s.nodes[0].errors[0].code, "TIMEOUT");
        assert_eq!(s.nodes[1].attempt, 1);
        assert_eq!(fx.tasks.len(), 1);
        assert!(fx.events.iter().any(|e| matches!(e.kind, Some(Kind::TaskRetrying(_)))));
        // The late result of attempt 1 is stale now.
        assert_eq!(
            apply_result(&mut s, &ok("a", 1, json!({"v": 1})), LIMITS, due + 1, &mut Effects::default()),
            Applied::Stale
        );
        // Past the goal's deadline everything ends with TIMEOUT.
        let mut fx = Effects::default();
        assert_eq!(expire(&mut s, LIMITS, 100_000, &mut fx, &never), Applied::Changed);
        assert_eq!(s.status, GoalStatus::Failed as i32);
        assert_eq!(s.error.as_ref().unwrap().code, "TIMEOUT");
        assert!(
            s.nodes
                .iter()
                .all(|n| n.status != NodeStatus::Dispatched as i32 && n.status != NodeStatus::Pending as i32)
        );
        assert!(matches!(fx.events.last().unwrap().kind, Some(Kind::GoalFailed(_))));
        assert_eq!(next_deadline(&s, LIMITS), None);
    }

    // ---- Table tests of each transition: budget, cancel, planning and stale plans, replan,
    // summarizing, expiry, takeover. Each starts from a goal state, applies one transition and
    // checks the state and the effects.

    fn kinds(fx: &Effects) -> Vec<&'static str> {
        fx.events
            .iter()
            .map(|e| match &e.kind {
                Some(Kind::PlanRequested(_)) => "plan_requested",
                Some(Kind::PlanCreated(_)) => "plan_created",
                Some(Kind::TaskDispatched(_)) => "dispatched",
                Some(Kind::TaskSucceeded(_)) => "succeeded",
                Some(Kind::TaskFailed(_)) => "task_failed",
                Some(Kind::TaskRetrying(_)) => "retrying",
                Some(Kind::GoalCompleted(_)) => "completed",
                Some(Kind::GoalFailed(_)) => "goal_failed",
                Some(Kind::GoalCancelled(_)) => "cancelled",
                Some(Kind::GoalNeedsInput(_)) => "needs_input",
                _ => "other",
            })
            .collect()
    }

    fn node_statuses(s: &GoalState) -> Vec<i32> {
        s.nodes.iter().map(|n| n.status).collect()
    }

    fn text(mut s: GoalState) -> GoalState {
        s.spec = Some(hermes_proto::GoalSpec { text: "sum the sales".into(), ..Default::default() });
        s
    }

    fn one_node() -> GoalState {
        running(TaskPlan {
            nodes: vec![TaskNode {
                id: "a".into(),
                task_type: "t".into(),
                inputs_json: "{}".into(),
                ..Default::default()
            }],
            ..Default::default()
        })
    }

    #[test]
    fn budgets_end_the_goal_once_spent_and_not_before() {
        let priced = Limits { prices: Prices { input_per_mtok: 1.0, output_per_mtok: 1.0 }, ..LIMITS };
        // (max tokens, max cost in USD, input tokens, output tokens, the goal fails)
        let cases = [
            (100, 0.0, 60, 30, false),
            (100, 0.0, 60, 50, true),
            (0, 0.0001, 50, 40, false),
            (0, 0.0001, 80, 40, true),
            (0, 0.0, 1_000_000, 1_000_000, false),
        ];
        for (max_tokens, max_cost_usd, input, output, fails) in cases {
            let mut s = state();
            s.spec = Some(hermes_proto::GoalSpec { max_tokens, max_cost_usd, ..Default::default() });
            dispatch_ready(&mut s, priced, 10, &mut Effects::default());
            let mut result = ok("a", 1, json!({"v": 1}));
            result.tokens = Some(TokenUsage { input_tokens: input, output_tokens: output });
            let mut fx = Effects::default();
            apply_result(&mut s, &result, priced, 11, &mut fx);
            let case = format!("{max_tokens} tokens / ${max_cost_usd}, used {input}+{output}");
            assert_eq!(s.status == GoalStatus::Failed as i32, fails, "{case}");
            assert_eq!(
                s.tokens.as_ref().map(|t| t.input_tokens + t.output_tokens),
                Some(input + output),
                "{case}"
            );
            if fails {
                assert_eq!(s.error.as_ref().unwrap().code, ErrorCode::BudgetExceeded.as_str(), "{case}");
                assert_eq!(kinds(&fx).last(), Some(&"goal_failed"), "{case}");
                let expected =
                    [NodeStatus::Succeeded, NodeStatus::Cancelled, NodeStatus::Skipped].map(|n| n as i32);
                assert_eq!(node_statuses(&s), expected, "{case}");
            } else {
                assert_eq!(s.status, GoalStatus::Running as i32, "{case}");
            }
        }
    }

    #[test]
    fn cancel_cancels_running_nodes_skips_the_rest_and_happens_once() {
        let mut s = state();
        dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
        apply_result(&mut s, &ok("a", 1, json!({"v": 1})), LIMITS, 11, &mut Effects::default());
        let mut fx = Effects::default();
        assert!(cancel(&mut s, "the user asked", 20, &mut fx));
        assert_eq!(s.status, GoalStatus::Cancelled as i32);
        let expected = [NodeStatus::Succeeded, NodeStatus::Cancelled, NodeStatus::Skipped].map(|n| n as i32);
        assert_eq!(node_statuses(&s), expected);
        assert_eq!(s.nodes[1].finished_unix_ms, 20);
        assert!(fx.stop_agents, "agents running the cancelled node are told to stop");
        assert_eq!(kinds(&fx), ["cancelled"]);
        for _ in 0..2 {
            let mut fx = Effects::default();
            assert!(!cancel(&mut s, "again", 30, &mut fx));
            assert!(fx.events.is_empty() && fx.tasks.is_empty());
        }
        assert_eq!(next_deadline(&s, LIMITS), None);
    }

    #[test]
    fn planning_takes_only_the_answer_to_its_own_request() {
        let mut s = text(GoalState {
            goal_id: "g-1".into(),
            status: GoalStatus::Running as i32,
            ..Default::default()
        });
        let mut fx = Effects::default();
        start_planning(&mut s, 1, &mut fx);
        assert_eq!(s.status, GoalStatus::Planning as i32);
        assert_eq!(kinds(&fx), ["plan_requested"]);
        assert_eq!(fx.plan_requests.len(), 1);
        let request = s.plan_request_id.clone();
        assert!(awaits_plan(&s, &request) && !awaits_plan(&s, "g-1:other"));
        let plan = state().plan.unwrap();
        // Answers to another request change nothing, whatever they say.
        let mut fx = Effects::default();
        let error = wire_error(ErrorCode::PlanInvalid, "no plan");
        let stale = [
            apply_plan(&mut s, "g-1:other", plan.clone(), vec![], LIMITS, 2, &mut fx),
            needs_input(&mut s, "g-1:other", "which month?", 2, &mut fx),
            plan_failed(&mut s, "g-1:other", error, 2, &mut fx),
        ];
        assert_eq!(stale, [Applied::Stale, Applied::Stale, Applied::Stale]);
        assert!(fx.events.is_empty() && fx.tasks.is_empty());
        assert_eq!(s.status, GoalStatus::Planning as i32);
        // Its own answer starts the goal.
        let mut fx = Effects::default();
        let groups = vec![vec!["a".to_owned(), "b".to_owned()], vec!["c".to_owned()]];
        assert_eq!(apply_plan(&mut s, &request, plan.clone(), groups, LIMITS, 3, &mut fx), Applied::Changed);
        assert_eq!(s.status, GoalStatus::Running as i32);
        assert_eq!(kinds(&fx), ["plan_created", "dispatched", "dispatched"]);
        // A second answer to the same request comes too late.
        assert_eq!(
            apply_plan(&mut s, &request, plan, vec![], LIMITS, 4, &mut Effects::default()),
            Applied::Stale
        );
    }

    #[test]
    fn a_planner_ends_a_goal_with_a_question_or_an_error() {
        // (what the planner said, the goal's status after, its terminal event)
        let cases = [
            ("question", GoalStatus::NeedsInput, "needs_input"),
            ("error", GoalStatus::Failed, "goal_failed"),
        ];
        for (said, status, event) in cases {
            let mut s = text(GoalState {
                goal_id: "g-1".into(),
                status: GoalStatus::Running as i32,
                ..Default::default()
            });
            start_planning(&mut s, 1, &mut Effects::default());
            let request = s.plan_request_id.clone();
            let mut fx = Effects::default();
            let applied = match said {
                "question" => needs_input(&mut s, &request, "which month?", 5, &mut fx),
                _ => plan_failed(
                    &mut s,
                    &request,
                    wire_error(ErrorCode::PlanInvalid, "no valid plan"),
                    5,
                    &mut fx,
                ),
            };
            assert_eq!(applied, Applied::Changed, "{said}");
            assert_eq!(s.status, status as i32, "{said}");
            assert_eq!(kinds(&fx).last(), Some(&event), "{said}");
            assert!(is_terminal(s.status) && next_deadline(&s, LIMITS).is_none(), "{said}");
        }
    }

    #[test]
    fn a_failed_node_is_replanned_only_for_text_goals_with_a_planner_and_only_so_often() {
        let planner = Limits { planner: true, ..LIMITS };
        // (given as text, a planner serves, replans already spent, the goal's status after)
        let cases = [
            (true, true, 0, GoalStatus::Replanning),
            (true, true, MAX_REPLANS, GoalStatus::Failed),
            (false, true, 0, GoalStatus::Failed),
            (true, false, 0, GoalStatus::Failed),
        ];
        for (is_text, serves, replans, after) in cases {
            let limits = if serves { planner } else { LIMITS };
            let mut s = if is_text { text(state()) } else { state() };
            dispatch_ready(&mut s, limits, 10, &mut Effects::default());
            s.nodes[0].replans = replans;
            let mut fx = Effects::default();
            apply_result(&mut s, &failed("a", 1, ErrorCode::ToolError), limits, 11, &mut fx);
            let case = format!("text {is_text}, planner {serves}, replans {replans}");
            assert_eq!(s.status, after as i32, "{case}");
            assert_eq!(fx.plan_requests.len(), usize::from(after == GoalStatus::Replanning), "{case}");
            if after == GoalStatus::Failed {
                assert_eq!(s.error.as_ref().unwrap().node_id, "a", "{case}");
                assert_eq!(kinds(&fx).last(), Some(&"goal_failed"), "{case}");
            }
        }
    }

    #[test]
    fn a_text_goal_with_a_summarizer_completes_with_its_answer() {
        let summarizer = Limits { summarizer: true, ..LIMITS };
        // (given as text, a summarizer serves, summarizing before it completes)
        for (is_text, serves, summarizes) in [(true, true, true), (false, true, false), (true, false, false)]
        {
            let limits = if serves { summarizer } else { LIMITS };
            let mut s = if is_text { text(one_node()) } else { one_node() };
            dispatch_ready(&mut s, limits, 10, &mut Effects::default());
            let mut fx = Effects::default();
            apply_result(&mut s, &ok("a", 1, json!({"total": 7})), limits, 11, &mut fx);
            let case = format!("text {is_text}, summarizer {serves}");
            assert_eq!(fx.summarize, summarizes, "{case}");
            if summarizes {
                assert_eq!(s.status, GoalStatus::Summarizing as i32, "{case}");
                assert!(!kinds(&fx).contains(&"completed"), "{case}");
                let mut fx = Effects::default();
                let answer = json!("The total is 7.").to_string();
                assert_eq!(finish_summary(&mut s, answer.clone(), 12, &mut fx), Applied::Changed);
                assert_eq!(
                    (s.status, s.output_json.as_str()),
                    (GoalStatus::Completed as i32, answer.as_str())
                );
                assert_eq!(kinds(&fx), ["completed"]);
            } else {
                assert_eq!(s.status, GoalStatus::Completed as i32, "{case}");
            }
            // An answer for a goal that is not summarizing is stale.
            assert_eq!(
                finish_summary(&mut s, "late".into(), 13, &mut Effects::default()),
                Applied::Stale,
                "{case}"
            );
        }
    }

    #[test]
    fn deadlines_time_out_attempts_then_the_goal() {
        let fresh = || {
            let mut s = state();
            s.deadline_unix_ms = 20_000;
            dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
            s
        };
        let node_due = 10 + LIMITS.node_timeout_ms + NODE_DEADLINE_GRACE_MS;
        assert_eq!(next_deadline(&fresh(), LIMITS), Some(node_due));
        // (now, nodes waiting on a human, the goal's status after, attempts of a and b after)
        let cases: [(u64, &[&str], GoalStatus, [u32; 2]); 4] = [
            (node_due - 1, &[], GoalStatus::Running, [1, 1]),
            (node_due, &[], GoalStatus::Running, [2, 2]),
            (node_due, &["a"], GoalStatus::Running, [1, 2]),
            (20_000, &[], GoalStatus::Failed, [1, 1]),
        ];
        for (now, human, status, attempts) in cases {
            let mut s = fresh();
            let mut fx = Effects::default();
            let applied = expire(&mut s, LIMITS, now, &mut fx, &|node| human.contains(&node));
            let case = format!("at {now}, waiting on a human: {human:?}");
            assert_eq!(s.status, status as i32, "{case}");
            assert_eq!([s.nodes[0].attempt, s.nodes[1].attempt], attempts, "{case}");
            assert_eq!(applied == Applied::Changed, now >= node_due, "{case}");
            if status == GoalStatus::Failed {
                assert_eq!(s.error.as_ref().unwrap().code, ErrorCode::Timeout.as_str(), "{case}");
                assert_eq!(s.nodes[0].status, NodeStatus::Failed as i32, "{case}");
                assert_eq!(s.nodes[2].status, NodeStatus::Skipped as i32, "{case}");
                assert_eq!(
                    expire(&mut s, LIMITS, now + 1, &mut Effects::default(), &|_| false),
                    Applied::Stale
                );
            }
        }
    }

    #[test]
    fn reassignment_moves_the_current_attempt_only() {
        let mut s = state();
        dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
        // (node, task id, applied)
        let cases = [
            ("a", "g-1.a.9", Applied::Stale),
            ("zz", "g-1.zz.1", Applied::Stale),
            ("a", "g-1.a.1", Applied::Changed),
        ];
        for (node, task, expected) in cases {
            let mut fx = Effects::default();
            assert_eq!(
                reassign(&mut s, node, task, "agent x went offline", LIMITS, 11, &mut fx),
                expected,
                "{task}"
            );
            if expected == Applied::Changed {
                assert_eq!(kinds(&fx)[0], "retrying");
                assert_eq!(fx.tasks.iter().map(|t| t.task_id.as_str()).collect::<Vec<_>>(), ["g-1.a.2"]);
            } else {
                assert!(fx.events.is_empty() && fx.tasks.is_empty(), "{task}");
            }
        }
        // The moved attempt's late result and a second move of it are stale.
        assert_eq!(
            apply_result(&mut s, &ok("a", 1, json!({"v": 1})), LIMITS, 12, &mut Effects::default()),
            Applied::Stale
        );
        assert_eq!(
            reassign(&mut s, "a", "g-1.a.1", "again", LIMITS, 12, &mut Effects::default()),
            Applied::Stale
        );
        assert_eq!(s.status, GoalStatus::Running as i32);
    }

    #[test]
    fn failing_an_attempt_fails_the_goal_only_for_the_current_attempt() {
        for (task, fails) in [("g-1.b.2", false), ("g-1.b.1", true)] {
            let mut s = state();
            dispatch_ready(&mut s, LIMITS, 10, &mut Effects::default());
            let mut fx = Effects::default();
            let error = wire_error(ErrorCode::PoisonMessage, "delivered 5 times");
            let applied = fail_attempt(&mut s, "b", task, error, 11, &mut fx);
            assert_eq!(applied == Applied::Changed, fails, "{task}");
            assert_eq!(s.status == GoalStatus::Failed as i32, fails, "{task}");
            if fails {
                assert_eq!(s.error.as_ref().unwrap().node_id, "b");
                let expected =
                    [NodeStatus::Cancelled, NodeStatus::Failed, NodeStatus::Skipped].map(|n| n as i32);
                assert_eq!(node_statuses(&s), expected);
            }
        }
    }
}
