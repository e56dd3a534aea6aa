//! Task results: recorded, retried, replanned or failed by the node's policy; a goal whose nodes
//! are all done completes (or goes on to its summary).

use super::*;

/// Applies a task result: records it, retries or fails the node, dispatches newly ready nodes and
/// completes the goal when every node is done.
pub fn apply_result(
    state: &mut GoalState,
    result: &TaskResult,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> Applied {
    apply_results(state, std::slice::from_ref(result), limits, now_ms, effects).remove(0)
}

/// Applies several results of one goal, in order, as [`apply_result`] applies each; the nodes
/// their successes make ready are dispatched, and the goal completed, once after all of them.
/// A wide fan-out's batch of results thus costs one pass over the plan, not one per result.
pub fn apply_results(
    state: &mut GoalState,
    results: &[TaskResult],
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> Vec<Applied> {
    let mut succeeded = false;
    let applied = results
        .iter()
        .map(|result| {
            let (applied, success) = record_result(state, result, limits, now_ms, effects);
            succeeded |= success;
            applied
        })
        .collect();
    if succeeded {
        dispatch_ready(state, limits, now_ms, effects);
        complete_if_done(state, limits, now_ms, effects);
    }
    applied
}

/// Records one result: the node's success (true in the second place, when what follows a
/// success is due: dispatching its dependants, completing the goal) or its failure, retried,
/// replanned or final.
fn record_result(
    state: &mut GoalState,
    result: &TaskResult,
    limits: Limits,
    now_ms: u64,
    effects: &mut Effects,
) -> (Applied, bool) {
    let index = match authentic_attempt(state, &result.node_id, &result.task_id, &result.result_token) {
        Ok(index) => index,
        Err(ignored) => return (ignored, false),
    };
    // The attempt number is the dispatcher's, not the agent's: a result that claims another one
    // would otherwise reset or exhaust the node's retries.
    let attempt = state.nodes[index].attempt;
    if result.attempt != attempt {
        return (Applied::WrongAttempt { issued: attempt, claimed: result.attempt }, false);
    }
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
                attempt,
                agent_id: result.agent_id.clone(),
                elapsed_ms: result.elapsed_ms,
                output_json: result.output_json.clone(),
                cached: result.cached,
                cached_age_ms: result.cached_age_ms,
            }),
        );
        if let Some(tokens) = &result.tokens
            && charge(state, Some(index), tokens, limits, now_ms, effects)
        {
            return (Applied::Changed, false);
        }
        return (Applied::Changed, true);
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
            attempt,
            agent_id: result.agent_id.clone(),
            elapsed_ms: result.elapsed_ms,
            error: Some(error.clone()),
        }),
    );
    // A failed attempt's tokens were spent all the same.
    if let Some(tokens) = &result.tokens
        && charge(state, Some(index), tokens, limits, now_ms, effects)
    {
        return (Applied::Changed, false);
    }
    let plan_node = &state.plan.as_ref().expect("plan present").nodes[index];
    let max_retries = if plan_node.max_retries > 0 { plan_node.max_retries } else { DEFAULT_MAX_RETRIES };
    if error.retryable && attempt <= max_retries {
        let next_attempt = attempt + 1;
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
        return (Applied::Changed, false);
    }
    if limits.planner && from_text(state) && state.status == GoalStatus::Running as i32 {
        if state.nodes[index].replans < MAX_REPLANS {
            request_replan(state, index, error, now_ms, effects);
            return (Applied::Changed, false);
        }
        let chain = error_chain(&state.nodes[index]);
        fail_node(state, index, chain, now_ms, effects);
        return (Applied::Changed, false);
    }
    fail_node(state, index, error, now_ms, effects);
    (Applied::Changed, false)
}

/// The error reported when a node keeps failing after its replans: every failure, in order.
pub(super) fn error_chain(node: &NodeState) -> hermes_proto::Error {
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

pub(super) fn complete_if_done(state: &mut GoalState, limits: Limits, now_ms: u64, effects: &mut Effects) {
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
pub(super) fn goal_output(state: &GoalState) -> String {
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
