//! The gRPC adapter: `hermes.v1.Dispatcher`, plus the standard health and reflection services.

use std::pin::Pin;
use std::sync::Arc;

use async_nats::jetstream::consumer::{DeliverPolicy, pull};
use futures::{Stream, StreamExt};
use hermes_core::Error;
use hermes_proto::dispatcher_server::{Dispatcher as DispatcherApi, DispatcherServer};
use hermes_proto::{
    ApproveToolCallRequest, ApproveToolCallResponse, CancelGoalRequest, DeadLetter, DeadLetterRequest, Event,
    GetGoalRequest, Goal, GoalState, ListDeadLettersRequest, ListDeadLettersResponse, ListGoalsRequest,
    ListGoalsResponse, ReplayDeadLetterResponse, SubmitGoalRequest, SubmitGoalResponse, WatchGoalRequest,
};
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;
use tracing::info;

use crate::GoalService;
use crate::engine::is_terminal_event;

/// The `hermes.v1.Dispatcher` service; watch streams end when `shutdown` is cancelled.
pub(crate) fn server(
    service: Arc<GoalService>,
    shutdown: CancellationToken,
    max_message_bytes: usize,
) -> DispatcherServer<Api> {
    DispatcherServer::new(Api { service, shutdown }).max_decoding_message_size(max_message_bytes)
}

pub(crate) struct Api {
    service: Arc<GoalService>,
    /// Ends open watch streams on shutdown; the server waits for open streams before it stops.
    shutdown: CancellationToken,
}

impl Api {
    /// Answers UNAVAILABLE at once while the NATS connection is down, rather than letting the
    /// request wait out JetStream timeouts; the client retries.
    fn nats_up(&self) -> Result<(), Status> {
        use async_nats::connection::State;
        match self.service.bus.client().connection_state() {
            State::Connected => Ok(()),
            _ => Err(Status::unavailable("UNAVAILABLE: NATS is unreachable; the dispatcher is reconnecting")),
        }
    }
}

fn goal_id_arg(goal_id: &str) -> Result<&str, Status> {
    hermes_core::ids::check_id("goal_id", goal_id, 128, hermes_core::ids::IdShape::Word)?;
    Ok(goal_id)
}

/// The client's view of a goal.
pub fn to_goal(state: GoalState) -> Goal {
    Goal {
        goal_id: state.goal_id,
        status: state.status,
        output_json: state.output_json,
        error: state.error,
        nodes: state.nodes,
        created_unix_ms: state.created_unix_ms,
        updated_unix_ms: state.updated_unix_ms,
        tokens: state.tokens,
        cost_usd: state.cost_usd,
        max_tokens: state.spec.as_ref().map(|s| s.max_tokens).unwrap_or_default(),
        max_cost_usd: state.spec.as_ref().map(|s| s.max_cost_usd).unwrap_or_default(),
        session_id: state.spec.map(|s| s.session_id).unwrap_or_default(),
        plan: state.plan,
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<Event, Status>> + Send>>;

#[tonic::async_trait]
impl DispatcherApi for Api {
    async fn submit_goal(
        &self,
        request: Request<SubmitGoalRequest>,
    ) -> Result<Response<SubmitGoalResponse>, Status> {
        self.nats_up()?;
        // The goal's trace starts here, under the caller's span when it sent a `traceparent`.
        let span = tracing::info_span!(
            "submit_goal",
            otel.name = "SubmitGoal",
            otel.kind = "server",
            goal_id = tracing::field::Empty
        );
        hermes_core::trace::follow(&span, hermes_core::trace::from_metadata(request.metadata()).as_ref());
        let spec = request
            .into_inner()
            .spec
            .ok_or_else(|| Error::InvalidArgument { field: "spec".into(), reason: "is required".into() })?;
        let submitted = self.service.submit(spec).instrument(span).await?;
        Ok(Response::new(SubmitGoalResponse { goal_id: submitted.goal_id, duplicate: submitted.duplicate }))
    }

    async fn get_goal(&self, request: Request<GetGoalRequest>) -> Result<Response<Goal>, Status> {
        self.nats_up()?;
        let req = request.into_inner();
        let state = self.service.get(goal_id_arg(&req.goal_id)?).await?;
        Ok(Response::new(to_goal(state)))
    }

    type WatchGoalStream = EventStream;

    async fn watch_goal(&self, request: Request<WatchGoalRequest>) -> Result<Response<EventStream>, Status> {
        self.nats_up()?;
        let req = request.into_inner();
        let goal_id = goal_id_arg(&req.goal_id)?.to_owned();
        // Fail with NOT_FOUND rather than wait forever on a goal that never existed.
        self.service.get(&goal_id).await?;
        let bus = &self.service.bus;
        let stream = bus
            .jetstream()
            .get_stream(bus.topology().events_stream())
            .await
            .map_err(|e| Status::unavailable(format!("UNAVAILABLE: events stream: {e}")))?;
        let consumer = stream
            .create_consumer(pull::OrderedConfig {
                filter_subject: bus.topology().event(&goal_id),
                deliver_policy: DeliverPolicy::All,
                ..Default::default()
            })
            .await
            .map_err(|e| Status::unavailable(format!("UNAVAILABLE: events consumer: {e}")))?;
        let messages = consumer
            .messages()
            .await
            .map_err(|e| Status::unavailable(format!("UNAVAILABLE: events: {e}")))?;
        info!(goal_id = %goal_id, "watch started");
        // Resuming after `after_seq`: everything up to and including that event is skipped (agent
        // events, with no `seq`, among them), so the watcher gets exactly what came after.
        let after = req.after_seq;
        let events = futures::stream::unfold(
            (messages, false, after),
            |(mut messages, done, mut skip_to)| async move {
                if done {
                    return None;
                }
                loop {
                    match messages.next().await? {
                        Ok(msg) => match Event::decode(msg.payload.clone()) {
                            Ok(event) => {
                                let terminal = is_terminal_event(&event);
                                if skip_to > 0 {
                                    if event.seq == 0 || event.seq < skip_to {
                                        if terminal {
                                            return None;
                                        }
                                        continue;
                                    }
                                    let seen = event.seq == skip_to;
                                    skip_to = 0;
                                    if seen {
                                        if terminal {
                                            return None;
                                        }
                                        continue;
                                    }
                                }
                                return Some((Ok(event), (messages, terminal, 0)));
                            }
                            // Events are written only by dispatchers; skip anything else.
                            Err(_) => continue,
                        },
                        Err(e) => {
                            return Some((
                                Err(Status::unavailable(format!("UNAVAILABLE: {e}"))),
                                (messages, true, 0),
                            ));
                        }
                    }
                }
            },
        );
        Ok(Response::new(Box::pin(events.take_until(self.shutdown.clone().cancelled_owned()))))
    }

    async fn cancel_goal(&self, request: Request<CancelGoalRequest>) -> Result<Response<Goal>, Status> {
        self.nats_up()?;
        let req = request.into_inner();
        let state = self.service.cancel(goal_id_arg(&req.goal_id)?, &req.reason).await?;
        Ok(Response::new(to_goal(state)))
    }

    async fn approve_tool_call(
        &self,
        request: Request<ApproveToolCallRequest>,
    ) -> Result<Response<ApproveToolCallResponse>, Status> {
        self.nats_up()?;
        let req = request.into_inner();
        let goal_id = goal_id_arg(&req.goal_id)?;
        hermes_core::ids::check_id("call_id", &req.call_id, 256, hermes_core::ids::IdShape::Dotted)?;
        let decision = self.service.decide_approval(goal_id, &req.call_id, req.approve, &req.note).await?;
        Ok(Response::new(ApproveToolCallResponse {
            approved: decision.approved,
            timed_out: decision.timed_out,
            note: decision.note,
        }))
    }

    async fn list_goals(
        &self,
        request: Request<ListGoalsRequest>,
    ) -> Result<Response<ListGoalsResponse>, Status> {
        self.nats_up()?;
        let limit = match request.into_inner().limit {
            0 => 100,
            n => n.min(1000) as usize,
        };
        let goals = self.service.list(limit).await?.into_iter().map(to_goal).collect();
        Ok(Response::new(ListGoalsResponse { goals }))
    }

    async fn list_dead_letters(
        &self,
        request: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        self.nats_up()?;
        let limit = match request.into_inner().limit {
            0 => 100,
            n => n.min(10_000) as usize,
        };
        Ok(Response::new(ListDeadLettersResponse { dead_letters: self.service.dead_letters(limit).await? }))
    }

    async fn get_dead_letter(
        &self,
        request: Request<DeadLetterRequest>,
    ) -> Result<Response<DeadLetter>, Status> {
        self.nats_up()?;
        Ok(Response::new(self.service.dead_letter(request.into_inner().sequence).await?))
    }

    async fn replay_dead_letter(
        &self,
        request: Request<DeadLetterRequest>,
    ) -> Result<Response<ReplayDeadLetterResponse>, Status> {
        self.nats_up()?;
        let (subject, sequence) = self.service.replay_dead_letter(request.into_inner().sequence).await?;
        Ok(Response::new(ReplayDeadLetterResponse { subject, sequence }))
    }
}
