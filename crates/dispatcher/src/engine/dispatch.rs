//! Dispatching nodes: which nodes are ready, their inputs with `$ref`s resolved, and the task
//! of each attempt (also rebuilt from stored state for a dispatcher that starts).

use super::*;

/// Dispatches every node that is ready: pending, with all dependencies succeeded.
pub fn dispatch_ready(state: &mut GoalState, limits: Limits, now_ms: u64, effects: &mut Effects) {
    if is_terminal(state.status) {
        return;
    }
    let Some(plan) = state.plan.as_ref() else {
        return;
    };
    let pending = |i: &usize| state.nodes[*i].status == NodeStatus::Pending as i32;
    // Nothing pending (a fan-out whose nodes are all out) costs one pass and no allocation.
    if !(0..state.nodes.len()).any(|i| pending(&i)) {
        return;
    }
    let succeeded: HashSet<&str> = state
        .nodes
        .iter()
        .filter(|n| n.status == NodeStatus::Succeeded as i32)
        .map(|n| n.node_id.as_str())
        .collect();
    let ready: Vec<usize> = (0..state.nodes.len())
        .filter(pending)
        .filter(|&i| plan.nodes[i].depends_on.iter().all(|d| succeeded.contains(d.as_str())))
        .collect();
    for i in ready {
        let inputs = &state.plan.as_ref().expect("plan present").nodes[i].inputs_json;
        match resolve_inputs(state, inputs) {
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

pub(super) fn publish_attempt(
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
pub(super) fn task_message(
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
        result_token: result_token(&state.result_key, task_id.as_ref()),
        secret_inputs: plan_node.secret_inputs.clone(),
        tenant: hermes_core::access::tenant_of(state).unwrap_or_default().to_owned(),
        // Signed when the task is published (effects.rs), where the key is.
        memory_token: String::new(),
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

/// Most bytes a node's inputs may take once the dispatcher resolves their `$ref`s to inline
/// outputs; over it the node fails with `INVALID_ARGUMENT` before anything is built.
pub const MAX_DISPATCH_INPUT_BYTES: usize = 8 * 1024 * 1024;

/// Replaces the `$ref`s in a node's inputs with its dependencies' outputs.
pub(super) fn resolve_inputs(state: &GoalState, inputs_json: &str) -> Result<String, TransitionError> {
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

/// Publishes attempt `next_attempt` of a node, with its inputs resolved again.
pub(super) fn redispatch(
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
