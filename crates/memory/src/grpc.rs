//! The gRPC `Memory` API. Artifacts stream in and out in chunks (the 50 MB ones too, under
//! gRPC's message limit); the rest maps one to one onto [`Memory`].

use std::pin::Pin;

use futures::{Stream, StreamExt};
use hermes_core::artifacts::ArtifactInfo;
use hermes_proto::memory_server::Memory as MemoryApi;
pub use hermes_proto::memory_server::MemoryServer;
use hermes_proto::put_artifact_chunk::Part;
use hermes_proto::{
    AppendTurnRequest, ArtifactChunk, ArtifactRequest, ContextReply, ContextRequest, DeleteArtifactReply,
    GetDocRequest, ListArtifactsReply, ListArtifactsRequest, ListCollectionsReply, ListCollectionsRequest,
    ListSessionsReply, ListSessionsRequest, MemoryDoc, MemoryRef, PutArtifactChunk, PutArtifactHeader,
    SearchReply, SearchRequest, SessionRequest, SessionState, UpsertReply, UpsertRequest,
};
use tonic::{Request, Response, Status, Streaming};

use crate::Memory;

/// Largest artifact accepted over gRPC.
pub const MAX_PUT_BYTES: usize = 256 * 1024 * 1024;

/// The gRPC face of a [`Memory`].
#[derive(Clone)]
pub struct MemoryGrpc {
    memory: Memory,
}

impl MemoryGrpc {
    pub fn new(memory: Memory) -> Self {
        Self { memory }
    }

    pub fn into_service(self) -> MemoryServer<MemoryGrpc> {
        MemoryServer::new(self).max_decoding_message_size(4 * 1024 * 1024)
    }
}

impl MemoryGrpc {
    /// The artifact the request names, when it is the request's tenant's: another tenant's is
    /// `NOT_FOUND`, as one that does not exist. The empty tenant (auth off) sees every artifact.
    async fn tenants_artifact(&self, request: ArtifactRequest) -> Result<ArtifactInfo, Status> {
        let info = self.memory.bus().artifacts().info(&request.r#ref).await?;
        if !request.tenant.is_empty() && info.tenant != request.tenant {
            return Err(hermes_core::Error::NotFound { what: "artifact", id: request.r#ref }.into());
        }
        Ok(info)
    }
}

/// A request whose data is its tenant's (see [`crate::tenancy`]).
trait Scoped {
    fn tenant_mut(&mut self) -> &mut String;
}

macro_rules! scoped_requests {
    ($($request:ty),* $(,)?) => {
        $(impl Scoped for $request {
            fn tenant_mut(&mut self) -> &mut String {
                &mut self.tenant
            }
        })*
    };
}

scoped_requests!(
    ArtifactRequest,
    ListArtifactsRequest,
    AppendTurnRequest,
    SessionRequest,
    ListSessionsRequest,
    UpsertRequest,
    SearchRequest,
    GetDocRequest,
    ListCollectionsRequest,
    ContextRequest,
);

/// The tenant the guard (`hermes_core::access::guard`) stamped on the request, if it passed one.
fn stamped_tenant<T>(request: &Request<T>) -> Option<String> {
    let value = request.metadata().get(hermes_core::grpc::TENANT_HEADER)?;
    value.to_str().ok().map(str::to_owned)
}

/// The request in the tenant the guard stamped; without a guard (memory on its own port with no
/// API tokens), in the tenant it names.
fn scoped<T: Scoped>(request: Request<T>) -> T {
    let stamped = stamped_tenant(&request);
    let mut inner = request.into_inner();
    if let Some(tenant) = stamped {
        *inner.tenant_mut() = tenant;
    }
    inner
}

/// Whether the guard marked the caller as one without the `secrets` role: goals' artifacts (and
/// their previews) are then redacted for it, as `GetGoalArtifact` redacts them.
fn redacts<T>(request: &Request<T>) -> bool {
    request.metadata().contains_key(hermes_core::grpc::REDACT_HEADER)
}

/// The reference of `info`; a goal's artifact's preview redacted when `redacted`.
fn to_ref(info: ArtifactInfo, redacted: bool) -> MemoryRef {
    let preview = match redacted && !info.goal_id.is_empty() {
        true => hermes_core::redact::redact_text(&info.preview).into_owned(),
        false => info.preview,
    };
    MemoryRef {
        r#ref: info.reference,
        content_type: info.content_type,
        size_bytes: info.size_bytes,
        preview,
        goal_id: info.goal_id,
        created_unix_ms: info.created_unix_ms,
        expires_unix_ms: info.expires_unix_ms,
        tenant: info.tenant,
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<ArtifactChunk, Status>> + Send>>;

#[tonic::async_trait]
impl MemoryApi for MemoryGrpc {
    async fn put_artifact(
        &self,
        request: Request<Streaming<PutArtifactChunk>>,
    ) -> Result<Response<MemoryRef>, Status> {
        let stamped = stamped_tenant(&request);
        let mut stream = request.into_inner();
        let mut header = None;
        let mut data = Vec::new();
        while let Some(chunk) = stream.next().await {
            match chunk?.part {
                Some(Part::Header(h)) if header.is_none() => header = Some(h),
                Some(Part::Header(_)) => return Err(Status::invalid_argument("the header came twice")),
                Some(Part::Data(bytes)) => {
                    if data.len() + bytes.len() > MAX_PUT_BYTES {
                        return Err(Status::invalid_argument(format!(
                            "artifacts over {MAX_PUT_BYTES} bytes are refused"
                        )));
                    }
                    data.extend_from_slice(&bytes);
                }
                None => {}
            }
        }
        let mut header: PutArtifactHeader =
            header.ok_or_else(|| Status::invalid_argument("the first message must be the header"))?;
        if let Some(tenant) = stamped {
            header.tenant = tenant;
        }
        let ttl = (header.ttl_secs > 0).then(|| std::time::Duration::from_secs(header.ttl_secs));
        let content_type = if header.content_type.is_empty() {
            "application/octet-stream"
        } else {
            header.content_type.as_str()
        };
        let artifacts = self.memory.bus().artifacts();
        let info = artifacts.put_owned(&data, content_type, &header.goal_id, &header.tenant, ttl).await?;
        Ok(Response::new(to_ref(info, false)))
    }

    type GetArtifactStream = ChunkStream;

    async fn get_artifact(&self, request: Request<ArtifactRequest>) -> Result<Response<ChunkStream>, Status> {
        let redacted = redacts(&request);
        let info = self.tenants_artifact(scoped(request)).await?;
        let mut bytes = self.memory.bus().artifacts().get(&info.reference).await?;
        if redacted && !info.goal_id.is_empty() {
            bytes = hermes_core::redact::artifact(bytes, &[]);
        }
        let chunks = hermes_core::artifacts::grpc_chunks(bytes).map(Ok);
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn stat_artifact(&self, request: Request<ArtifactRequest>) -> Result<Response<MemoryRef>, Status> {
        let redacted = redacts(&request);
        Ok(Response::new(to_ref(self.tenants_artifact(scoped(request)).await?, redacted)))
    }

    async fn list_artifacts(
        &self,
        request: Request<ListArtifactsRequest>,
    ) -> Result<Response<ListArtifactsReply>, Status> {
        let redacted = redacts(&request);
        let ListArtifactsRequest { goal_id, tenant } = scoped(request);
        let artifacts = self
            .memory
            .bus()
            .artifacts()
            .list()
            .await?
            .into_iter()
            .filter(|a| {
                (goal_id.is_empty() || a.goal_id == goal_id) && (tenant.is_empty() || a.tenant == tenant)
            })
            .map(|a| to_ref(a, redacted))
            .collect();
        Ok(Response::new(ListArtifactsReply { artifacts }))
    }

    async fn delete_artifact(
        &self,
        request: Request<ArtifactRequest>,
    ) -> Result<Response<DeleteArtifactReply>, Status> {
        let reference = self.tenants_artifact(scoped(request)).await?.reference;
        self.memory.bus().artifacts().delete(&reference).await?;
        Ok(Response::new(DeleteArtifactReply {}))
    }

    async fn append_turn(
        &self,
        request: Request<AppendTurnRequest>,
    ) -> Result<Response<SessionState>, Status> {
        Ok(Response::new(self.memory.append_turn(scoped(request)).await?))
    }

    async fn get_session(&self, request: Request<SessionRequest>) -> Result<Response<SessionState>, Status> {
        Ok(Response::new(self.memory.session(scoped(request)).await?))
    }

    async fn list_sessions(
        &self,
        request: Request<ListSessionsRequest>,
    ) -> Result<Response<ListSessionsReply>, Status> {
        Ok(Response::new(self.memory.list_sessions(scoped(request)).await?))
    }

    async fn upsert(&self, request: Request<UpsertRequest>) -> Result<Response<UpsertReply>, Status> {
        Ok(Response::new(self.memory.upsert(scoped(request)).await?))
    }

    async fn search(&self, request: Request<SearchRequest>) -> Result<Response<SearchReply>, Status> {
        Ok(Response::new(self.memory.search(scoped(request)).await?))
    }

    async fn get_doc(&self, request: Request<GetDocRequest>) -> Result<Response<MemoryDoc>, Status> {
        Ok(Response::new(self.memory.get_doc(scoped(request))?))
    }

    async fn list_collections(
        &self,
        request: Request<ListCollectionsRequest>,
    ) -> Result<Response<ListCollectionsReply>, Status> {
        Ok(Response::new(self.memory.collections(scoped(request))))
    }

    async fn context(&self, request: Request<ContextRequest>) -> Result<Response<ContextReply>, Status> {
        Ok(Response::new(self.memory.context(scoped(request)).await?))
    }
}
