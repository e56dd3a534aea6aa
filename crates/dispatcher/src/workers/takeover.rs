//! The takeover worker: what happens when an agent goes away, or no agent serves a task type.
//!
//! When the registry announces an agent offline, the worker removes it from the dispatcher's
//! routing view and takes over its directed work: it deletes the agent's consumer, drains the
//! agent's subject with a consumer of its own and gives every task that is still the current attempt of its node a new attempt routed
//! elsewhere ([`GoalService::reassign`]). The old attempt's result, should it ever arrive, is then
//! stale and ignored. Only tasks sent before the takeover began are taken: an agent that comes
//! back at once keeps what it was routed since. Safe on several dispatchers at once: the drain consumer is a work queue and
//! every change is a CAS.
//!
//! A task whose type no live agent served when it was dispatched went to its pool, and the
//! effects publisher sent it here ([`Unserved`]): if no capable agent has appeared when
//! `no_agent_wait` is over, its node fails with `NO_CAPABLE_AGENT`.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use hermes_core::bus::{ConsumerSpec, Handled};
use hermes_core::error::wire_error;
use hermes_core::{Error, ErrorCode, Result};
use hermes_proto::TaskMessage;
use prost::Message as _;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::effects::Unserved;
use crate::goals::GoalService;

/// How often the unserved tasks are checked.
const SWEEP: Duration = Duration::from_millis(250);

/// Follows `AgentOffline` notices and the unserved tasks until `shutdown` is cancelled.
pub(crate) async fn run(
    service: Arc<GoalService>,
    mut unserved: UnboundedReceiver<Unserved>,
    shutdown: CancellationToken,
) {
    let subject = service.bus().topology().agent_offline();
    let mut offline = match service.bus().client().subscribe(subject.clone()).await {
        Ok(sub) => sub,
        Err(e) => {
            warn!(error = %e, "cannot subscribe to agent offline notices");
            return;
        }
    };
    // The worker's state: unserved tasks by (goal, node).
    let mut waiting: HashMap<(String, String), Unserved> = HashMap::new();
    let mut sweep = tokio::time::interval(SWEEP);
    loop {
        tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            Some(task) = unserved.recv() => {
                waiting.insert((task.goal_id.clone(), task.node_id.clone()), task);
            }
            Some(msg) = offline.next() => {
                // A push consumer another bus user created can deliver a stored message to this
                // subscription; such a message keeps its stored subject, and is no notice.
                if msg.subject.as_str() != subject {
                    warn!(subject = %msg.subject, "ignored a message delivered to the offline notices from another subject");
                    continue;
                }
                let Ok(notice) = hermes_proto::AgentOffline::decode(msg.payload) else { continue };
                // Out of the routing view first, so no attempt the takeover makes goes back to it.
                service.agents().forget(&notice.agent_id);
                let service = service.clone();
                tokio::spawn(async move {
                    // A takeover cut short (the cluster without a leader for the goals bucket)
                    // is tried again: the agent may really be gone, with its tasks waiting.
                    let mut pause = Duration::from_secs(1);
                    for attempt in 1..=TAKEOVER_TRIES {
                        match take_over(&service, &notice.agent_id, &notice.reason).await {
                            Ok(_) => break,
                            Err(e) => {
                                warn!(agent = %notice.agent_id, attempt, error = %e, "cannot take over an offline agent's tasks");
                                tokio::time::sleep(pause).await;
                                pause = (pause * 2).min(Duration::from_secs(10));
                            }
                        }
                    }
                });
            }
            _ = sweep.tick() => fail_unserved(&service, &mut waiting).await,
        }
    }
}

/// How many times a takeover that fails is tried (over about half a minute).
const TAKEOVER_TRIES: u32 = 6;

/// Takes over the directed work of an agent that went offline. Returns how many tasks moved.
async fn take_over(service: &GoalService, agent_id: &str, reason: &str) -> Result<usize> {
    let bus = service.bus();
    let topology = bus.topology().clone();
    let mut stream = bus
        .jetstream()
        .get_stream(topology.tasks_stream())
        .await
        .map_err(|e| Error::JetStream { operation: "get stream", reason: e.to_string() })?;
    // Only what was sent to the agent before now is taken over. An agent that flapped may be
    // back already and be routed new work; draining that too gave each such task a new attempt
    // routed back to the same agent, drained again, hundreds of times over.
    let last_before = stream
        .info()
        .await
        .map_err(|e| Error::JetStream { operation: "stream info", reason: e.to_string() })?
        .state
        .last_sequence;
    // The agent's own consumer must go first: work-queue consumers may not overlap.
    let _ = stream.delete_consumer(&topology.agent_consumer(agent_id)).await;
    let consumer = bus
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
    let drained = drain(service, &consumer, last_before, &why).await;
    // Whatever happened, the drain consumer goes: left behind, it would keep the agent (back, or
    // another with its id) from creating its own consumer on the work-queue stream for ever.
    if let Err(e) = stream.delete_consumer(&topology.reassign_consumer(agent_id)).await {
        warn!(agent = %agent_id, error = %e, "cannot delete the takeover's drain consumer");
    }
    let moved = drained?;
    info!(agent = %agent_id, moved, event = "agent_work_reassigned", "took over an offline agent's tasks");
    Ok(moved)
}

/// Moves every task `consumer` holds that was sent before stream sequence `last_before` to
/// another agent, as a new attempt; returns how many moved.
async fn drain(
    service: &GoalService,
    consumer: &async_nats::jetstream::consumer::PullConsumer,
    last_before: u64,
    why: &str,
) -> Result<usize> {
    let bus = service.bus();
    let mut moved = 0;
    loop {
        let mut batch = consumer
            .fetch()
            .max_messages(256)
            .expires(Duration::from_millis(300))
            .messages()
            .await
            .map_err(|e| Error::JetStream { operation: "fetch", reason: e.to_string() })?;
        let mut seen = 0;
        let mut caught_up = false;
        while let Some(Ok(msg)) = batch.next().await {
            if msg.info().is_ok_and(|info| info.stream_sequence > last_before) {
                // Sent after the takeover began: left unacked, it goes back to the stream when the
                // drain consumer is deleted, for the agent's own consumer.
                caught_up = true;
                break;
            }
            seen += 1;
            let Some(delivery) = bus.decode_or_dead_letter::<TaskMessage>("task", msg).await else {
                continue;
            };
            let task = &delivery.message;
            if service.reassign(&task.goal_id, &task.node_id, &task.task_id, why).await? {
                moved += 1;
            }
            delivery.settle(bus, "task", Handled::Done).await;
        }
        if seen == 0 || caught_up {
            return Ok(moved);
        }
    }
}

/// Fails the nodes that waited longer than `no_agent_wait` for an agent serving their type.
async fn fail_unserved(service: &GoalService, waiting: &mut HashMap<(String, String), Unserved>) {
    let now = Instant::now();
    let due: Vec<(String, String)> =
        waiting.iter().filter(|(_, w)| w.deadline <= now).map(|(key, _)| key.clone()).collect();
    for key in due {
        let Some(task) = waiting.remove(&key) else { continue };
        // An agent may have registered meanwhile; it pulls the task from the pool.
        if service.served(&task.task_type).await {
            continue;
        }
        let waited = service.config().no_agent_wait.as_secs_f64();
        let error = wire_error(
            ErrorCode::NoCapableAgent,
            format!("no live agent serves task type `{}` (waited {waited:.1} s)", task.task_type),
        );
        if let Err(e) = service.fail_attempt(&task.goal_id, &task.node_id, &task.task_id, error).await {
            warn!(goal_id = %task.goal_id, error = %e, "cannot publish no-capable-agent failure");
        }
    }
}
