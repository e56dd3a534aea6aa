//! Poison messages. A task, result or plan message that reaches its consumer's MaxDeliver without
//! an ack is announced by the server's max-deliveries advisory; one dispatcher replica (a queue
//! group) copies it to `HERMES_DLQ` with the reason, removes it from its work queue, and fails the
//! node (or the planning) with `POISON_MESSAGE`, which the goal handles like any failure.
//! The DLQ can be listed, read and replayed through the Dispatcher API (`hermes dlq ...`).

use std::sync::Arc;

use async_nats::HeaderMap;
use futures::StreamExt;
use hermes_core::bus::{DLQ_ORIGIN, DLQ_REASON, DLQ_SUBJECT};
use hermes_core::error::wire_error;
use hermes_core::{Error, ErrorCode, Result};
use hermes_proto::{DeadLetter, PlanRequest, PlanResult, TaskMessage, TaskResult, TaskStatus};
use prost::Message as _;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::GoalService;

/// The advisory the server publishes when a message reached MaxDeliver.
#[derive(Debug, Deserialize)]
struct MaxDeliveries {
    stream: String,
    consumer: String,
    stream_seq: u64,
    deliveries: u64,
}

fn js_error(operation: &'static str, e: impl std::fmt::Display) -> Error {
    Error::JetStream { operation, reason: e.to_string() }
}

impl GoalService {
    /// Moves one message that reached MaxDeliver to the DLQ and fails what it belonged to.
    async fn poison(&self, advisory: MaxDeliveries) -> Result<()> {
        let topology = self.bus.topology();
        let kind = match advisory.stream.as_str() {
            s if s == topology.tasks_stream() => "task",
            s if s == topology.results_stream() => "result",
            s if s == topology.plans_stream() => "plan",
            _ => return Ok(()),
        };
        let js = self.bus.jetstream();
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
        self.bus
            .publish_dead_letter(kind, &message.subject, &origin, &reason, message.payload.clone())
            .await?;
        if let Err(e) = stream.delete_message(advisory.stream_seq).await {
            warn!(origin, error = %e, "cannot remove a dead-lettered message from its stream");
        }
        warn!(origin, kind, reason, event = "dead_lettered", "poison message moved to the dlq");
        let error = |subject: &str| wire_error(ErrorCode::PoisonMessage, format!("{subject}: {reason}"));
        let poisoned = |goal_id: &str, node_id: &str, task_id: &str, attempt: u32| TaskResult {
            goal_id: goal_id.to_owned(),
            node_id: node_id.to_owned(),
            task_id: task_id.to_owned(),
            attempt,
            status: TaskStatus::Failed as i32,
            error: Some(error(&message.subject)),
            ..Default::default()
        };
        match kind {
            "task" => {
                if let Ok(task) = TaskMessage::decode(message.payload.clone()) {
                    let result = poisoned(&task.goal_id, &task.node_id, &task.task_id, task.attempt);
                    self.apply_results(&task.goal_id, &[result]).await?;
                }
            }
            "result" => {
                if let Ok(late) = TaskResult::decode(message.payload.clone()) {
                    let result = poisoned(&late.goal_id, &late.node_id, &late.task_id, late.attempt);
                    self.apply_results(&late.goal_id, &[result]).await?;
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
                self.apply_plan_result(&failed).await?;
            }
        }
        Ok(())
    }

    /// Dead letters, oldest first.
    pub async fn dead_letters(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        let js = self.bus.jetstream();
        let mut stream =
            js.get_stream(self.bus.topology().dlq_stream()).await.map_err(|e| js_error("get dlq", e))?;
        let state = stream.info().await.map_err(|e| js_error("dlq info", e))?.state.clone();
        let (first, last) = (state.first_sequence, state.last_sequence);
        let mut out = Vec::new();
        let mut seq = first;
        while seq <= last && out.len() < limit && state.messages > 0 {
            if let Ok(message) = stream.get_raw_message(seq).await {
                out.push(dead_letter(seq, &message, false));
            }
            seq += 1;
        }
        Ok(out)
    }

    pub async fn dead_letter(&self, sequence: u64) -> Result<DeadLetter> {
        let stream = self
            .bus
            .jetstream()
            .get_stream(self.bus.topology().dlq_stream())
            .await
            .map_err(|e| js_error("get dlq", e))?;
        let message = stream
            .get_raw_message(sequence)
            .await
            .map_err(|_| Error::NotFound { what: "dead letter", id: sequence.to_string() })?;
        Ok(dead_letter(sequence, &message, true))
    }

    /// Publishes a dead letter again where it came from, then removes it from the DLQ.
    pub async fn replay_dead_letter(&self, sequence: u64) -> Result<(String, u64)> {
        let js = self.bus.jetstream();
        let stream =
            js.get_stream(self.bus.topology().dlq_stream()).await.map_err(|e| js_error("get dlq", e))?;
        let message = stream
            .get_raw_message(sequence)
            .await
            .map_err(|_| Error::NotFound { what: "dead letter", id: sequence.to_string() })?;
        let subject = message.headers.get(DLQ_SUBJECT).map(|v| v.as_str().to_owned()).ok_or_else(|| {
            Error::FailedPrecondition(format!("dead letter {sequence} does not say where it came from"))
        })?;
        let mut headers = HeaderMap::new();
        let msg_id = format!("replay:{sequence}:{}", hermes_core::now_unix_ms());
        headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id.as_str());
        let ack = js
            .publish_with_headers(subject.clone(), headers, message.payload.clone())
            .await
            .map_err(|e| js_error("replay", e))?
            .await
            .map_err(|e| js_error("replay", e))?;
        stream.delete_message(sequence).await.map_err(|e| js_error("remove replayed dead letter", e))?;
        info!(sequence, subject, event = "dead_letter_replayed", "dead letter replayed");
        Ok((subject, ack.sequence))
    }
}

fn dead_letter(
    sequence: u64,
    message: &async_nats::jetstream::message::StreamMessage,
    decode: bool,
) -> DeadLetter {
    let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned()).unwrap_or_default();
    let decoded = if !decode {
        String::new()
    } else {
        let kind = message.subject.rsplit('.').next().unwrap_or_default();
        let payload = message.payload.clone();
        let text = match kind {
            "task" => TaskMessage::decode(payload).map(|m| format!("{m:#?}")),
            "result" => TaskResult::decode(payload).map(|m| format!("{m:#?}")),
            "plan_request" => PlanRequest::decode(payload).map(|m| format!("{m:#?}")),
            "plan_result" | "plan" => PlanResult::decode(payload.clone())
                .map(|m| format!("{m:#?}"))
                .or_else(|_| PlanRequest::decode(payload).map(|m| format!("{m:#?}"))),
            _ => Ok(String::from_utf8_lossy(&message.payload).into_owned()),
        };
        text.unwrap_or_else(|e| format!("(does not decode: {e}; {} bytes)", message.payload.len()))
    };
    DeadLetter {
        sequence,
        subject: message.subject.to_string(),
        reason: header(DLQ_REASON),
        original_subject: header(DLQ_SUBJECT),
        origin: header(DLQ_ORIGIN),
        at_unix_ms: (message.time.unix_timestamp_nanos() / 1_000_000) as u64,
        size_bytes: message.payload.len() as u64,
        decoded,
    }
}

/// Handles max-deliveries advisories until `shutdown`; replicas share them in a queue group.
pub(crate) async fn poison_loop(service: Arc<GoalService>, shutdown: CancellationToken) {
    let client = service.bus.client().clone();
    let subject = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.>".to_owned();
    let group = service.bus.topology().dlq_queue_group();
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
                if let Err(e) = service.poison(advisory).await {
                    warn!(error = %e, "cannot dead-letter a poison message");
                }
            }
            Err(e) => warn!(error = %e, "unreadable max-deliveries advisory"),
        }
    }
}
