//! Where tasks go. Before a transition's tasks are published, each is routed from the
//! dispatcher's own view of the live agents: a [`Registry::mirror`] kept from the same heartbeats
//! the registry follows (`hermes_registry::follow`), so routing costs no message and no round
//! trip. A task goes to `hermes.task.direct.<agent>.<type>` when an agent was chosen and to
//! `hermes.task.pool.<type>` otherwise. The decision, its score and the reason are put on the
//! task's `TaskDispatched` event.
//!
//! The view reserves a slot on the agent it chooses and frees it when the results worker applies
//! that agent's result; each heartbeat resets the agent's load to its own count. With several
//! dispatcher replicas each reserves only what it routed, so between heartbeats an agent may be
//! sent more than its free slots: it pulls them as slots free up, and the rest of the fleet's
//! agents score higher meanwhile.
//!
//! What happens when an agent goes away, or no agent serves a type, is the takeover worker's
//! (`workers/takeover.rs`), which also removes the agent from the view.

use hermes_core::topology::Topology;
use hermes_proto::event::Kind;
use hermes_proto::{Event, GoalState, RouteDecision, RouteQuery, TaskMessage};
use hermes_registry::Registry;
use tracing::info;

/// Decides where each task goes, reserving a slot on each chosen agent.
pub(crate) fn route(agents: &Registry, state: &GoalState, tasks: &[TaskMessage]) -> Vec<RouteDecision> {
    let plan_nodes = state.plan.as_ref().map(|p| p.nodes.as_slice()).unwrap_or_default();
    let nodes: std::collections::HashMap<&str, &hermes_proto::TaskNode> =
        plan_nodes.iter().map(|n| (n.id.as_str(), n)).collect();
    tasks
        .iter()
        .map(|task| {
            let node = nodes.get(task.node_id.as_str());
            agents.route(&RouteQuery {
                task_type: task.task_type.clone(),
                tags: node.map(|n| n.tags.clone()).unwrap_or_default(),
                tools: node.map(|n| n.tools.clone()).unwrap_or_default(),
                model: node.map(|n| n.model.clone()).unwrap_or_default(),
            })
        })
        .collect()
}

/// The subject of each task, given its routing decision; the decision is recorded on the task's
/// `TaskDispatched` event.
pub(crate) fn record_decisions(
    topology: &Topology,
    tenant: Option<&str>,
    events: &mut [Event],
    tasks: &[TaskMessage],
    decisions: &[RouteDecision],
) -> Vec<String> {
    let mut dispatched: std::collections::HashMap<String, &mut hermes_proto::TaskDispatched> = events
        .iter_mut()
        .filter_map(|event| match &mut event.kind {
            Some(Kind::TaskDispatched(d)) => Some((d.task_id.clone(), d)),
            _ => None,
        })
        .collect();
    tasks
        .iter()
        .zip(decisions)
        .map(|(task, decision)| {
            let subject = if decision.agent_id.is_empty() {
                // A tenant that is no word (a goal stored some other way) has no lane.
                let tenant = tenant.filter(|t| {
                    hermes_core::ids::check_id("tenant", t, 64, hermes_core::ids::IdShape::Word).is_ok()
                });
                topology.pool_task_of(&task.task_type, tenant)
            } else {
                topology.direct_task(&decision.agent_id, &task.task_type)
            };
            if let Some(d) = dispatched.get_mut(&task.task_id) {
                d.subject = subject.clone();
                d.agent_id = decision.agent_id.clone();
                d.score = decision.score;
                d.reason = decision.reason.clone();
            }
            info!(
                goal_id = %task.goal_id,
                node_id = %task.node_id,
                task_id = %task.task_id,
                agent = %decision.agent_id,
                score = decision.score,
                reason = %decision.reason,
                event = "task_dispatched",
                "task dispatched"
            );
            subject
        })
        .collect()
}
