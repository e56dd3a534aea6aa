//! Plans from the planner: the first plan of a goal given as text, a replan of a failed node
//! (which must keep every completed node), "needs input", and plan failures. A plan result for a
//! request the goal no longer waits on is stale.

use super::*;

/// Asks the planner to replace a failed node and its dependents; completed nodes stay.
pub(super) fn request_replan(
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
        tenant: hermes_core::access::tenant_of(state).unwrap_or_default().to_owned(),
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
        tenant: hermes_core::access::tenant_of(state).unwrap_or_default().to_owned(),
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
    valid: hermes_core::plan::ValidatedPlan,
    repairs: Vec<String>,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    if state.status != GoalStatus::Planning as i32 || state.plan_request_id != request_id {
        return Applied::Stale;
    }
    let hermes_core::plan::ValidatedPlan { plan, groups } = valid;
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
            repairs,
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
    repairs: Vec<String>,
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
            reasoning: plan.reasoning.clone(),
            plan: Some(plan),
            repairs,
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
