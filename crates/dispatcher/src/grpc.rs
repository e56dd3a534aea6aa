//! The gRPC adapter: `hermes.v1.Dispatcher`. It only maps: requests to the caller [`Gate`]'s
//! operations, their answers to messages and their errors to statuses. A tonic interceptor
//! authenticates every call first and hands the handler its [`Caller`]. (Health and reflection
//! are the runtime's.)

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
use tonic::service::interceptor::InterceptedService;
use tonic::{Request, Response, Status};

use crate::gate::{Caller, Door, Gate, goal_id_arg, list_limit};
use crate::view::to_goal;

/// The interceptor that keeps each call's credentials for its handler, which has the gate
/// authenticate them first ([`Api::caller`]; an OIDC token may need its issuer's keys fetched,
/// which an interceptor cannot wait for): the call's `authorization`, its peer and its
/// `traceparent`.
#[derive(Clone)]
pub(crate) struct Authenticate;

/// What [`Authenticate`] keeps of a call.
#[derive(Clone)]
struct Credentials {
    authorization: Option<String>,
    peer: Option<std::net::SocketAddr>,
    trace: Option<hermes_core::trace::TraceContext>,
}

impl tonic::service::Interceptor for Authenticate {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let authorization =
            request.metadata().get("authorization").and_then(|v| v.to_str().ok()).map(str::to_owned);
        let trace = hermes_core::trace::from_metadata(request.metadata());
        let credentials = Credentials { authorization, peer: request.remote_addr(), trace };
        request.extensions_mut().insert(credentials);
        Ok(request)
    }
}

/// The `hermes.v1.Dispatcher` service behind its authenticating interceptor; watch streams end
/// when `shutdown` is cancelled.
pub(crate) fn server(
    gate: Arc<Gate>,
    shutdown: CancellationToken,
    max_message_bytes: usize,
) -> InterceptedService<DispatcherServer<Api>, Authenticate> {
    let authenticate = Authenticate;
    let server = DispatcherServer::new(Api { gate, shutdown }).max_decoding_message_size(max_message_bytes);
    InterceptedService::new(server, authenticate)
}

pub(crate) struct Api {
    gate: Arc<Gate>,
    /// Ends open watch streams on shutdown; the server waits for open streams before it stops.
    shutdown: CancellationToken,
}

type EventStream = Pin<Box<dyn Stream<Item = Result<Event, Status>> + Send>>;
type ChunkStream = Pin<Box<dyn Stream<Item = Result<hermes_proto::ArtifactChunk, Status>> + Send>>;

impl Api {
    /// The caller of the credentials the interceptor kept, authenticated by the gate
    /// (`UNAUTHENTICATED` should a call arrive without them), and the request's message.
    async fn caller<T>(&self, request: Request<T>) -> Result<(Caller, T), Status> {
        let (_, mut extensions, message) = request.into_parts();
        let credentials = extensions
            .remove::<Credentials>()
            .ok_or_else(|| Status::unauthenticated("the call was not authenticated"))?;
        let Credentials { authorization, peer, trace } = credentials;
        let caller = self.gate.authenticate(authorization.as_deref(), Door::Grpc, peer, trace).await?;
        Ok((caller, message))
    }
}

#[tonic::async_trait]
impl DispatcherApi for Api {
    async fn submit_goal(
        &self,
        request: Request<SubmitGoalRequest>,
    ) -> Result<Response<SubmitGoalResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let spec = req
            .spec
            .ok_or_else(|| Error::InvalidArgument { field: "spec".into(), reason: "is required".into() })?;
        let submitted = self.gate.submit(&caller, spec).await?;
        Ok(Response::new(SubmitGoalResponse {
            goal_id: submitted.goal_id,
            duplicate: submitted.duplicate,
            callback_secrets: submitted.callback_secrets,
        }))
    }

    async fn get_goal(&self, request: Request<GetGoalRequest>) -> Result<Response<Goal>, Status> {
        let (caller, req) = self.caller(request).await?;
        let state = self.gate.get(&caller, goal_id_arg(&req.goal_id)?).await?;
        Ok(Response::new(to_goal(state)))
    }

    type WatchGoalStream = EventStream;

    async fn watch_goal(&self, request: Request<WatchGoalRequest>) -> Result<Response<EventStream>, Status> {
        let (caller, req) = self.caller(request).await?;
        let events = self.gate.watch(&caller, goal_id_arg(&req.goal_id)?, req.after_seq).await?;
        let events = events.map(|event| event.map_err(Status::from));
        Ok(Response::new(Box::pin(events.take_until(self.shutdown.clone().cancelled_owned()))))
    }

    async fn cancel_goal(&self, request: Request<CancelGoalRequest>) -> Result<Response<Goal>, Status> {
        let (caller, req) = self.caller(request).await?;
        let state = self.gate.cancel(&caller, goal_id_arg(&req.goal_id)?, &req.reason).await?;
        Ok(Response::new(to_goal(state)))
    }

    async fn approve_tool_call(
        &self,
        request: Request<ApproveToolCallRequest>,
    ) -> Result<Response<ApproveToolCallResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let goal_id = goal_id_arg(&req.goal_id)?;
        let decision = self.gate.decide(&caller, goal_id, &req.call_id, req.approve, &req.note).await?;
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
        let (caller, req) = self.caller(request).await?;
        let limit = list_limit(req.limit as usize);
        let (goals, _) = self.gate.list(&caller, Default::default(), None, limit).await?;
        let goals = goals.into_iter().map(to_goal).collect();
        Ok(Response::new(ListGoalsResponse { goals }))
    }

    async fn list_dead_letters(
        &self,
        request: Request<ListDeadLettersRequest>,
    ) -> Result<Response<ListDeadLettersResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let limit = req.limit as usize;
        let dead_letters = self.gate.dead_letters(&caller, limit).await?;
        Ok(Response::new(ListDeadLettersResponse { dead_letters }))
    }

    async fn tool_cache_stats(
        &self,
        request: Request<hermes_proto::ToolCacheRequest>,
    ) -> Result<Response<hermes_proto::ToolCacheStatsResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let tool = (!req.tool.is_empty()).then_some(req.tool.as_str());
        let tools = self
            .gate
            .tool_cache_stats(&caller, tool)
            .await?
            .into_iter()
            .map(|(tool, s)| hermes_proto::ToolCacheEntries {
                tool,
                entries: s.entries,
                bytes: s.bytes,
                pending: s.pending,
                expired: s.expired,
            })
            .collect();
        Ok(Response::new(hermes_proto::ToolCacheStatsResponse { tools }))
    }

    async fn clear_tool_cache(
        &self,
        request: Request<hermes_proto::ToolCacheRequest>,
    ) -> Result<Response<hermes_proto::ClearToolCacheResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let tool = (!req.tool.is_empty()).then_some(req.tool.as_str());
        let removed = self.gate.clear_tool_cache(&caller, tool).await? as u64;
        Ok(Response::new(hermes_proto::ClearToolCacheResponse { removed }))
    }

    async fn get_dead_letter(
        &self,
        request: Request<DeadLetterRequest>,
    ) -> Result<Response<DeadLetter>, Status> {
        let (caller, req) = self.caller(request).await?;
        let sequence = req.sequence;
        Ok(Response::new(self.gate.dead_letter(&caller, sequence).await?))
    }

    async fn replay_dead_letter(
        &self,
        request: Request<DeadLetterRequest>,
    ) -> Result<Response<ReplayDeadLetterResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let sequence = req.sequence;
        let (subject, sequence) = self.gate.replay_dead_letter(&caller, sequence).await?;
        Ok(Response::new(ReplayDeadLetterResponse { subject, sequence }))
    }

    async fn list_audit(
        &self,
        request: Request<ListAuditRequest>,
    ) -> Result<Response<ListAuditResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let records = self.gate.audit(&caller, req.limit as usize, req.after_seq).await?;
        Ok(Response::new(ListAuditResponse { records }))
    }

    async fn list_model_exchanges(
        &self,
        request: Request<hermes_proto::ListModelExchangesRequest>,
    ) -> Result<Response<hermes_proto::ListModelExchangesResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let (exchanges, tool_exchanges) = self.gate.exchanges(&caller, goal_id_arg(&req.goal_id)?).await?;
        Ok(Response::new(hermes_proto::ListModelExchangesResponse { exchanges, tool_exchanges }))
    }

    async fn create_webhook(
        &self,
        request: Request<hermes_proto::CreateWebhookRequest>,
    ) -> Result<Response<hermes_proto::CreateWebhookResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let (endpoint, secret) = self.gate.create_webhook(&caller, &req.url, req.events, &req.secret).await?;
        Ok(Response::new(hermes_proto::CreateWebhookResponse { endpoint: Some(endpoint), secret }))
    }

    async fn list_webhooks(
        &self,
        request: Request<hermes_proto::ListWebhooksRequest>,
    ) -> Result<Response<hermes_proto::ListWebhooksResponse>, Status> {
        let (caller, _) = self.caller(request).await?;
        let endpoints = self.gate.webhooks(&caller).await?;
        Ok(Response::new(hermes_proto::ListWebhooksResponse { endpoints }))
    }

    async fn delete_webhook(
        &self,
        request: Request<hermes_proto::WebhookRequest>,
    ) -> Result<Response<hermes_proto::WebhookEndpoint>, Status> {
        let (caller, req) = self.caller(request).await?;
        Ok(Response::new(self.gate.delete_webhook(&caller, &req.id).await?))
    }

    async fn rotate_webhook_secret(
        &self,
        request: Request<hermes_proto::WebhookRequest>,
    ) -> Result<Response<hermes_proto::CreateWebhookResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let (endpoint, secret) = self.gate.rotate_webhook(&caller, &req.id).await?;
        Ok(Response::new(hermes_proto::CreateWebhookResponse { endpoint: Some(endpoint), secret }))
    }

    async fn list_webhook_deliveries(
        &self,
        request: Request<hermes_proto::ListWebhookDeliveriesRequest>,
    ) -> Result<Response<hermes_proto::ListWebhookDeliveriesResponse>, Status> {
        let (caller, req) = self.caller(request).await?;
        let deliveries =
            self.gate.webhook_deliveries(&caller, &req.goal_id, &req.endpoint_id, req.limit as usize).await?;
        Ok(Response::new(hermes_proto::ListWebhookDeliveriesResponse { deliveries }))
    }

    async fn resend_webhook_delivery(
        &self,
        request: Request<hermes_proto::WebhookDeliveryRequest>,
    ) -> Result<Response<hermes_proto::WebhookDelivery>, Status> {
        let (caller, req) = self.caller(request).await?;
        Ok(Response::new(self.gate.resend_webhook(&caller, &req.id).await?))
    }

    type GetGoalArtifactStream = ChunkStream;

    async fn get_goal_artifact(
        &self,
        request: Request<hermes_proto::GoalArtifactRequest>,
    ) -> Result<Response<ChunkStream>, Status> {
        let (caller, req) = self.caller(request).await?;
        let (_, bytes) = self.gate.artifact(&caller, goal_id_arg(&req.goal_id)?, &req.r#ref).await?;
        let chunks = hermes_core::artifacts::grpc_chunks(bytes).map(Ok);
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }
}
