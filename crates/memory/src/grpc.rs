//! The gRPC `Memory` API. Artifacts stream in and out in chunks (the 50 MB ones too, under
//! gRPC's message limit); the rest maps one to one onto [`Memory`].

use std::pin::Pin;

use futures::{Stream, StreamExt};
use hermes_core::artifacts::{ArtifactInfo, CHUNK_SIZE};
use hermes_proto::memory_server::Memory as MemoryApi;
pub use hermes_proto::memory_server::MemoryServer;
use hermes_proto::put_artifact_chunk::Part;
use hermes_proto::{
    AppendTurnRequest, ArtifactChunk, ArtifactRequest, ContextReply, ContextRequest, DeleteArtifactReply,
    GetDocRequest, ListArtifactsReply, ListArtifactsRequest, ListCollectionsReply, ListCollectionsRequest,
    ListSessionsReply, ListSessionsRequest, MemoryDoc, MemoryRef, PutArtifactChunk, SearchReply,
    SearchRequest, SessionRequest, SessionState, UpsertReply, UpsertRequest,
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

fn to_ref(info: ArtifactInfo) -> MemoryRef {
    MemoryRef {
        r#ref: info.reference,
        content_type: info.content_type,
        size_bytes: info.size_bytes,
        preview: info.preview,
        goal_id: info.goal_id,
        created_unix_ms: info.created_unix_ms,
        expires_unix_ms: info.expires_unix_ms,
    }
}

type ChunkStream = Pin<Box<dyn Stream<Item = Result<ArtifactChunk, Status>> + Send>>;

#[tonic::async_trait]
impl MemoryApi for MemoryGrpc {
    async fn put_artifact(
        &self,
        request: Request<Streaming<PutArtifactChunk>>,
    ) -> Result<Response<MemoryRef>, Status> {
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
        let header =
            header.ok_or_else(|| Status::invalid_argument("the first message must be the header"))?;
        let ttl = (header.ttl_secs > 0).then(|| std::time::Duration::from_secs(header.ttl_secs));
        let content_type = if header.content_type.is_empty() {
            "application/octet-stream"
        } else {
            header.content_type.as_str()
        };
        let info = self.memory.bus().artifacts().put(&data, content_type, &header.goal_id, ttl).await?;
        Ok(Response::new(to_ref(info)))
    }

    type GetArtifactStream = ChunkStream;

    async fn get_artifact(&self, request: Request<ArtifactRequest>) -> Result<Response<ChunkStream>, Status> {
        let bytes = self.memory.bus().artifacts().get(&request.into_inner().r#ref).await?;
        let chunks: Vec<Result<ArtifactChunk, Status>> =
            bytes.chunks(CHUNK_SIZE * 32).map(|c| Ok(ArtifactChunk { data: c.to_vec() })).collect();
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn stat_artifact(&self, request: Request<ArtifactRequest>) -> Result<Response<MemoryRef>, Status> {
        let info = self.memory.bus().artifacts().info(&request.into_inner().r#ref).await?;
        Ok(Response::new(to_ref(info)))
    }

    async fn list_artifacts(
        &self,
        request: Request<ListArtifactsRequest>,
    ) -> Result<Response<ListArtifactsReply>, Status> {
        let goal_id = request.into_inner().goal_id;
        let artifacts = self
            .memory
            .bus()
            .artifacts()
            .list()
            .await?
            .into_iter()
            .filter(|a| goal_id.is_empty() || a.goal_id == goal_id)
            .map(to_ref)
            .collect();
        Ok(Response::new(ListArtifactsReply { artifacts }))
    }

    async fn delete_artifact(
        &self,
        request: Request<ArtifactRequest>,
    ) -> Result<Response<DeleteArtifactReply>, Status> {
        let reference = request.into_inner().r#ref;
        self.memory.bus().artifacts().info(&reference).await?;
        self.memory.bus().artifacts().delete(&reference).await?;
        Ok(Response::new(DeleteArtifactReply {}))
    }

    async fn append_turn(
        &self,
        request: Request<AppendTurnRequest>,
    ) -> Result<Response<SessionState>, Status> {
        Ok(Response::new(self.memory.append_turn(request.into_inner()).await?))
    }

    async fn get_session(&self, request: Request<SessionRequest>) -> Result<Response<SessionState>, Status> {
        Ok(Response::new(self.memory.session(request.into_inner()).await?))
    }

    async fn list_sessions(
        &self,
        request: Request<ListSessionsRequest>,
    ) -> Result<Response<ListSessionsReply>, Status> {
        Ok(Response::new(self.memory.list_sessions(request.into_inner()).await?))
    }

    async fn upsert(&self, request: Request<UpsertRequest>) -> Result<Response<UpsertReply>, Status> {
        Ok(Response::new(self.memory.upsert(request.into_inner()).await?))
    }

    async fn search(&self, request: Request<SearchRequest>) -> Result<Response<SearchReply>, Status> {
        Ok(Response::new(self.memory.search(request.into_inner()).await?))
    }

    async fn get_doc(&self, request: Request<GetDocRequest>) -> Result<Response<MemoryDoc>, Status> {
        Ok(Response::new(self.memory.get_doc(request.into_inner())?))
    }

    async fn list_collections(
        &self,
        request: Request<ListCollectionsRequest>,
    ) -> Result<Response<ListCollectionsReply>, Status> {
        Ok(Response::new(self.memory.collections(request.into_inner())))
    }

    async fn context(&self, request: Request<ContextRequest>) -> Result<Response<ContextReply>, Status> {
        Ok(Response::new(self.memory.context(request.into_inner()).await?))
    }
}
