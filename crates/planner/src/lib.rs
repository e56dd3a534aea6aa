//! The planner service. It takes `PlanRequest`s from the `HERMES_PLANS` work queue, asks the
//! planner model for a plan over the live capability catalogue, and checks the answer with the
//! same validator explicit plans go through. A plan that fails validation goes back to the model
//! with the structured reasons, at most `max_corrections` times; after that the goal fails with
//! `PLAN_INVALID` and the reasons. A model that says the goal cannot be done ends it in
//! `NEEDS_INPUT`. Parallel groups are computed from the DAG by the validator, never taken from the
//! model.
//!
//! For a replan the model returns only the replacement of the failed node and its dependents;
//! the planner merges it into the current plan (completed and unaffected nodes are kept as they
//! are) and validates the whole.

pub mod answer;
pub mod prompt;
pub mod service;

use std::sync::Arc;
use std::time::Duration;

use answer::Answer;
use hermes_clients::registry::Catalog;
use hermes_core::bus::{ConsumerSpec, Handled};
use hermes_core::error::wire_error;
use hermes_core::{Bus, Delivery, ErrorCode};
use hermes_llm::{ChatModel, ChatRequest, LlmError, Message, Usage};
use hermes_proto::plan_result::Outcome;
use hermes_proto::{PlanRequest, PlanResult, TokenUsage};
use tokio_util::sync::CancellationToken;
use tracing::{Instrument, info, warn};

/// Planner settings.
#[derive(Clone)]
pub struct PlannerConfig {
    pub model: Arc<dyn ChatModel>,
    /// Times an invalid plan is sent back to the model before the goal fails.
    pub max_corrections: u32,
    /// Task types shown to the model when the catalogue is larger.
    pub top_k: usize,
    pub temperature: f32,
    pub max_nodes: usize,
    /// Plan requests worked on at once.
    pub concurrency: usize,
    /// How long a plan request may go unacknowledged before another planner gets it (progress
    /// acks extend it while a model works); applied when the consumer is created.
    pub ack_wait: Duration,
}

impl std::fmt::Debug for PlannerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PlannerConfig")
            .field("model", &format_args!("{}/{}", self.model.provider(), self.model.model()))
            .field("max_corrections", &self.max_corrections)
            .field("top_k", &self.top_k)
            .finish_non_exhaustive()
    }
}

impl PlannerConfig {
    pub fn new(model: Arc<dyn ChatModel>) -> Self {
        Self {
            model,
            max_corrections: 2,
            top_k: 24,
            temperature: 0.2,
            max_nodes: hermes_core::plan::DEFAULT_MAX_NODES,
            concurrency: 4,
            ack_wait: Duration::from_secs(120),
        }
    }
}

/// Plans goals.
pub struct Planner {
    config: PlannerConfig,
    catalog: Catalog,
    memory: hermes_clients::memory::MemoryClient,
}

impl Planner {
    pub fn new(bus: Bus, config: PlannerConfig) -> Self {
        let memory = hermes_clients::memory::MemoryClient::new(&bus).with_timeout(Duration::from_secs(5));
        Self { catalog: Catalog::new(bus, Duration::from_secs(2)), config, memory }
    }

    /// The session window and recalled memories for a goal, from the memory service. Planning
    /// goes on without them when no memory service runs or it fails.
    async fn memory_context(&self, request: &PlanRequest) -> Option<hermes_proto::ContextReply> {
        let ask = hermes_proto::ContextRequest {
            session_id: request.session_id.clone(),
            goal_text: request.goal_text.clone(),
            goal_id: request.goal_id.clone(),
            top_k: 0,
            tenant: request.tenant.clone(),
        };
        match self.memory.context(&ask).await {
            Ok(reply) => Some(reply),
            Err(e) => {
                tracing::debug!(goal_id = %request.goal_id, error = %e, "planning without memory");
                None
            }
        }
    }

    /// Plans one request. `Err` only for model failures worth retrying later.
    pub async fn plan(&self, request: &PlanRequest) -> Result<PlanResult, LlmError> {
        let snapshot = match self.catalog.current().await {
            Ok(s) => s,
            Err(e) => return Err(LlmError::Transport(format!("catalogue: {e}"))),
        };
        let context = self.memory_context(request).await;
        plan_with(&self.config, &snapshot, request, context.as_ref()).await
    }

    /// Once agents have published task types, has the model read the system message every plan
    /// will start with, so the first goal does not wait for it (the local model reads a
    /// catalogue of the built-in tools in about 100 s on 2 cores; other models skip this). Only
    /// when the whole catalogue is shown (`top_k` covers it): otherwise each goal's system
    /// message differs.
    async fn warm(&self, shutdown: &CancellationToken) {
        let started = std::time::Instant::now();
        let snapshot = loop {
            match self.catalog.current().await {
                Ok(snapshot) if !snapshot.entries().is_empty() => break snapshot,
                _ if started.elapsed() > Duration::from_secs(120) => return,
                _ => {}
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_millis(500)) => {}
            }
        };
        if snapshot.entries().len() > self.config.top_k {
            return;
        }
        let entries: Vec<_> = snapshot.entries().iter().collect();
        let system = prompt::system_message(&entries);
        let reading = std::time::Instant::now();
        match self.config.model.warm(&system).await {
            Ok(()) => info!(secs = reading.elapsed().as_secs_f64(), "planner model has read the catalogue"),
            Err(e) => warn!(error = %e, "planner model warm-up failed"),
        }
    }
}

/// Plans one request against `snapshot` with the session `context`, without a bus: the model
/// conversation and its corrections. `Err` only for model failures worth retrying later. The
/// planner service and the planning benchmark (`make eval-planner`) both plan through it.
pub async fn plan_with(
    config: &PlannerConfig,
    snapshot: &hermes_clients::registry::CatalogSnapshot,
    request: &PlanRequest,
    context: Option<&hermes_proto::ContextReply>,
) -> Result<PlanResult, LlmError> {
    let mut usage = Usage::default();
    let mut result = PlanResult {
        goal_id: request.goal_id.clone(),
        request_id: request.request_id.clone(),
        ..Default::default()
    };
    let entries = prompt::select_entries(snapshot.entries(), &request.goal_text, config.top_k);
    let schema = prompt::answer_schema(&entries);
    let mut messages = vec![
        Message::system(prompt::system_message(&entries)),
        Message::user(prompt::user_message(request, context)),
    ];
    let mut problems: Vec<String> = Vec::new();
    let purpose = if request.replan.is_some() { "replan" } else { "plan" };
    for attempt in 0..=config.max_corrections {
        let asked = ChatRequest {
            messages: messages.clone(),
            response_schema: Some(("task_plan".into(), schema.clone())),
            temperature: Some(config.temperature),
            ..Default::default()
        };
        let started = std::time::Instant::now();
        let response = config.model.chat(asked.clone()).await;
        let response = match response {
            Ok(r) => {
                // The dispatcher records it with the result (docs/evaluation.md).
                let mut exchange = hermes_llm::record::exchange(purpose, &asked, &r, started.elapsed());
                exchange.goal_id = request.goal_id.clone();
                exchange.request_id = request.request_id.clone();
                result.exchanges.push(exchange);
                r
            }
            Err(e) if e.retryable() => return Err(e),
            Err(e) => {
                result.outcome = Some(Outcome::Error(wire_error(e.code(), e.to_string())));
                break;
            }
        };
        usage += response.usage;
        match answer::read_answer(&response, snapshot, config.max_nodes, request.replan.as_ref()) {
            Ok(reading) => {
                if !reading.repairs.is_empty() {
                    info!(goal_id = %request.goal_id, repairs = ?reading.repairs, "plan answer repaired");
                }
                result.repairs = reading.repairs;
                result.outcome = Some(match reading.answer {
                    Answer::NeedsInput(why) => Outcome::NeedsInput(why),
                    Answer::Plan(plan) => Outcome::Plan(plan),
                });
                break;
            }
            Err(found) => {
                problems = found;
                // Sent back for correction, unless this was the last try.
                result.corrections = (attempt + 1).min(config.max_corrections);
                warn!(goal_id = %request.goal_id, attempt, problems = ?problems, "plan rejected; asking for a correction");
                let said = response
                    .content
                    .clone()
                    .filter(|c| !c.trim().is_empty())
                    .or_else(|| response.tool_calls.first().map(|c| c.arguments.clone()))
                    .unwrap_or_default();
                messages.push(Message::assistant(said));
                messages.push(Message::user(format!(
                    "Your answer was rejected:\n{}\nCorrect it and answer with the JSON object only.",
                    problems.iter().map(|p| format!("- {p}")).collect::<Vec<_>>().join("\n")
                )));
            }
        }
    }
    if result.outcome.is_none() {
        result.corrections = config.max_corrections;
        result.outcome = Some(Outcome::Error(wire_error(
            ErrorCode::PlanInvalid,
            format!("no valid plan after {} corrections: {}", config.max_corrections, problems.join("; ")),
        )));
    }
    result.tokens = Some(TokenUsage { input_tokens: usage.input_tokens, output_tokens: usage.output_tokens });
    Ok(result)
}

/// Serves plan requests until `shutdown` is cancelled.
pub async fn run(bus: Bus, config: PlannerConfig, shutdown: CancellationToken) -> anyhow::Result<()> {
    let topology = bus.topology().clone();
    let consumer = bus
        .durable_consumer(ConsumerSpec {
            stream: topology.plans_stream(),
            name: topology.planner_consumer().to_owned(),
            filter_subject: topology.plan_request(),
            // A plan with corrections can take several model calls; progress acks extend this.
            ack_wait: config.ack_wait,
            max_deliver: 5,
            max_ack_pending: 1000,
        })
        .await?;
    let concurrency = config.concurrency.max(1);
    let planner = Arc::new(Planner::new(bus.clone(), config));
    let warming = planner.clone();
    let warm_shutdown = shutdown.clone();
    tokio::spawn(async move { warming.warm(&warm_shutdown).await });
    let mut messages = hermes_core::bus::pull(&consumer, concurrency).await?;
    info!(model = %planner.config.model.model(), "planner serving");
    hermes_core::bus::consume_concurrently(
        &bus,
        "plan_request",
        &mut messages,
        concurrency,
        &shutdown,
        |delivery| {
            let (bus, planner) = (bus.clone(), planner.clone());
            let span = tracing::info_span!(
                "plan",
                otel.kind = "consumer",
                goal_id = tracing::field::Empty,
                request_id = tracing::field::Empty
            );
            hermes_core::trace::follow(&span, delivery.trace.as_ref());
            async move { handle_request(&bus, &planner, &delivery).await }.instrument(span)
        },
    )
    .await;
    Ok(())
}

/// After this many deliveries a model that keeps failing ends the goal instead of being retried.
const MAX_MODEL_ATTEMPTS: i64 = 3;

/// Plans one request and says how to settle it: done once the plan result is published, again
/// later while the model is unreachable (a few times) or the result cannot be published.
async fn handle_request(bus: &Bus, planner: &Planner, delivery: &Delivery<PlanRequest>) -> Handled {
    let request = &delivery.message;
    let span = tracing::Span::current();
    span.record("goal_id", request.goal_id.as_str());
    span.record("request_id", request.request_id.as_str());
    info!(goal_id = %request.goal_id, request_id = %request.request_id, replan = request.replan.is_some(), event = "task_received", "plan request");
    let result = match planner.plan(request).await {
        Ok(result) => result,
        Err(e) if delivery.delivered() < MAX_MODEL_ATTEMPTS => {
            warn!(goal_id = %request.goal_id, error = %e, "planner model unavailable; will retry");
            return Handled::Retry { after: Duration::from_secs(2) };
        }
        Err(e) => PlanResult {
            goal_id: request.goal_id.clone(),
            request_id: request.request_id.clone(),
            outcome: Some(Outcome::Error(wire_error(e.code(), e.to_string()))),
            ..Default::default()
        },
    };
    let subject = bus.topology().plan_result();
    let msg_id = format!("result:{}", request.request_id);
    let trace = hermes_core::trace::propagate(delivery.trace.as_ref());
    match bus.publish(subject, &result, &msg_id, trace.as_ref()).await {
        Ok(_) => {
            info!(goal_id = %request.goal_id, corrections = result.corrections, event = "plan_created", "plan result published");
            Handled::Done
        }
        Err(e) => {
            warn!(error = %e, "cannot publish the plan result; will retry");
            Handled::Retry { after: Duration::from_secs(1) }
        }
    }
}
