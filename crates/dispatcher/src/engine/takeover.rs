//! Work taken from an agent: reassigned when the agent went offline (a new attempt, not a
//! failure), or failed when no live agent serves the task type.

use super::*;

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
