//! The gRPC adapter: `hermes.v1.Registry` (ListAgents, WatchAgents).

use std::pin::Pin;

use futures::{Stream, StreamExt};
use hermes_proto::registry_server::Registry as RegistryApi;
pub use hermes_proto::registry_server::RegistryServer;
use hermes_proto::{AgentChange, AgentEvent, ListAgentsRequest, ListAgentsResponse, WatchAgentsRequest};
use tokio_stream::wrappers::BroadcastStream;
use tokio_util::sync::CancellationToken;
use tonic::{Request, Response, Status};

use crate::Registry;

/// Serves a [`Registry`] over gRPC.
#[derive(Clone)]
pub struct RegistryGrpc {
    registry: Registry,
    /// Ends open WatchAgents streams on shutdown, so the server can stop.
    shutdown: CancellationToken,
}

impl RegistryGrpc {
    pub fn new(registry: Registry, shutdown: CancellationToken) -> Self {
        Self { registry, shutdown }
    }

    /// The tonic service, to add to a server.
    pub fn into_service(self) -> RegistryServer<RegistryGrpc> {
        RegistryServer::new(self)
    }
}

type AgentStream = Pin<Box<dyn Stream<Item = Result<AgentEvent, Status>> + Send>>;

#[tonic::async_trait]
impl RegistryApi for RegistryGrpc {
    async fn list_agents(
        &self,
        _: Request<ListAgentsRequest>,
    ) -> Result<Response<ListAgentsResponse>, Status> {
        Ok(Response::new(ListAgentsResponse { agents: self.registry.agents() }))
    }

    type WatchAgentsStream = AgentStream;

    async fn watch_agents(&self, _: Request<WatchAgentsRequest>) -> Result<Response<AgentStream>, Status> {
        // Subscribe before taking the snapshot so no change falls between the two.
        let live = BroadcastStream::new(self.registry.subscribe()).filter_map(|change| async move {
            match change {
                Ok(event) => Some(Ok(event)),
                // A watcher that falls too far behind is told so and must re-list.
                Err(e) => Some(Err(Status::data_loss(format!("DATA_LOSS: watcher fell behind: {e}")))),
            }
        });
        let snapshot: Vec<Result<AgentEvent, Status>> = self
            .registry
            .agents()
            .into_iter()
            .map(|agent| {
                Ok(AgentEvent {
                    change: AgentChange::Snapshot as i32,
                    agent: Some(agent),
                    reason: String::new(),
                })
            })
            .collect();
        let events = futures::stream::iter(snapshot).chain(live);
        Ok(Response::new(Box::pin(events.take_until(self.shutdown.clone().cancelled_owned()))))
    }
}
