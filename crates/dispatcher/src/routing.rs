//! Where tasks go. Before a transition's tasks are published, the registry is asked (one batched
//! request) for the best agent for each; a task goes to `hermes.task.direct.<agent>.<type>` when
//! one was chosen and to `hermes.task.pool.<type>` otherwise. The decision, its score and the
//! reason are put on the task's `TaskDispatched` event.
//!
//! What happens when an agent goes away, or no agent serves a type, is the takeover worker's
//! (`workers/takeover.rs`).

use std::time::Duration;

use hermes_core::Bus;
use hermes_core::topology::Topology;
use hermes_proto::event::Kind;
use hermes_proto::{Event, GoalState, RouteDecision, RouteQuery, TaskMessage};
use tracing::{info, warn};

/// Asks the registry where each task goes. When the registry cannot be reached every task goes to
/// its pool, which capable agents pull from anyway.
pub(crate) async fn route(bus: &Bus, state: &GoalState, tasks: &[TaskMessage]) -> Vec<RouteDecision> {
    if tasks.is_empty() {
        return Vec::new();
    }
    let plan_nodes = state.plan.as_ref().map(|p| p.nodes.as_slice()).unwrap_or_default();
    let queries = tasks
        .iter()
        .map(|task| {
            let node = plan_nodes.iter().find(|n| n.id == task.node_id);
            RouteQuery {
                task_type: task.task_type.clone(),
                tags: node.map(|n| n.tags.clone()).unwrap_or_default(),
                tools: node.map(|n| n.tools.clone()).unwrap_or_default(),
                model: node.map(|n| n.model.clone()).unwrap_or_default(),
            }
        })
        .collect();
    let decisions = match hermes_clients::registry::route(bus, queries, Duration::from_secs(2)).await {
        Ok(decisions) => decisions,
        Err(e) => {
            warn!(error = %e, "no routing from the registry; using the pools");
            Vec::new()
        }
    };
    if decisions.len() == tasks.len() {
        return decisions;
    }
    tasks
        .iter()
        .map(|t| RouteDecision {
            agent_id: String::new(),
            score: 0.0,
            reason: format!("pool: the registry did not answer ({})", t.task_type),
            // Unknown, not zero: do not start the no-capable-agent clock on a registry outage.
            capable_agents: u32::MAX,
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
    tasks
        .iter()
        .zip(decisions)
        .map(|(task, decision)| {
            let subject = if decision.agent_id.is_empty() {
                topology.pool_task_of(&task.task_type, tenant)
            } else {
                topology.direct_task(&decision.agent_id, &task.task_type)
            };
            for event in events.iter_mut() {
                if let Some(Kind::TaskDispatched(d)) = &mut event.kind
                    && d.task_id == task.task_id
                {
                    d.subject = subject.clone();
                    d.agent_id = decision.agent_id.clone();
                    d.score = decision.score;
                    d.reason = decision.reason.clone();
                }
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
