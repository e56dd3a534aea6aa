//! Artifacts: payloads too large to travel inline, kept by reference in the `hermes_artifacts`
//! JetStream object store. A task output or input over the inline limit (64 KiB by default,
//! always below the server's `max_payload`) is stored here and replaced on the wire by a small
//! stub:
//!
//! ```json
//! {"$artifact": "art-0193...", "size_bytes": 5242880, "content_type": "application/json", "preview": "..."}
//! ```
//!
//! A `$ref` to a node whose output is an artifact resolves to `{"$artifact": ref, "path": [...]}`
//! (the dispatcher never loads the payload); the executor replaces every such stub in a task's
//! inputs with the value it stands for before the tool runs ([`Artifacts::resolve_value`]).
//! Objects are written in 32 KiB chunks, so no NATS message of a transfer exceeds the limit.
//!
//! Artifacts are scoped to their goal: a task resolves only stubs naming artifacts its own goal
//! produced, and a submitted plan may not contain stubs at all (they are made by Hermes, never
//! written by hand: [`stub_pointers`] finds them for validation). Resolution is bounded before
//! anything is loaded: each stub counts with its artifact's full size, and the total must stay
//! within [`MAX_RESOLVED_INPUT_BYTES`].
//! Each artifact records its content type, goal and expiry in the object's metadata; the bucket's
//! max age is the retention ceiling, and the memory service deletes artifacts past their own TTL.

use std::collections::HashMap;
use std::time::Duration;

use async_nats::jetstream::object_store::{self, ObjectMetadata, ObjectStore};
use async_nats::jetstream::{self, stream::Stream};
use futures::StreamExt;
use hermes_proto::{
    MemoryRef, TaskArtifactCommit, TaskArtifactInfo, TaskArtifactPart, TaskArtifactPiece, TaskArtifactRequest,
};
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

use crate::broker::TaskBroker;
use crate::{Error, Result, now_unix_ms};

/// Largest payload sent inline; bigger ones become artifacts.
pub const DEFAULT_INLINE_LIMIT: usize = 64 * 1024;
/// Chunk size of artifact transfers; below the inline limit.
pub const CHUNK_SIZE: usize = 32 * 1024;
/// The stub key naming an artifact.
pub const ARTIFACT_KEY: &str = "$artifact";
/// Most bytes a task's inputs may take once their artifact stubs are resolved; each stub counts
/// with the full size of the artifact it names, so a node with many references to one large
/// output is refused before it is materialised.
pub const MAX_RESOLVED_INPUT_BYTES: u64 = 96 * 1024 * 1024;
/// Characters of content kept in a stub's preview.
const PREVIEW_CHARS: usize = 200;

/// What is known about one artifact.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactInfo {
    pub reference: String,
    pub content_type: String,
    pub size_bytes: u64,
    pub goal_id: String,
    pub created_unix_ms: u64,
    /// 0: kept until the bucket's retention ends.
    pub expires_unix_ms: u64,
    pub preview: String,
    /// The tenant that owns it: the one that stored it through the Memory API, or the goal's
    /// tenant for a goal's artifact; empty for neither (a goal submitted without a tenant).
    pub tenant: String,
}

/// The artifact store. Cheap to clone.
#[derive(Clone)]
pub struct Artifacts {
    backend: Backend,
    inline_limit: usize,
}

#[derive(Clone)]
enum Backend {
    /// The object store itself, and its stream, from which a brokered read takes chunks.
    Store(std::sync::Arc<(ObjectStore, Stream<()>)>),
    /// One task's goal's artifacts, through the memory service (an agent with its own identity).
    Brokered(TaskBroker),
    /// Neither: an agent's identity asked for the whole store (it may not read it).
    Closed,
}

fn object_error(operation: &'static str, e: impl std::fmt::Display) -> Error {
    Error::JetStream { operation, reason: e.to_string() }
}

fn closed() -> Error {
    Error::FailedPrecondition(
        "this connection is an agent's own identity: it reaches artifacts only through a task's token (Bus::task_artifacts)"
            .into(),
    )
}

impl Artifacts {
    /// The store `store` of the bucket `bucket`, whose stream `OBJ_<bucket>` is read on `js`.
    pub async fn new(
        js: &jetstream::Context,
        bucket: &str,
        store: ObjectStore,
        inline_limit: usize,
    ) -> Result<Self> {
        let stream = js
            .get_stream_no_info(format!("OBJ_{bucket}"))
            .await
            .map_err(|e| object_error("open the artifacts' stream", e))?;
        Ok(Self { backend: Backend::Store(std::sync::Arc::new((store, stream))), inline_limit })
    }

    /// One task's goal's artifacts through the memory service (see [`crate::broker`]).
    pub fn brokered(broker: TaskBroker, inline_limit: usize) -> Self {
        Self { backend: Backend::Brokered(broker), inline_limit }
    }

    /// A store every operation of which is refused, for a connection that may not read it.
    pub(crate) fn closed(inline_limit: usize) -> Self {
        Self { backend: Backend::Closed, inline_limit }
    }

    fn store(&self) -> Result<&ObjectStore> {
        match &self.backend {
            Backend::Store(held) => Ok(&held.0),
            Backend::Brokered(_) | Backend::Closed => Err(closed()),
        }
    }

    /// Payloads longer than this are offloaded.
    pub fn inline_limit(&self) -> usize {
        self.inline_limit
    }

    /// Stores `bytes` and returns its info. `ttl` of `None` keeps it for the bucket's retention.
    pub async fn put(
        &self,
        bytes: &[u8],
        content_type: &str,
        goal_id: &str,
        ttl: Option<Duration>,
    ) -> Result<ArtifactInfo> {
        self.put_owned(bytes, content_type, goal_id, "", ttl).await
    }

    /// [`Artifacts::put`], recording `tenant` as the artifact's owner (empty: none). Through a
    /// task's broker the goal and tenant are the task token's, whatever is passed.
    pub async fn put_owned(
        &self,
        bytes: &[u8],
        content_type: &str,
        goal_id: &str,
        tenant: &str,
        ttl: Option<Duration>,
    ) -> Result<ArtifactInfo> {
        if let Backend::Brokered(broker) = &self.backend {
            return brokered_put(broker, bytes, content_type, ttl).await;
        }
        let reference = format!("art-{}", uuid::Uuid::now_v7().simple());
        self.put_named(&reference, bytes, content_type, goal_id, tenant, ttl).await
    }

    /// Stores `bytes` under `reference` in the store itself.
    async fn put_named(
        &self,
        reference: &str,
        bytes: &[u8],
        content_type: &str,
        goal_id: &str,
        tenant: &str,
        ttl: Option<Duration>,
    ) -> Result<ArtifactInfo> {
        let store = self.store()?;
        let reference = reference.to_owned();
        let created = now_unix_ms();
        let expires = ttl.map(|t| created + t.as_millis() as u64).unwrap_or(0);
        let preview = preview_of(bytes);
        let metadata: HashMap<String, String> = [
            ("content_type", content_type.to_owned()),
            ("goal_id", goal_id.to_owned()),
            ("created_unix_ms", created.to_string()),
            ("expires_unix_ms", expires.to_string()),
            ("preview", preview.clone()),
            ("tenant", tenant.to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let meta = ObjectMetadata {
            name: reference.clone(),
            chunk_size: Some(CHUNK_SIZE),
            metadata,
            ..Default::default()
        };
        let mut reader = bytes;
        store.put(meta, &mut reader).await.map_err(|e| object_error("put artifact", e))?;
        Ok(ArtifactInfo {
            reference,
            content_type: content_type.to_owned(),
            size_bytes: bytes.len() as u64,
            goal_id: goal_id.to_owned(),
            created_unix_ms: created,
            expires_unix_ms: expires,
            preview,
            tenant: tenant.to_owned(),
        })
    }

    /// The whole content of an artifact.
    pub async fn get(&self, reference: &str) -> Result<Vec<u8>> {
        check_reference(reference)?;
        let store = match &self.backend {
            Backend::Store(held) => &held.0,
            Backend::Brokered(broker) => return brokered_get(broker, reference).await,
            Backend::Closed => return Err(closed()),
        };
        let mut object = store.get(reference).await.map_err(|e| match e.kind() {
            object_store::GetErrorKind::NotFound | object_store::GetErrorKind::InvalidName => {
                Error::NotFound { what: "artifact", id: reference.to_owned() }
            }
            _ => object_error("get artifact", e),
        })?;
        let mut bytes = Vec::with_capacity(object.info().size);
        object.read_to_end(&mut bytes).await.map_err(|e| object_error("read artifact", e))?;
        Ok(bytes)
    }

    pub async fn info(&self, reference: &str) -> Result<ArtifactInfo> {
        check_reference(reference)?;
        match &self.backend {
            Backend::Store(..) => Ok(info_of(&self.object_info(reference).await?)),
            Backend::Brokered(broker) => Ok(brokered_info(broker, reference).await?.0),
            Backend::Closed => Err(closed()),
        }
    }

    /// The object store's own description of an artifact (its chunks' `nuid`, its digest).
    async fn object_info(&self, reference: &str) -> Result<object_store::ObjectInfo> {
        self.store()?.info(reference).await.map_err(|e| match e.kind() {
            object_store::InfoErrorKind::NotFound | object_store::InfoErrorKind::InvalidName => {
                Error::NotFound { what: "artifact", id: reference.to_owned() }
            }
            _ => object_error("artifact info", e),
        })
    }

    pub async fn delete(&self, reference: &str) -> Result<()> {
        check_reference(reference)?;
        self.store()?.delete(reference).await.map_err(|e| object_error("delete artifact", e))
    }

    /// Every live artifact.
    pub async fn list(&self) -> Result<Vec<ArtifactInfo>> {
        let mut list = self.store()?.list().await.map_err(|e| object_error("list artifacts", e))?;
        let mut out = Vec::new();
        while let Some(info) = list.next().await {
            let info = info.map_err(|e| object_error("list artifacts", e))?;
            if !info.deleted {
                out.push(info_of(&info));
            }
        }
        Ok(out)
    }

    /// Deletes artifacts whose TTL has passed; returns how many.
    pub async fn sweep_expired(&self, now_ms: u64) -> Result<usize> {
        let mut deleted = 0;
        for info in self.list().await? {
            if info.expires_unix_ms != 0 && info.expires_unix_ms <= now_ms {
                self.delete(&info.reference).await?;
                deleted += 1;
            }
        }
        Ok(deleted)
    }

    /// Returns `json` as it is when it fits inline; otherwise stores it as `goal_id`'s, owned by
    /// the goal's `tenant` (empty: none), and returns the stub and the reference. The store's
    /// future is boxed, as in [`Artifacts::resolve_value`]: only outputs over the limit pay for it.
    pub async fn offload_json(
        &self,
        json: String,
        goal_id: &str,
        tenant: &str,
    ) -> Result<(String, Option<String>)> {
        if json.len() <= self.inline_limit {
            return Ok((json, None));
        }
        let info =
            Box::pin(self.put_owned(json.as_bytes(), "application/json", goal_id, tenant, None)).await?;
        Ok((stub(&info).to_string(), Some(info.reference)))
    }

    /// Replaces every artifact stub in `value` with the value it stands for (the stored JSON, or
    /// its text when it is not JSON), following the stub's `path`. Each artifact is read once.
    ///
    /// Only artifacts of `goal_id` resolve: a stub naming another goal's artifact is refused
    /// (`DENIED`), as is one naming no artifact (`NOT_FOUND`). Before anything is loaded, the
    /// resolved size is bounded: every stub counts with its artifact's full size, and over
    /// `max_bytes` in all the inputs are refused (`INVALID_ARGUMENT`, naming the limit).
    ///
    /// Inputs without stubs, most of them, are passed on as they are; only inputs with stubs pay
    /// for the reads' future (boxed: every agent task awaits this, and its future would otherwise
    /// carry the reads' kilobytes whether or not it reads anything).
    pub async fn resolve_value(&self, value: Value, goal_id: &str, max_bytes: u64) -> Result<Value> {
        let mut references = Vec::new();
        collect_stubs(&value, &mut references);
        if references.is_empty() {
            return Ok(value);
        }
        Box::pin(self.resolve_references(value, references, goal_id, max_bytes)).await
    }

    /// [`Artifacts::resolve_value`] of a value with these stubs.
    async fn resolve_references(
        &self,
        value: Value,
        references: Vec<String>,
        goal_id: &str,
        max_bytes: u64,
    ) -> Result<Value> {
        let mut sizes: HashMap<String, u64> = HashMap::new();
        let mut total: u64 = 0;
        for reference in &references {
            let size = match sizes.get(reference) {
                Some(size) => *size,
                None => {
                    let info = self.info(reference).await?;
                    if info.goal_id != goal_id {
                        return Err(Error::Denied {
                            reason: format!(
                                "artifact `{reference}` belongs to another goal; a goal resolves only its own artifacts"
                            ),
                        });
                    }
                    sizes.insert(reference.clone(), info.size_bytes);
                    info.size_bytes
                }
            };
            total = total.saturating_add(size);
            if total > max_bytes {
                return Err(Error::InvalidArgument {
                    field: "inputs".into(),
                    reason: format!(
                        "the inputs would take over {max_bytes} bytes once their {} artifact reference(s) are resolved (each counts with its artifact's full size); pass fewer or smaller references",
                        references.len()
                    ),
                });
            }
        }
        let mut loaded = HashMap::new();
        for reference in references {
            if loaded.contains_key(&reference) {
                continue;
            }
            let bytes = self.get(&reference).await?;
            loaded.insert(reference, content_value(&bytes));
        }
        substitute_stubs(value, &loaded)
    }
}

// --- Task data through the memory service (crate::broker): an agent's side, then the service's.

/// How long the parts of a brokered upload are kept before the memory service sweeps them, if
/// their commit never came.
pub const UPLOAD_PART_TTL: Duration = Duration::from_secs(10 * 60);

/// The name a brokered upload's part is kept under until its commit.
fn part_reference(upload: &str, index: u32) -> String {
    format!("upl-{upload}-{index}")
}

impl From<&ArtifactInfo> for MemoryRef {
    fn from(info: &ArtifactInfo) -> MemoryRef {
        MemoryRef {
            r#ref: info.reference.clone(),
            content_type: info.content_type.clone(),
            size_bytes: info.size_bytes,
            preview: info.preview.clone(),
            goal_id: info.goal_id.clone(),
            created_unix_ms: info.created_unix_ms,
            expires_unix_ms: info.expires_unix_ms,
            tenant: info.tenant.clone(),
        }
    }
}

impl From<MemoryRef> for ArtifactInfo {
    fn from(r: MemoryRef) -> ArtifactInfo {
        ArtifactInfo {
            reference: r.r#ref,
            content_type: r.content_type,
            size_bytes: r.size_bytes,
            goal_id: r.goal_id,
            created_unix_ms: r.created_unix_ms,
            expires_unix_ms: r.expires_unix_ms,
            preview: r.preview,
            tenant: r.tenant,
        }
    }
}

/// Stores `bytes` as the task's goal's artifact through the memory service: in one request when
/// it fits one message, otherwise in parts the commit joins.
async fn brokered_put(
    broker: &TaskBroker,
    bytes: &[u8],
    content_type: &str,
    ttl: Option<Duration>,
) -> Result<ArtifactInfo> {
    let piece = broker.piece_bytes();
    let mut commit = TaskArtifactCommit {
        task_token: broker.token().to_owned(),
        content_type: content_type.to_owned(),
        // At least a second: 0 on the wire means the store's retention.
        ttl_secs: ttl.map_or(0, |t| t.as_secs().max(1)),
        ..Default::default()
    };
    if bytes.len() <= piece {
        commit.data = bytes.to_vec();
    } else {
        commit.upload = uuid::Uuid::now_v7().simple().to_string();
        for (index, data) in bytes.chunks(piece).enumerate() {
            let part = TaskArtifactPart {
                task_token: broker.token().to_owned(),
                upload: commit.upload.clone(),
                index: index as u32,
                data: data.to_vec(),
            };
            let _: MemoryRef = broker.call("artifact_part", &part).await?;
            commit.parts = index as u32 + 1;
        }
    }
    let stored: MemoryRef = broker.call("artifact_commit", &commit).await?;
    Ok(stored.into())
}

async fn brokered_info(broker: &TaskBroker, reference: &str) -> Result<(ArtifactInfo, String)> {
    let request =
        TaskArtifactRequest { task_token: broker.token().to_owned(), r#ref: reference.to_owned(), cursor: 0 };
    let reply: TaskArtifactInfo = broker.call("artifact_info", &request).await?;
    let info = reply.info.ok_or_else(|| Error::Decode { kind: "artifact info", reason: "no info".into() })?;
    Ok((info.into(), reply.digest))
}

/// Reads the task's goal's artifact through the memory service, a piece of chunks at a time, and
/// checks what came against the object's size and digest.
async fn brokered_get(broker: &TaskBroker, reference: &str) -> Result<Vec<u8>> {
    let (info, digest) = brokered_info(broker, reference).await?;
    let mut bytes = Vec::with_capacity(info.size_bytes as usize);
    let mut request =
        TaskArtifactRequest { task_token: broker.token().to_owned(), r#ref: reference.to_owned(), cursor: 0 };
    while (bytes.len() as u64) < info.size_bytes {
        let piece: TaskArtifactPiece = broker.call("artifact_read", &request).await?;
        bytes.extend_from_slice(&piece.data);
        if piece.end || piece.data.is_empty() {
            break;
        }
        request.cursor = piece.cursor;
    }
    let unchanged =
        bytes.len() as u64 == info.size_bytes && (digest.is_empty() || digest == digest_of(&bytes));
    if !unchanged {
        return Err(Error::Unavailable(format!(
            "artifact `{reference}` changed or was cut short while it was read ({} of {} bytes)",
            bytes.len(),
            info.size_bytes
        )));
    }
    Ok(bytes)
}

/// The object store's digest of `bytes` (`SHA-256=<base64url>`).
fn digest_of(bytes: &[u8]) -> String {
    use base64::Engine as _;
    let digest = ring::digest::digest(&ring::digest::SHA256, bytes);
    format!("SHA-256={}", base64::engine::general_purpose::URL_SAFE.encode(digest.as_ref()))
}

/// What the memory service does for a task of `goal_id` in `tenant` (the token's claims): only that
/// goal's artifacts are read, and what is stored is that goal's, owned by that tenant. Another
/// goal's artifact is refused as not found, so a reference tells nothing of whose it is.
impl Artifacts {
    async fn goal_object(&self, reference: &str, goal_id: &str) -> Result<object_store::ObjectInfo> {
        check_reference(reference)?;
        let info = self.object_info(reference).await?;
        match info.metadata.get("goal_id").is_some_and(|g| !g.is_empty() && g == goal_id) {
            true => Ok(info),
            false => Err(Error::NotFound { what: "artifact of the task's goal", id: reference.to_owned() }),
        }
    }

    /// `artifact_info`: the artifact and its digest.
    pub async fn serve_info(&self, request: &TaskArtifactRequest, goal_id: &str) -> Result<TaskArtifactInfo> {
        let info = self.goal_object(&request.r#ref, goal_id).await?;
        Ok(TaskArtifactInfo {
            info: Some(MemoryRef::from(&info_of(&info))),
            digest: info.digest.clone().unwrap_or_default(),
        })
    }

    /// `artifact_read`: the chunks after the request's cursor, up to `max_bytes` of them.
    pub async fn serve_read(
        &self,
        request: &TaskArtifactRequest,
        goal_id: &str,
        max_bytes: usize,
    ) -> Result<TaskArtifactPiece> {
        let Backend::Store(held) = &self.backend else { return Err(closed()) };
        let stream = &held.1;
        let info = self.goal_object(&request.r#ref, goal_id).await?;
        let subject = format!("$O.{}.C.{}", info.bucket, info.nuid);
        let mut piece = TaskArtifactPiece { cursor: request.cursor, ..Default::default() };
        while piece.data.len() + CHUNK_SIZE <= max_bytes.max(CHUNK_SIZE) {
            match stream.direct_get_next_for_subject(subject.as_str(), Some(piece.cursor + 1)).await {
                Ok(chunk) => {
                    piece.data.extend_from_slice(&chunk.payload);
                    piece.cursor = chunk.sequence;
                }
                Err(e) if e.kind() == jetstream::stream::DirectGetErrorKind::NotFound => {
                    piece.end = true;
                    break;
                }
                Err(e) => return Err(object_error("read an artifact's chunk", e)),
            }
        }
        Ok(piece)
    }

    /// `artifact_part`: keeps one part of an upload for [`UPLOAD_PART_TTL`].
    pub async fn serve_part(
        &self,
        request: &TaskArtifactPart,
        goal_id: &str,
        tenant: &str,
    ) -> Result<MemoryRef> {
        check_upload(&request.upload)?;
        let reference = part_reference(&request.upload, request.index);
        let info = self
            .put_named(
                &reference,
                &request.data,
                "application/octet-stream",
                goal_id,
                tenant,
                Some(UPLOAD_PART_TTL),
            )
            .await?;
        Ok(MemoryRef::from(&info))
    }

    /// `artifact_commit`: stores the content (inline, or the upload's parts joined) as the goal's
    /// artifact, then removes the parts.
    pub async fn serve_commit(
        &self,
        request: &TaskArtifactCommit,
        goal_id: &str,
        tenant: &str,
    ) -> Result<MemoryRef> {
        let content = match request.parts {
            0 => std::borrow::Cow::Borrowed(request.data.as_slice()),
            parts => {
                check_upload(&request.upload)?;
                let mut joined = Vec::new();
                for index in 0..parts {
                    let reference = part_reference(&request.upload, index);
                    self.goal_object(&reference, goal_id).await?;
                    joined.extend_from_slice(&self.get(&reference).await?);
                    if joined.len() as u64 > MAX_RESOLVED_INPUT_BYTES {
                        return Err(Error::InvalidArgument {
                            field: "parts".into(),
                            reason: format!(
                                "an artifact stored through the memory service is at most {MAX_RESOLVED_INPUT_BYTES} bytes"
                            ),
                        });
                    }
                }
                std::borrow::Cow::Owned(joined)
            }
        };
        let ttl = (request.ttl_secs > 0).then(|| Duration::from_secs(request.ttl_secs));
        let info = self.put_owned(&content, &request.content_type, goal_id, tenant, ttl).await?;
        for index in 0..request.parts {
            if let Err(e) = self.delete(&part_reference(&request.upload, index)).await {
                tracing::warn!(error = %e, upload = %request.upload, "cannot remove an upload's part; it expires");
            }
        }
        Ok(MemoryRef::from(&info))
    }
}

/// An upload's name is one word of at most 64 characters (the agent's UUID).
fn check_upload(upload: &str) -> Result<()> {
    crate::ids::check_id("upload", upload, 64, crate::ids::IdShape::Word)
}

/// An artifact reference must look like one (`art-<hex>`: letters, digits, `_`, `-`).
fn check_reference(reference: &str) -> Result<()> {
    crate::ids::check_id("artifact", reference, 128, crate::ids::IdShape::Word)
}

/// The stub standing for an artifact in a message.
pub fn stub(info: &ArtifactInfo) -> Value {
    json!({
        ARTIFACT_KEY: info.reference,
        "size_bytes": info.size_bytes,
        "content_type": info.content_type,
        "preview": info.preview,
    })
}

/// A stub pointing into an artifact's JSON content.
pub fn stub_at(reference: &str, path: &[String]) -> Value {
    json!({ARTIFACT_KEY: reference, "path": path})
}

/// The artifact a stub names, when `value` is one.
pub fn stub_reference(value: &Value) -> Option<&str> {
    let map = value.as_object()?;
    let reference = map.get(ARTIFACT_KEY)?.as_str()?;
    let known = ["path", "size_bytes", "content_type", "preview", ARTIFACT_KEY];
    map.keys().all(|k| known.contains(&k.as_str())).then_some(reference)
}

/// The JSON pointers of every object in `value` with an `$artifact` key, stub-shaped or not: a
/// submitted plan may contain none.
pub fn stub_pointers(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    crate::json_ref::visit(value, &mut |pointer, value| {
        if value.as_object().is_some_and(|map| map.contains_key(ARTIFACT_KEY)) {
            out.push(if pointer.is_empty() { "/".to_owned() } else { pointer.to_owned() });
        }
        true
    });
    out
}

/// An artifact's content as the messages of a gRPC stream (`GetArtifact`, `GetGoalArtifact`):
/// chunks of at most 1 MiB, well under any client's decoding limit, each copied out of `bytes`
/// only when the stream asks for it.
pub fn grpc_chunks(bytes: Vec<u8>) -> impl Iterator<Item = hermes_proto::ArtifactChunk> + Send + 'static {
    const GRPC_CHUNK: usize = CHUNK_SIZE * 32;
    let len = bytes.len();
    (0..len).step_by(GRPC_CHUNK).map(move |start| hermes_proto::ArtifactChunk {
        data: bytes[start..len.min(start + GRPC_CHUNK)].to_vec(),
    })
}

/// The artifacts the stubs anywhere in `value` name, in order, repeats included.
pub fn stub_references(value: &Value) -> Vec<String> {
    let mut out = Vec::new();
    collect_stubs(value, &mut out);
    out
}

/// What an artifact's content stands for in JSON: the stored JSON, or its text when it is not
/// JSON.
pub fn content_value(bytes: &[u8]) -> Value {
    serde_json::from_slice(bytes)
        .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(bytes).into_owned()))
}

fn collect_stubs(value: &Value, out: &mut Vec<String>) {
    if let Some(reference) = stub_reference(value) {
        out.push(reference.to_owned());
        return;
    }
    match value {
        Value::Object(map) => map.values().for_each(|v| collect_stubs(v, out)),
        Value::Array(items) => items.iter().for_each(|v| collect_stubs(v, out)),
        _ => {}
    }
}

/// `value` with every stub replaced by the content it stands for in `loaded` (by reference),
/// following the stub's `path`; a stub whose artifact is not in `loaded` is `NOT_FOUND`.
pub fn substitute_stubs(value: Value, loaded: &HashMap<String, Value>) -> Result<Value> {
    if let Some(reference) = stub_reference(&value) {
        let content = loaded
            .get(reference)
            .ok_or_else(|| Error::NotFound { what: "artifact", id: reference.to_owned() })?;
        let path: Vec<String> = value
            .get("path")
            .and_then(Value::as_array)
            .map(|p| p.iter().filter_map(|s| s.as_str().map(str::to_owned)).collect())
            .unwrap_or_default();
        return crate::json_ref::lookup(content, &path).cloned().ok_or_else(|| Error::InvalidArgument {
            field: "inputs".into(),
            reason: format!("path {} not found in artifact `{reference}`", path.join(".")),
        });
    }
    Ok(match value {
        Value::Object(map) => Value::Object(
            map.into_iter().map(|(k, v)| Ok((k, substitute_stubs(v, loaded)?))).collect::<Result<_>>()?,
        ),
        Value::Array(items) => {
            Value::Array(items.into_iter().map(|v| substitute_stubs(v, loaded)).collect::<Result<_>>()?)
        }
        other => other,
    })
}

fn preview_of(bytes: &[u8]) -> String {
    let head = &bytes[..bytes.len().min(PREVIEW_CHARS * 4)];
    String::from_utf8_lossy(head).chars().take(PREVIEW_CHARS).collect()
}

fn info_of(info: &object_store::ObjectInfo) -> ArtifactInfo {
    let field = |k: &str| info.metadata.get(k).cloned().unwrap_or_default();
    let number = |k: &str| field(k).parse().unwrap_or(0);
    ArtifactInfo {
        reference: info.name.clone(),
        content_type: field("content_type"),
        size_bytes: info.size as u64,
        goal_id: field("goal_id"),
        created_unix_ms: number("created_unix_ms"),
        expires_unix_ms: number("expires_unix_ms"),
        preview: field("preview"),
        tenant: field("tenant"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stubs_are_recognised_only_with_known_keys() {
        assert_eq!(stub_reference(&json!({"$artifact": "art-1", "path": ["a"]})), Some("art-1"));
        assert_eq!(stub_reference(&json!({"$artifact": "art-1", "other": 1})), None);
        assert_eq!(stub_reference(&json!({"$artifact": 3})), None);
    }

    #[test]
    fn hand_written_stubs_are_found_anywhere() {
        let value = json!({"a": {"$artifact": "art-1"}, "b": [1, {"x": {"$artifact": "art-2", "junk": 1}}]});
        assert_eq!(stub_pointers(&value), vec!["/a".to_owned(), "/b/1/x".to_owned()]);
        assert!(stub_pointers(&json!({"$ref": "n.x", "s": "$artifact"})).is_empty());
    }

    #[test]
    fn grpc_chunks_cover_the_content_in_order_at_most_a_mib_each() {
        const MIB: usize = 1024 * 1024;
        for len in [0, 1, MIB - 1, MIB, MIB + 1, 3 * MIB + 17] {
            let bytes: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
            let chunks: Vec<_> = grpc_chunks(bytes.clone()).collect();
            assert_eq!(chunks.len(), len.div_ceil(MIB), "{len} bytes");
            assert!(chunks.iter().all(|c| !c.data.is_empty() && c.data.len() <= MIB));
            let joined: Vec<u8> = chunks.iter().flat_map(|c| c.data.iter().copied()).collect();
            assert_eq!(joined, bytes, "{len} bytes");
        }
    }

    #[test]
    fn stubs_are_replaced_by_their_content_at_their_path() {
        let loaded: HashMap<String, Value> =
            [("art-1".to_owned(), json!({"rows": [{"x": 1}], "n": 1}))].into();
        let value =
            json!({"a": stub_at("art-1", &["rows".into(), "0".into()]), "b": [stub_at("art-1", &[])]});
        let out = substitute_stubs(value, &loaded).unwrap();
        assert_eq!(out, json!({"a": {"x": 1}, "b": [{"rows": [{"x": 1}], "n": 1}]}));
        assert!(substitute_stubs(stub_at("art-1", &["nope".into()]), &loaded).is_err());
        assert!(substitute_stubs(stub_at("art-2", &[]), &loaded).is_err());
    }
}
