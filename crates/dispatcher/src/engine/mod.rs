//! Goal state transitions as pure functions over `GoalState`. Each returns the effects (tasks to
//! publish, events to emit) that must follow once the new state is committed to KV by
//! compare-and-set. Keeping this free of I/O makes every transition unit-testable and lets a
//! retried CAS simply recompute the effects.
//!
//! One file per kind of transition:
//! - `dispatch`: ready nodes and the task of each attempt ([`dispatch_ready`], [`in_flight_tasks`]);
//! - `results`: task results ([`apply_result`]);
//! - `plan`: plans, replans and stale plans ([`apply_plan`], [`apply_replan`], [`awaits_plan`]);
//! - `budget`: tokens and cost ([`charge`]);
//! - `summary`: the written answer ([`finish_summary`]);
//! - `deadlines`: goal and attempt deadlines ([`expire`], [`next_deadline`]);
//! - `cancel`: how a goal ends ([`cancel`]);
//! - `takeover`: work taken from an agent ([`reassign`], [`fail_attempt`]).
//!
//! Shared types are here; the table tests are in `tests.rs`.

use std::collections::HashSet;

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

mod budget;
mod cancel;
mod deadlines;
mod dispatch;
mod plan;
mod results;
mod summary;
mod takeover;
#[cfg(test)]
mod tests;

pub use budget::*;
pub use cancel::*;
pub use deadlines::*;
pub use dispatch::*;
pub use plan::*;
pub use results::*;
pub use summary::*;
pub use takeover::*;

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
            tenant: String::new(),
        });
    }

    /// Numbers the transition's events on from the goal's last `seq`. Call it inside the
    /// compare-and-set, after the transition, so the numbers are committed with the state: a
    /// goal's events then run 1, 2, 3, ... in the order its transitions committed.
    /// Goal-level events also carry the goal's session and tenant (see `Event.session_id`).
    pub fn number(&mut self, state: &mut GoalState) {
        let session = state.spec.as_ref().map(|s| s.session_id.as_str()).unwrap_or("");
        let tenant = state.spec.as_ref().and_then(|s| s.labels.get(hermes_core::access::TENANT_LABEL));
        let tenant = tenant.map(String::as_str).unwrap_or("");
        for event in &mut self.events {
            state.event_seq += 1;
            event.seq = state.event_seq;
            if is_goal_level(event) {
                event.session_id = session.to_owned();
                event.tenant = tenant.to_owned();
            }
        }
    }
}

pub(super) fn is_goal_level(event: &Event) -> bool {
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

/// What applying a result did.
#[derive(Debug, PartialEq, Eq)]
pub enum Applied {
    /// The result changed the goal.
    Changed,
    /// The result is for an attempt that is no longer current, or was already applied.
    Stale,
    /// The result names the current attempt but not with its `result_token`: it did not come
    /// from a holder of the task's delivery, and is ignored.
    Forged,
    /// The result carries the current attempt's task id and token but reports another `attempt`
    /// number than the one the dispatcher issued. Retries are counted from the dispatcher's own
    /// record, never from what an agent says, so the result is ignored (and logged).
    WrongAttempt {
        /// The attempt the dispatcher issued.
        issued: u32,
        /// The attempt the result claims.
        claimed: u32,
    },
}

/// The secret of attempt `task_id` of a goal whose result key is `key`: SHA-256 over the key and
/// the task id, in hex, cut to 32 characters. Empty when the goal has no key (it was stored
/// before result tokens existed).
pub fn result_token(key: &[u8], task_id: &str) -> String {
    use sha2::{Digest, Sha256};
    if key.is_empty() {
        return String::new();
    }
    let digest = Sha256::new().chain_update(key).chain_update(b"\0").chain_update(task_id).finalize();
    digest.iter().take(16).map(|b| format!("{b:02x}")).collect()
}

/// Whether `token` is the `result_token` of attempt `task_id` of `state`, compared in constant
/// time.
pub fn token_matches(state: &GoalState, task_id: &str, token: &str) -> bool {
    let expected = result_token(&state.result_key, task_id);
    expected.len() == token.len()
        && expected.bytes().zip(token.bytes()).fold(0u8, |diff, (a, b)| diff | (a ^ b)) == 0
}

/// The index of the node whose current attempt is `task_id` of node `node_id`, when `token` is
/// that attempt's: what an agent's result or report must name to be heard.
pub fn authentic_attempt(
    state: &GoalState,
    node_id: &str,
    task_id: &str,
    token: &str,
) -> Result<usize, Applied> {
    let index = current_attempt(state, node_id, task_id).ok_or(Applied::Stale)?;
    if token_matches(state, task_id, token) { Ok(index) } else { Err(Applied::Forged) }
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
        Some(Kind::ModelWaiting(e)) => {
            format!("{goal}:model-wait:{}:{}:{}:{}", e.node_id, e.attempt, e.waiting, event.at_unix_ms)
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
pub(super) fn current_attempt(state: &GoalState, node_id: &str, task_id: &str) -> Option<usize> {
    if is_terminal(state.status) {
        return None;
    }
    let index = state.nodes.iter().position(|n| n.node_id == node_id)?;
    let node = &state.nodes[index];
    (node.status == NodeStatus::Dispatched as i32 && node.task_id == task_id).then_some(index)
}
