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
use futures::StreamExt;
use serde_json::{Value, json};
use tokio::io::AsyncReadExt;

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
    store: ObjectStore,
    inline_limit: usize,
}

fn object_error(operation: &'static str, e: impl std::fmt::Display) -> Error {
    Error::JetStream { operation, reason: e.to_string() }
}

impl Artifacts {
    pub fn new(store: ObjectStore, inline_limit: usize) -> Self {
        Self { store, inline_limit }
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

    /// [`Artifacts::put`], recording `tenant` as the artifact's owner (empty: none).
    pub async fn put_owned(
        &self,
        bytes: &[u8],
        content_type: &str,
        goal_id: &str,
        tenant: &str,
        ttl: Option<Duration>,
    ) -> Result<ArtifactInfo> {
        let reference = format!("art-{}", uuid::Uuid::now_v7().simple());
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
        self.store.put(meta, &mut reader).await.map_err(|e| object_error("put artifact", e))?;
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
        let mut object = self.store.get(reference).await.map_err(|e| match e.kind() {
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
        let info = self.store.info(reference).await.map_err(|e| match e.kind() {
            object_store::InfoErrorKind::NotFound | object_store::InfoErrorKind::InvalidName => {
                Error::NotFound { what: "artifact", id: reference.to_owned() }
            }
            _ => object_error("artifact info", e),
        })?;
        Ok(info_of(&info))
    }

    pub async fn delete(&self, reference: &str) -> Result<()> {
        check_reference(reference)?;
        self.store.delete(reference).await.map_err(|e| object_error("delete artifact", e))
    }

    /// Every live artifact.
    pub async fn list(&self) -> Result<Vec<ArtifactInfo>> {
        let mut list = self.store.list().await.map_err(|e| object_error("list artifacts", e))?;
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
    /// the goal's `tenant` (empty: none), and returns the stub and the reference.
    pub async fn offload_json(
        &self,
        json: String,
        goal_id: &str,
        tenant: &str,
    ) -> Result<(String, Option<String>)> {
        if json.len() <= self.inline_limit {
            return Ok((json, None));
        }
        let info = self.put_owned(json.as_bytes(), "application/json", goal_id, tenant, None).await?;
        Ok((stub(&info).to_string(), Some(info.reference)))
    }

    /// Replaces every artifact stub in `value` with the value it stands for (the stored JSON, or
    /// its text when it is not JSON), following the stub's `path`. Each artifact is read once.
    ///
    /// Only artifacts of `goal_id` resolve: a stub naming another goal's artifact is refused
    /// (`DENIED`), as is one naming no artifact (`NOT_FOUND`). Before anything is loaded, the
    /// resolved size is bounded: every stub counts with its artifact's full size, and over
    /// `max_bytes` in all the inputs are refused (`INVALID_ARGUMENT`, naming the limit).
    pub async fn resolve_value(&self, value: Value, goal_id: &str, max_bytes: u64) -> Result<Value> {
        let mut references = Vec::new();
        collect_stubs(&value, &mut references);
        if references.is_empty() {
            return Ok(value);
        }
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
