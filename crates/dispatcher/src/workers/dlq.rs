//! The DLQ worker: poison messages. A task, result or plan message that reaches its consumer's
//! MaxDeliver without an ack is announced by the server's max-deliveries advisory; one dispatcher
//! replica (a queue group) copies it to `HERMES_DLQ` with the reason, removes it from its work
//! queue, and fails the node (or the planning) with `POISON_MESSAGE`, which the goal handles like
//! any failure. Listing, reading and replaying the DLQ is the API's (`dead_letters.rs`).

use std::sync::Arc;

use futures::StreamExt;
use hermes_core::error::wire_error;
use hermes_core::{ErrorCode, Result};
use hermes_proto::{PlanRequest, PlanResult, TaskMessage, TaskResult, TaskStatus};
use prost::Message as _;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::warn;

use crate::dead_letters::js_error;
use crate::goals::GoalService;

/// The advisory the server publishes when a message reached MaxDeliver.
#[derive(Debug, Deserialize)]
struct MaxDeliveries {
    stream: String,
    consumer: String,
    stream_seq: u64,
    deliveries: u64,
}

/// Moves one message that reached MaxDeliver to the DLQ and fails what it belonged to.
async fn poison(service: &GoalService, advisory: MaxDeliveries) -> Result<()> {
    let bus = service.bus();
    let topology = bus.topology();
    let kind = match advisory.stream.as_str() {
        s if s == topology.tasks_stream() => "task",
        s if s == topology.results_stream() => "result",
        s if s == topology.plans_stream() => "plan",
        _ => return Ok(()),
    };
    let js = bus.jetstream();
    let stream = js.get_stream(&advisory.stream).await.map_err(|e| js_error("get stream", e))?;
    let Ok(message) = stream.get_raw_message(advisory.stream_seq).await else {
        // Already moved by another replica, or acked at the last moment.
        return Ok(());
    };
    let origin = format!("{}:{}", advisory.stream, advisory.stream_seq);
    let reason = format!(
        "delivered {} times to consumer `{}` without being acknowledged (MaxDeliver)",
        advisory.deliveries, advisory.consumer
    );
    bus.publish_dead_letter(kind, &message.subject, &origin, &reason, message.payload.clone()).await?;
    if let Err(e) = stream.delete_message(advisory.stream_seq).await {
        warn!(origin, error = %e, "cannot remove a dead-lettered message from its stream");
    }
    warn!(origin, kind, reason, event = "dead_lettered", "poison message moved to the dlq");
    let error = |subject: &str| wire_error(ErrorCode::PoisonMessage, format!("{subject}: {reason}"));
    // The poisoned message's own token answers its attempt (a task's, or a late result's).
    let poisoned = |goal_id: &str, node_id: &str, task_id: &str, attempt: u32, token: &str| TaskResult {
        goal_id: goal_id.to_owned(),
        node_id: node_id.to_owned(),
        task_id: task_id.to_owned(),
        attempt,
        result_token: token.to_owned(),
        status: TaskStatus::Failed as i32,
        error: Some(error(&message.subject)),
        ..Default::default()
    };
    match kind {
        "task" => {
            if let Ok(task) = TaskMessage::decode(message.payload.clone()) {
                let result =
                    poisoned(&task.goal_id, &task.node_id, &task.task_id, task.attempt, &task.result_token);
                service.apply_results(&task.goal_id, &[result]).await?;
            }
        }
        "result" => {
            if let Ok(late) = TaskResult::decode(message.payload.clone()) {
                let result =
                    poisoned(&late.goal_id, &late.node_id, &late.task_id, late.attempt, &late.result_token);
                service.apply_results(&late.goal_id, &[result]).await?;
            }
        }
        _ => {
            // A plan request the planners could not handle, or a plan result the dispatchers
            // could not apply: the goal fails planning with the reason.
            let (goal_id, request_id) = if let Ok(request) = PlanRequest::decode(message.payload.clone())
                && !request.goal_id.is_empty()
            {
                (request.goal_id, request.request_id)
            } else if let Ok(result) = PlanResult::decode(message.payload.clone()) {
                (result.goal_id, result.request_id)
            } else {
                return Ok(());
            };
            let failed = PlanResult {
                goal_id,
                request_id,
                outcome: Some(hermes_proto::plan_result::Outcome::Error(error(&message.subject))),
                ..Default::default()
            };
            service.apply_plan_result(&failed).await?;
        }
    }
    Ok(())
}

/// Handles max-deliveries advisories until `shutdown`; replicas share them in a queue group.
pub(crate) async fn run(service: Arc<GoalService>, shutdown: CancellationToken) {
    let client = service.bus().client().clone();
    let subject = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>".to_owned();
    let group = service.bus().topology().dlq_queue_group();
    let mut advisories = match client.queue_subscribe(subject, group).await {
        Ok(s) => s,
        Err(e) => {
            warn!(error = %e, "cannot subscribe to max-deliveries advisories; poison messages stay in their streams");
            return;
        }
    };
    loop {
        let msg = tokio::select! {
            _ = shutdown.cancelled() => return,
            msg = advisories.next() => match msg { Some(m) => m, None => return },
        };
        match serde_json::from_slice::<MaxDeliveries>(&msg.payload) {
            Ok(advisory) => {
                if let Err(e) = poison(&service, advisory).await {
                    warn!(error = %e, "cannot dead-letter a poison message");
                }
            }
            Err(e) => warn!(error = %e, "unreadable max-deliveries advisory"),
        }
    }
}
