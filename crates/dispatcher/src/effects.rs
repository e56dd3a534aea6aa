//! The effects publisher: what follows a committed transition. The transition's events are
//! published first, in one message (`hermes_core::events`), then its tasks (routed from the
//! dispatcher's view of the agents, see [`routing`]) and plan requests, in that order on one
//! connection, so a goal's events are stored by `seq` and each `TaskDispatched` before its
//! task can produce a result, and last the webhook deliveries its events make
//! ([`crate::webhooks`]). Then the workers hear what concerns them, through [`Followups`]:
//! the goal's next deadline, a summary to write, a task no live agent serves.
//!
//! The handles are defined here, on the service's side, and the workers own the receiving ends:
//! the service never reaches into a worker's state.

use std::time::{Duration, Instant};

use hermes_core::trace::TraceContext;
use hermes_core::{Bus, Result};
use hermes_proto::{GoalState, RouteDecision, TaskMessage};
use prost::Message as _;
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};
use tracing::warn;

use crate::engine::{self, Effects, Limits};
use crate::{metrics, routing};

/// A goal's next deadline, for the timers worker; `at: None` once the goal has none.
#[derive(Debug)]
pub(crate) struct Deadline {
    pub goal_id: String,
    pub at: Option<u64>,
}

/// How long a committed transition's effects are sent again after a failed publish (a JetStream
/// cluster electing a leader answers "no stream" for a few seconds) before the goal is handed to
/// the timers worker, which publishes its in-flight tasks again until that succeeds.
const SEND_PATIENCE: Duration = Duration::from_secs(30);

/// A task sent to its pool because no live agent served its type, for the takeover worker: the
/// node fails with `NO_CAPABLE_AGENT` when none has appeared by `deadline`.
#[derive(Debug)]
pub(crate) struct Unserved {
    pub goal_id: String,
    pub node_id: String,
    pub task_id: String,
    pub task_type: String,
    pub deadline: Instant,
}

/// The sending ends of the workers' channels. Sending never blocks; after shutdown (the worker
/// gone) it is a no-op, and what it said is rebuilt from KV by the next dispatcher.
#[derive(Clone)]
pub(crate) struct Followups {
    deadlines: UnboundedSender<Deadline>,
    summaries: UnboundedSender<String>,
    unserved: UnboundedSender<Unserved>,
    unsent: UnboundedSender<String>,
}

/// The receiving ends, one per worker.
pub(crate) struct FollowupInbox {
    pub deadlines: UnboundedReceiver<Deadline>,
    pub summaries: UnboundedReceiver<String>,
    pub unserved: UnboundedReceiver<Unserved>,
    /// Goals whose committed effects could not be published within [`SEND_PATIENCE`]: the
    /// timers worker publishes their in-flight tasks again.
    pub unsent: UnboundedReceiver<String>,
}

impl Followups {
    pub(crate) fn channel() -> (Followups, FollowupInbox) {
        let (deadlines, deadlines_rx) = unbounded_channel();
        let (summaries, summaries_rx) = unbounded_channel();
        let (unserved, unserved_rx) = unbounded_channel();
        let (unsent, unsent_rx) = unbounded_channel();
        (
            Followups { deadlines, summaries, unserved, unsent },
            FollowupInbox {
                deadlines: deadlines_rx,
                summaries: summaries_rx,
                unserved: unserved_rx,
                unsent: unsent_rx,
            },
        )
    }

    pub(crate) fn deadline(&self, goal_id: &str, at: Option<u64>) {
        let _ = self.deadlines.send(Deadline { goal_id: goal_id.to_owned(), at });
    }

    pub(crate) fn summarize(&self, goal_id: &str) {
        let _ = self.summaries.send(goal_id.to_owned());
    }

    fn unserved(&self, task: Unserved) {
        let _ = self.unserved.send(task);
    }

    /// Has the timers worker publish the goal's in-flight tasks again, until that succeeds: for
    /// a transition whose effects could not be sent, or whose write's outcome is unknown.
    pub(crate) fn unsent(&self, goal_id: &str) {
        let _ = self.unsent.send(goal_id.to_owned());
    }
}

/// One message to publish: subject, body, `Nats-Msg-Id` and the trace it continues.
struct Outgoing {
    subject: String,
    body: bytes::Bytes,
    msg_id: String,
    trace: Option<TraceContext>,
}

/// Publishes committed transitions' effects.
pub(crate) struct EffectsPublisher {
    bus: Bus,
    agents: hermes_registry::Registry,
    limits: Limits,
    no_agent_wait: Duration,
    followups: Followups,
    webhooks: crate::webhooks::Webhooks,
    /// Signs each task's memory token (`hermes_core::task_token`).
    task_key: hermes_core::task_token::TaskKey,
}

impl EffectsPublisher {
    pub(crate) fn new(
        bus: Bus,
        agents: hermes_registry::Registry,
        limits: Limits,
        no_agent_wait: Duration,
        followups: Followups,
        webhooks: crate::webhooks::Webhooks,
        task_key: hermes_core::task_token::TaskKey,
    ) -> Self {
        Self { bus, agents, limits, no_agent_wait, followups, webhooks, task_key }
    }

    /// The dispatcher's view of the live agents, which routes its tasks.
    pub(crate) fn agents(&self) -> &hermes_registry::Registry {
        &self.agents
    }

    pub(crate) fn followups(&self) -> &Followups {
        &self.followups
    }

    /// Publishes a committed transition's effects. Each publish is sent before any ack is
    /// awaited, which keeps wide fan-outs fast while preserving order on the connection.
    pub(crate) async fn publish(&self, state: &GoalState, effects: Effects) -> Result<()> {
        self.publish_within(state, effects, SEND_PATIENCE).await
    }

    /// [`Self::publish`], sending again after a failure only for `patience` (the timers worker's
    /// own retries of unsent goals do not wait inside each other).
    pub(crate) async fn publish_within(
        &self,
        state: &GoalState,
        mut effects: Effects,
        patience: Duration,
    ) -> Result<()> {
        self.offload_large_inputs(&mut effects.tasks).await?;
        // The memory service's proof of each task's goal and tenant, until a while after the
        // attempt's deadline.
        for task in &mut effects.tasks {
            let expires = task.deadline_unix_ms.saturating_add(hermes_core::task_token::GRACE_MS);
            task.memory_token = self.task_key.sign(&task.goal_id, &task.tenant, expires);
        }
        let decisions = routing::route(&self.agents, state, &effects.tasks);
        let subjects = routing::record_decisions(
            self.bus.topology(),
            hermes_core::access::tenant_of(state),
            &mut effects.events,
            &effects.tasks,
            &decisions,
        );
        self.watch_unserved(&effects.tasks, &decisions);
        metrics::record(state, &effects.events);
        // Events are for watching a goal and are redacted for everyone; these are published and
        // dropped, so they are redacted where they are.
        effects.events.iter_mut().for_each(hermes_core::redact::in_place);
        let (mut outgoing, dispatch_spans) = self.messages(state, &effects, subjects, &decisions);
        // The transition's webhook deliveries, after its events (docs/webhooks.md).
        for delivery in self.webhooks.deliveries(state, &effects.events) {
            outgoing.push(Outgoing {
                subject: self.bus.topology().webhook(&delivery.endpoint_id, &delivery.goal_id),
                body: delivery.encode_to_vec().into(),
                msg_id: delivery.id,
                trace: None,
            });
        }
        if let Err(e) = self.send_patiently(&state.goal_id, &outgoing, patience).await {
            // The transition is committed: its tasks must still reach the agents. The timers
            // worker publishes the goal's in-flight tasks again until that succeeds.
            self.followups.unsent(&state.goal_id);
            return Err(e);
        }
        drop(dispatch_spans);
        self.follow_up(state, &effects).await;
        Ok(())
    }

    /// Inputs over the inline limit (several large refs resolved together) travel as an
    /// artifact; the executor loads them back.
    async fn offload_large_inputs(&self, tasks: &mut [TaskMessage]) -> Result<()> {
        let artifacts = self.bus.artifacts();
        for task in tasks {
            if task.inputs_json.len() > artifacts.inline_limit() {
                let inputs = std::mem::take(&mut task.inputs_json);
                let (stub, reference) = artifacts.offload_json(inputs, &task.goal_id, &task.tenant).await?;
                task.inputs_json = stub;
                task.memory_refs.extend(reference);
            }
        }
        Ok(())
    }

    /// Tasks whose type no live agent serves are watched by the takeover worker.
    fn watch_unserved(&self, tasks: &[TaskMessage], decisions: &[RouteDecision]) {
        for (task, decision) in tasks.iter().zip(decisions) {
            if decision.capable_agents == 0 {
                self.followups.unserved(Unserved {
                    goal_id: task.goal_id.clone(),
                    node_id: task.node_id.clone(),
                    task_id: task.task_id.clone(),
                    task_type: task.task_type.clone(),
                    deadline: Instant::now() + self.no_agent_wait,
                });
            }
        }
    }

    /// The messages in publishing order (events, redacted already, tasks, plan requests), with one
    /// span per dispatched node: the agent's task span is its child. Messages continue the span
    /// this runs in (SubmitGoal, apply_plan, apply_results); work started by a timer or a restart
    /// continues the goal's root span.
    fn messages(
        &self,
        state: &GoalState,
        effects: &Effects,
        subjects: Vec<String>,
        decisions: &[RouteDecision],
    ) -> (Vec<Outgoing>, Vec<tracing::Span>) {
        let topology = self.bus.topology();
        let root = TraceContext::parse(&state.traceparent);
        let in_span = TraceContext::current();
        let trace = in_span.clone().or_else(|| root.clone());
        let mut outgoing = Vec::with_capacity(1 + effects.tasks.len());
        // The transition's events go in one message (several for a very wide plan), named by
        // their first event and their count, so a transition sent again is stored once.
        for (first, count, body) in hermes_core::events::batches(&effects.events) {
            let event = &effects.events[first];
            let msg_id = match count {
                1 => engine::event_msg_id(event),
                n => format!("{}+{}", engine::event_msg_id(event), n - 1),
            };
            outgoing.push(Outgoing {
                subject: topology.event(&event.goal_id),
                body,
                msg_id,
                trace: trace.clone(),
            });
        }
        let mut spans = Vec::with_capacity(effects.tasks.len());
        for (task, (subject, decision)) in effects.tasks.iter().zip(subjects.into_iter().zip(decisions)) {
            let span = tracing::info_span!(
                "dispatch_node",
                otel.name = %format_args!("dispatch {}", task.task_type),
                otel.kind = "producer",
                goal_id = %task.goal_id,
                node_id = %task.node_id,
                task_id = %task.task_id,
                task_type = %task.task_type,
                attempt = task.attempt,
                agent = %decision.agent_id,
            );
            if in_span.is_none() {
                hermes_core::trace::follow(&span, root.as_ref());
            }
            let context = TraceContext::of(&span).or_else(|| trace.clone());
            outgoing.push(Outgoing {
                subject,
                body: task.encode_to_vec().into(),
                msg_id: task.task_id.clone(),
                trace: context,
            });
            spans.push(span);
        }
        for request in &effects.plan_requests {
            outgoing.push(Outgoing {
                subject: topology.plan_request(),
                body: request.encode_to_vec().into(),
                msg_id: request.request_id.clone(),
                trace: trace.clone(),
            });
        }
        (outgoing, spans)
    }

    /// Sent one after the other, so they are stored in order; the acks are awaited together.
    /// (Publishing the futures concurrently, as a `buffered` stream, stored runs of a wide
    /// fan-out's events reversed.)
    /// [`Self::send_in_order`], sent again after a failure for up to `patience`: every message
    /// carries its `Nats-Msg-Id`, so what was stored the first time is not stored twice.
    async fn send_patiently(&self, goal_id: &str, outgoing: &[Outgoing], patience: Duration) -> Result<()> {
        let deadline = Instant::now() + patience;
        let mut pause = Duration::from_millis(100);
        loop {
            match self.send_in_order(outgoing).await {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() + pause < deadline => {
                    warn!(goal_id, error = %e, "cannot publish a committed transition's effects; sending them again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn send_in_order(&self, outgoing: &[Outgoing]) -> Result<()> {
        let mut acks = Vec::with_capacity(outgoing.len());
        for m in outgoing {
            acks.push(
                self.bus.send_bytes(m.subject.clone(), m.body.clone(), &m.msg_id, m.trace.as_ref()).await?,
            );
        }
        for ack in futures::future::join_all(acks).await {
            ack?;
        }
        Ok(())
    }

    /// Tells the workers and the agents what the transition means for them.
    async fn follow_up(&self, state: &GoalState, effects: &Effects) {
        if effects.summarize {
            self.followups.summarize(&state.goal_id);
        }
        if effects.stop_agents {
            // Agents running the goal's tasks abandon them at their next step. Best effort:
            // results that still arrive are ignored, since the goal has ended.
            let subject = self.bus.topology().cancel(&state.goal_id);
            let reason = state.error.as_ref().map(|e| e.message.clone()).unwrap_or_default();
            if let Err(e) = self.bus.client().publish(subject, reason.into()).await {
                warn!(goal_id = %state.goal_id, error = %e, "cannot tell agents that the goal ended");
            }
        }
        self.followups.deadline(&state.goal_id, engine::next_deadline(state, self.limits));
    }
}
