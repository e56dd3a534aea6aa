//! Deadlines: the goal's and each attempt's, computed from persisted state, and what happens when
//! they pass.

use super::*;

/// How long after a node's deadline its attempt counts as timed out: room for a result that was
/// sent just before the deadline.
pub const NODE_DEADLINE_GRACE_MS: u64 = 5_000;

/// When the attempt of node `index` is due: its dispatch time plus the node's timeout, never
/// after the goal's deadline.
pub(super) fn node_deadline(state: &GoalState, index: usize, limits: Limits) -> u64 {
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
            result_token: result_token(&state.result_key, &node.task_id),
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
