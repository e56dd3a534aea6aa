//! Where tasks go, and what happens when an agent goes away.
//!
//! Before a transition's tasks are published, the registry is asked (one batched request) for
//! the best agent for each; a task goes to `hermes.task.direct.<agent>.<type>` when one was
//! chosen and to `hermes.task.pool.<type>` otherwise. The decision, its score and the reason are
//! put on the task's `TaskDispatched` event.
//!
//! When the registry announces an agent offline, a dispatcher takes over that agent's directed
//! work: it deletes the agent's consumer, drains the agent's subject with a consumer of its own and
//! gives every task that is still the current attempt of its node a new attempt routed elsewhere.
//! The old attempt's result, should it ever arrive, is then stale and ignored.
//!
//! A task whose type no live agent serves goes to the pool and is watched: if no capable agent
//! has appeared when `no_agent_wait` is over, the node fails with `NO_CAPABLE_AGENT`.

use std::time::{Duration, Instant};

use futures::StreamExt;
use hermes_core::bus::ConsumerSpec;
use hermes_core::error::wire_error;
use hermes_core::{ErrorCode, Result, now_unix_ms};
use hermes_proto::event::Kind;
use hermes_proto::{Event, GoalState, RouteDecision, RouteQuery, TaskMessage};
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::GoalService;
use crate::engine::{self, Applied, Effects};

/// A task sent to the pool because no live agent served its type.
pub(crate) struct WaitingTask {
    pub task_id: String,
    pub task_type: String,
    pub deadline: Instant,
}

impl GoalService {
    /// Asks the registry where each task goes. When the registry cannot be reached every task goes
    /// to its pool, which capable agents pull from anyway.
    pub(crate) async fn route(&self, state: &GoalState, tasks: &[TaskMessage]) -> Vec<RouteDecision> {
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
        let decisions =
            match hermes_clients::registry::route(&self.bus, queries, Duration::from_secs(2)).await {
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

    /// The subject for a task, given its routing decision, and the decision recorded on the
    /// task's `TaskDispatched` event.
    pub(crate) fn apply_decisions(
        &self,
        events: &mut [Event],
        tasks: &[TaskMessage],
        decisions: &[RouteDecision],
    ) -> Vec<String> {
        let topology = self.bus.topology();
        let no_agent_wait = self.config.no_agent_wait;
        tasks
            .iter()
            .zip(decisions)
            .map(|(task, decision)| {
                let subject = if decision.agent_id.is_empty() {
                    topology.pool_task(&task.task_type)
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
                if decision.capable_agents == 0 {
                    self.waiting.insert(
                        (task.goal_id.clone(), task.node_id.clone()),
                        WaitingTask {
                            task_id: task.task_id.clone(),
                            task_type: task.task_type.clone(),
                            deadline: Instant::now() + no_agent_wait,
                        },
                    );
                }
                subject
            })
            .collect()
    }

    /// Takes over the directed work of an agent that went offline. Safe to run on several
    /// dispatchers at once: the drain consumer is a work queue and every change is a CAS.
    pub(crate) async fn take_over_agent(&self, agent_id: &str, reason: &str) -> Result<usize> {
        let topology = self.bus.topology().clone();
        let stream =
            self.bus.jetstream().get_stream(topology.tasks_stream()).await.map_err(|e| {
                hermes_core::Error::JetStream { operation: "get stream", reason: e.to_string() }
            })?;
        // The agent's own consumer must go first: work-queue consumers may not overlap.
        let _ = stream.delete_consumer(&topology.agent_consumer(agent_id)).await;
        let consumer = self
            .bus
            .durable_consumer(ConsumerSpec {
                stream: topology.tasks_stream(),
                name: topology.reassign_consumer(agent_id),
                filter_subject: topology.direct_tasks_of(agent_id),
                ack_wait: Duration::from_secs(30),
                max_deliver: 10,
                max_ack_pending: 20_000,
            })
            .await?;
        let why = format!("agent {agent_id} went offline ({reason})");
        let mut moved = 0;
        loop {
            let mut batch = consumer
                .fetch()
                .max_messages(256)
                .expires(Duration::from_millis(300))
                .messages()
                .await
                .map_err(|e| hermes_core::Error::JetStream { operation: "fetch", reason: e.to_string() })?;
            let mut seen = 0;
            while let Some(Ok(msg)) = batch.next().await {
                seen += 1;
                let Some(delivery) = self.bus.decode_or_dead_letter::<TaskMessage>("task", msg).await else {
                    continue;
                };
                let task = &delivery.message;
                let limits = self.limits();
                // Commit and publish in order: this goal's events are stored in `seq` order.
                let _order = self.order(&task.goal_id).await;
                let updated = self
                    .store
                    .update(&task.goal_id, |state| {
                        let mut effects = Effects::default();
                        let applied = engine::reassign(
                            state,
                            &task.node_id,
                            &task.task_id,
                            &why,
                            limits,
                            now_unix_ms(),
                            &mut effects,
                        );
                        (applied == Applied::Changed).then_some(effects)
                    })
                    .await;
                match updated {
                    Ok(Some(updated)) => {
                        self.publish_effects(&updated.state, updated.value).await?;
                        moved += 1;
                    }
                    Ok(None) | Err(hermes_core::Error::NotFound { .. }) => {}
                    Err(e) => return Err(e),
                }
                delivery.settle(&self.bus, "task", hermes_core::bus::Handled::Done).await;
            }
            if seen == 0 {
                break;
            }
        }
        let _ = stream.delete_consumer(&topology.reassign_consumer(agent_id)).await;
        info!(agent = %agent_id, moved, event = "agent_work_reassigned", "took over an offline agent's tasks");
        Ok(moved)
    }

    /// Fails nodes that waited longer than `no_agent_wait` for an agent serving their task type.
    pub(crate) async fn expire_waiting(&self) {
        let now = Instant::now();
        let due: Vec<(String, String)> =
            self.waiting.iter().filter(|w| w.deadline <= now).map(|w| w.key().clone()).collect();
        for key in due {
            let Some((_, waiting)) = self.waiting.remove(&key) else { continue };
            let (goal_id, node_id) = key;
            // An agent may have registered meanwhile; it pulls the task from the pool.
            if let Ok(snapshot) = self.catalog.current().await
                && snapshot.contains_all(std::iter::once(waiting.task_type.as_str()))
            {
                continue;
            }
            let waited = self.config.no_agent_wait.as_secs_f64();
            let error = wire_error(
                ErrorCode::NoCapableAgent,
                format!("no live agent serves task type `{}` (waited {waited:.1} s)", waiting.task_type),
            );
            // Commit and publish in order: this goal's events are stored in `seq` order.
            let _order = self.order(&goal_id).await;
            let updated = self
                .store
                .update(&goal_id, |state| {
                    let mut effects = Effects::default();
                    let applied = engine::fail_attempt(
                        state,
                        &node_id,
                        &waiting.task_id,
                        error.clone(),
                        now_unix_ms(),
                        &mut effects,
                    );
                    (applied == Applied::Changed).then_some(effects)
                })
                .await;
            if let Ok(Some(updated)) = updated
                && let Err(e) = self.publish_effects(&updated.state, updated.value).await
            {
                warn!(goal_id = %goal_id, error = %e, "cannot publish no-capable-agent failure");
            }
        }
    }
}

/// Follows `AgentOffline` notices and the waiting list until `shutdown` is cancelled.
pub(crate) async fn watch_agents(service: std::sync::Arc<GoalService>, shutdown: CancellationToken) {
    let subject = service.bus.topology().agent_offline();
    let mut offline = match service.bus.client().subscribe(subject).await {
        Ok(sub) => sub,
        Err(e) => {
            warn!(error = %e, "cannot subscribe to agent offline notices");
            return;
        }
    };
    let mut sweep = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(msg) = offline.next() => {
                let Ok(notice) = hermes_proto::AgentOffline::decode(msg.payload) else { continue };
                let service = service.clone();
                tokio::spawn(async move {
                    if let Err(e) = service.take_over_agent(&notice.agent_id, &notice.reason).await {
                        warn!(agent = %notice.agent_id, error = %e, "cannot take over an offline agent's tasks");
                    }
                });
            }
            _ = sweep.tick() => service.expire_waiting().await,
        }
    }
}
