//! The DLQ through the Dispatcher API (`hermes dlq ...`): dead letters listed, read and
//! replayed where they came from. The DLQ worker (`workers/dlq.rs`) fills it.

use async_nats::HeaderMap;
use hermes_core::bus::{DLQ_ORIGIN, DLQ_REASON, DLQ_SUBJECT};
use hermes_core::redact;
use hermes_core::{Bus, Error, Result};
use hermes_proto::{DeadLetter, PlanRequest, PlanResult, TaskMessage, TaskResult};
use prost::Message as _;
use tracing::info;

pub(crate) fn js_error(operation: &'static str, e: impl std::fmt::Display) -> Error {
    Error::JetStream { operation, reason: e.to_string() }
}

/// The `HERMES_DLQ` stream, read and replayed. Cheap to clone.
#[derive(Clone)]
pub struct DeadLetters {
    bus: Bus,
}

impl DeadLetters {
    pub fn new(bus: Bus) -> Self {
        Self { bus }
    }

    /// Dead letters, oldest first: `limit` of them, 100 when it is 0, at most 10,000.
    pub async fn list(&self, limit: usize) -> Result<Vec<DeadLetter>> {
        let limit = match limit {
            0 => 100,
            n => n.min(10_000),
        };
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

    pub async fn get(&self, sequence: u64) -> Result<DeadLetter> {
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
    pub async fn replay(&self, sequence: u64) -> Result<(String, u64)> {
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
        // A dead letter goes back only where its kind of message lives: anyone who may publish
        // to the DLQ names the subject, and a replay publishes with the dispatcher's rights.
        let kind = message.subject.rsplit('.').next().unwrap_or_default();
        let topology = self.bus.topology();
        let home = match kind {
            "task" => format!("{}.task.", topology.prefix()),
            "result" => format!("{}.result.", topology.prefix()),
            "plan_request" | "plan_result" | "plan" => format!("{}.plan.", topology.prefix()),
            "webhook" => format!("{}.webhook.", topology.prefix()),
            _ => String::new(),
        };
        if home.is_empty() || !subject.starts_with(&home) || subject.contains(['*', '>']) {
            return Err(Error::FailedPrecondition(format!(
                "dead letter {sequence} ({kind}) names `{}` as its subject, which is not a subject of its kind: it is not replayed",
                hermes_core::topology::truncate_for_message(&subject)
            )));
        }
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

/// A dead letter's payload, decoded as its kind (`hermes.dlq.<kind>`) says.
enum Payload {
    Task(TaskMessage),
    Result(TaskResult),
    PlanRequest(PlanRequest),
    PlanResult(PlanResult),
    /// Not a Hermes message kind: shown as text.
    Other,
}

impl Payload {
    fn decode(kind: &str, payload: &bytes::Bytes) -> std::result::Result<Payload, prost::DecodeError> {
        let payload = || payload.clone();
        Ok(match kind {
            "task" => Payload::Task(TaskMessage::decode(payload())?),
            "result" => Payload::Result(TaskResult::decode(payload())?),
            "plan_request" => Payload::PlanRequest(PlanRequest::decode(payload())?),
            "plan_result" | "plan" => match PlanResult::decode(payload()) {
                Ok(result) => Payload::PlanResult(result),
                Err(_) => Payload::PlanRequest(PlanRequest::decode(payload())?),
            },
            _ => Payload::Other,
        })
    }

    fn goal_id(&self) -> &str {
        match self {
            Payload::Task(m) => &m.goal_id,
            Payload::Result(m) => &m.goal_id,
            Payload::PlanRequest(m) => &m.goal_id,
            Payload::PlanResult(m) => &m.goal_id,
            Payload::Other => "",
        }
    }
}

fn dead_letter(
    sequence: u64,
    message: &async_nats::jetstream::message::StreamMessage,
    decode: bool,
) -> DeadLetter {
    let header = |name: &str| message.headers.get(name).map(|v| v.as_str().to_owned()).unwrap_or_default();
    let kind = message.subject.rsplit('.').next().unwrap_or_default();
    let payload = Payload::decode(kind, &message.payload);
    let goal_id = payload.as_ref().map(|p| p.goal_id().to_owned()).unwrap_or_default();
    let decoded = match (decode, payload) {
        (false, _) => String::new(),
        // Secrets never reach the decoded view: inputs (marked and by the rules), outputs and
        // texts are redacted, and a task's result token is left out.
        (true, Ok(Payload::Task(m))) => format!("{:#?}", redact::task(&m)),
        (true, Ok(Payload::Result(m))) => format!("{:#?}", redact::task_result(&m)),
        (true, Ok(Payload::PlanRequest(m))) => format!("{:#?}", redact::plan_request(&m)),
        (true, Ok(Payload::PlanResult(m))) => format!("{:#?}", redact::plan_result(&m)),
        (true, Ok(Payload::Other)) => {
            redact::redact_text(&String::from_utf8_lossy(&message.payload)).into_owned()
        }
        (true, Err(e)) => format!("(does not decode: {e}; {} bytes)", message.payload.len()),
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
        goal_id,
    }
}
