//! How a goal ends: cancelled by request, or failed with a node. Nodes not started are skipped,
//! nodes running are cancelled with a finish time and their agents are told to stop.

use super::*;

/// Fails a node and with it the goal; nodes not yet started are skipped.
pub(super) fn fail_node(
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
pub(super) fn end_goal(
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

pub(super) fn skip_pending(state: &mut GoalState) {
    for node in &mut state.nodes {
        if node.status == NodeStatus::Pending as i32 {
            node.status = NodeStatus::Skipped as i32;
        }
    }
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
