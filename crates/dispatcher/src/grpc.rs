//! The gRPC adapter: `hermes.v1.Dispatcher`. It only maps: requests to [`GoalService`] and
//! [`DeadLetters`] calls, their errors to statuses. (Health and reflection are the runtime's.)

use std::pin::Pin;
use std::sync::Arc;

use futures::{Stream, StreamExt};
use hermes_core::Error;
use hermes_proto::dispatcher_server::{Dispatcher as DispatcherApi, DispatcherServer};
use hermes_proto::{
    ApproveToolCallRequest, ApproveToolCallResponse, CancelGoalRequest, DeadLetter, DeadLetterRequest, Event,
    GetGoalRequest, Goal, ListAuditRequest, ListAuditResponse, ListDeadLettersRequest,
    ListDeadLettersResponse, ListGoalsRequest, ListGoalsResponse, ReplayDeadLetterResponse,
    SubmitGoalRequest, SubmitGoalResponse, WatchGoalRequest,
};
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};
use tracing::Instrument as _;

use crate::access::Principal;
use crate::view::to_goal;
use crate::{DeadLetters, GoalService};

/// The `hermes.v1.Dispatcher` service; watch streams end when `shutdown` is cancelled.
pub(crate) fn server(
    service: Arc<GoalService>,
    dead_letters: DeadLetters,
    shutdown: CancellationToken,
    max_message_bytes: usize,
) -> DispatcherServer<Api> {
    DispatcherServer::new(Api { service, dead_letters, shutdown })
        .max_decoding_message_size(max_message_bytes)
}

pub(crate) struct Api {
    service: Arc<GoalService>,
    dead_letters: DeadLetters,
    /// Ends open watch streams on shutdown; the server waits for open streams before it stops.
    shutdown: CancellationToken,
}

use crate::gate::goal_id_arg;

type EventStream = Pin<Box<dyn Stream<Item = Result<Event, Status>> + Send>>;
type ChunkStream = Pin<Box<dyn Stream<Item = Result<hermes_proto::ArtifactChunk, Status>> + Send>>;

impl Api {
    /// The caller, from the request's `authorization` metadata (`Bearer <token>`); every method
    /// calls this first: authentication, then the bus's state ([`crate::gate::admit`]).
    fn who<T>(&self, request: &Request<T>) -> Result<Principal, Error> {
        let authorization = request.metadata().get("authorization").and_then(|v| v.to_str().ok());
        crate::gate::admit(&self.service, authorization, "grpc", request.remote_addr())
    }
}

#[tonic::async_trait]
impl DispatcherApi for Api {
    async fn submit_goal(
        &self,
        request: Request<SubmitGoalRequest>,
    ) -> Result<Response<SubmitGoalResponse>, Status> {
        // The goal's trace starts here, under the caller's span when it sent a `traceparent`.
        let span = tracing::info_span!(
            "submit_goal",
            otel.name = "SubmitGoal",
            otel.kind = "server",
            goal_id = tracing::field::Empty
        );
        hermes_core::trace::follow(&span, hermes_core::trace::from_metadata(request.metadata()).as_ref());
        let who = self.who(&request)?;
        let spec = request
            .into_inner()
            .spec
            .ok_or_else(|| Error::InvalidArgument { field: "spec".into(), reason: "is required".into() })?;
        let submitted = self.service.submit_as(&who, spec).instrument(span).await?;
        Ok(Response::new(SubmitGoalResponse { goal_id: submitted.goal_id, duplicate: submitted.duplicate }))
    }

    async fn get_goal(&self, request: Request<GetGoalRequest>) -> Result<Response<Goal>, Status> {
        let who = self.who(&request)?;
        let req = request.into_inner();
        let state = self.service.get_as(&who, goal_id_arg(&req.goal_id)?).await?;
        Ok(Response::new(to_goal(state)))
    }

    type WatchGoalStream = EventStream;

    async fn watch_goal(&self, request: Request<WatchGoalRequest>) -> Result<Response<EventStream>, Status> {
        let who = self.who(&request)?;
        let client = request.remote_addr().map(|a| a.ip().to_string()).unwrap_or_default();
        let req = request.into_inner();
        let events = self.service.watch_as(&who, goal_id_arg(&req.goal_id)?, req.after_seq, &client).await?;
        let events = events.map(|event| event.map_err(Status::from));
        Ok(Response::new(Box::pin(events.take_until(self.shutdown.clone().cancelled_owned()))))
    }

    async fn cancel_goal(&self, request: Request<CancelGoalRequest>) -> Result<Response<Goal>, Status> {
        let who = self.who(&request)?;
        let req = request.into_inner();
        let state = self.service.cancel_as(&who, goal_id_arg(&req.goal_id)?, &req.reason).await?;
        Ok(Response::new(to_goal(state)))
    }

    async fn approve_tool_call(
        &self,
        request: Request<ApproveToolCallRequest>,
    ) -> Result<Response<ApproveToolCallResponse>, Status> {
        let who = self.who(&request)?;
        let req = request.into_inner();
        let goal_id = goal_id_arg(&req.goal_id)?;
        hermes_core::ids::check_id("call_id", &req.call_id, 256, hermes_core::ids::IdShape::Dotted)?;
        let decision =
            self.service.decide_approval_as(&who, goal_id, &req.call_id, req.approve, &req.note).await?;
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
        let who = self.who(&request)?;
        let limit = GoalService::list_limit(request.into_inner().limit as usize);
        let goals = self.service.list_as(&who, limit).await?.into_iter().map(to_goal).collect();
        Ok(Response::new(ListGoalsResponse { goals }))
    }

    async fn list_dead_letters(
        &self,
        request: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        let who = self.who(&request)?;
        let limit = request.into_inner().limit as usize;
        let dead_letters = self.service.dead_letters_as(&who, &self.dead_letters, limit).await?;
        Ok(Response::new(ListDeadLettersResponse { dead_letters }))
    }

    async fn get_dead_letter(
        &self,
        request: Request<DeadLetterRequest>,
    ) -> Result<Response<DeadLetter>, Status> {
        let who = self.who(&request)?;
        let sequence = request.into_inner().sequence;
        Ok(Response::new(self.service.dead_letter_as(&who, &self.dead_letters, sequence).await?))
    }

    async fn replay_dead_letter(
        &self,
        request: Request<DeadLetterRequest>,
    ) -> Result<Response<ReplayDeadLetterResponse>, Status> {
        let who = self.who(&request)?;
        let sequence = request.into_inner().sequence;
        let (subject, sequence) =
            self.service.replay_dead_letter_as(&who, &self.dead_letters, sequence).await?;
        Ok(Response::new(ReplayDeadLetterResponse { subject, sequence }))
    }

    async fn list_audit(
        &self,
        request: Request<ListAuditRequest>,
    ) -> Result<Response<ListAuditResponse>, Status> {
        let who = self.who(&request)?;
        let req = request.into_inner();
        let records = self.service.audit().list(&who, req.limit as usize, req.after_seq).await?;
        Ok(Response::new(ListAuditResponse { records }))
    }

    async fn list_model_exchanges(
        &self,
        request: Request<hermes_proto::ListModelExchangesRequest>,
    ) -> Result<Response<hermes_proto::ListModelExchangesResponse>, Status> {
        let who = self.who(&request)?;
        let goal_id = request.into_inner().goal_id;
        let (exchanges, tool_exchanges) = self.service.model_exchanges_as(&who, &goal_id).await?;
        Ok(Response::new(hermes_proto::ListModelExchangesResponse { exchanges, tool_exchanges }))
    }

    type GetGoalArtifactStream = ChunkStream;

    async fn get_goal_artifact(
        &self,
        request: Request<hermes_proto::GoalArtifactRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let who = self.who(&request)?;
        let req = request.into_inner();
        let (_, bytes) = self.service.goal_artifact_as(&who, goal_id_arg(&req.goal_id)?, &req.r#ref).await?;
        let chunks = hermes_core::artifacts::grpc_chunks(bytes).map(Ok);
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }
}
