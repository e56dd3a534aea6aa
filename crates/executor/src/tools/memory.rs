//! `memory.put`, `memory.get` and `memory.search`: long-term semantic memory through the memory
//! service (NATS request/reply). Documents written by an agent carry the goal and node that wrote
//! them in their metadata.

use std::collections::HashMap;

use futures::future::BoxFuture;
use hermes_clients::memory::MemoryClient;
use hermes_core::ErrorCode;
use hermes_proto::{GetDocRequest, MemoryDoc, SearchRequest, UpsertRequest};
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::tool::{Tool, ToolContext, ToolError, parse_args, schema_of};

fn tool_error(e: hermes_core::Error) -> ToolError {
    let code = match e.code() {
        // `Denied`: refused for the task's token; not the service away, so not retried.
        code @ (ErrorCode::InvalidArgument
        | ErrorCode::NotFound
        | ErrorCode::FailedPrecondition
        | ErrorCode::Denied) => code,
        ErrorCode::Timeout => ErrorCode::Timeout,
        _ => ErrorCode::Unavailable,
    };
    ToolError { code, message: e.to_string() }
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct PutArgs {
    /// The text to remember.
    text: String,
    /// The document id; the same id replaces the document. Default: derived from the task.
    #[serde(default)]
    id: Option<String>,
    /// Collection (default `memory`).
    #[serde(default)]
    collection: Option<String>,
    /// Filterable labels, e.g. {"kind": "fact", "tenant": "acme"}.
    #[serde(default)]
    metadata: HashMap<String, String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct GetArgs {
    id: String,
    #[serde(default)]
    collection: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct SearchArgs {
    /// What to look for, in plain language.
    query: String,
    /// How many results (default 5).
    #[serde(default)]
    #[schemars(range(min = 1, max = 50))]
    top_k: Option<u32>,
    #[serde(default)]
    collection: Option<String>,
    /// Only documents whose metadata has all these values.
    #[serde(default)]
    filter: HashMap<String, String>,
}

fn doc_json(doc: &MemoryDoc) -> Value {
    json!({"id": doc.id, "text": doc.text, "metadata": doc.metadata})
}

/// `memory.put`.
pub struct MemoryPut(pub MemoryClient);
/// `memory.get`.
pub struct MemoryGet(pub MemoryClient);
/// `memory.search`.
pub struct MemorySearch(pub MemoryClient);

impl Tool for MemoryPut {
    fn name(&self) -> &str {
        "memory.put"
    }

    fn description(&self) -> &str {
        "Stores a text in long-term memory so later goals can find it; returns {id, collection}."
    }

    fn params_schema(&self) -> Value {
        schema_of::<PutArgs>()
    }

    fn side_effects(&self) -> bool {
        true
    }

    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: PutArgs = parse_args(args)?;
            let mut metadata = args.metadata;
            let id = match (&args.id, &ctx.task) {
                (Some(id), _) => id.clone(),
                (None, Some(scope)) => {
                    metadata.entry("goal".into()).or_insert_with(|| scope.goal_id.clone());
                    metadata.entry("node".into()).or_insert_with(|| scope.node_id.clone());
                    let hash = uuid::Uuid::new_v5(&uuid::Uuid::NAMESPACE_OID, args.text.as_bytes()).simple();
                    format!("{}-{}-{hash}", scope.goal_id, scope.node_id)
                }
                (None, None) => uuid::Uuid::now_v7().simple().to_string(),
            };
            let collection = args.collection.unwrap_or_default();
            let doc = MemoryDoc { id: id.clone(), text: args.text, metadata, updated_unix_ms: 0 };
            self.0
                .upsert(&UpsertRequest {
                    collection: collection.clone(),
                    docs: vec![doc],
                    tenant: tenant_of(ctx),
                    task_token: task_token_of(ctx),
                })
                .await
                .map_err(tool_error)?;
            let collection = if collection.is_empty() {
                hermes_clients::memory::DEFAULT_COLLECTION.to_owned()
            } else {
                collection
            };
            Ok(json!({"id": id, "collection": collection}))
        })
    }
}

impl Tool for MemoryGet {
    fn name(&self) -> &str {
        "memory.get"
    }

    fn description(&self) -> &str {
        "Reads one document of long-term memory by id; returns {id, text, metadata}."
    }

    fn params_schema(&self) -> Value {
        schema_of::<GetArgs>()
    }

    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: GetArgs = parse_args(args)?;
            let request = GetDocRequest {
                collection: args.collection.unwrap_or_default(),
                id: args.id,
                tenant: tenant_of(ctx),
                task_token: task_token_of(ctx),
            };
            Ok(doc_json(&self.0.get_doc(&request).await.map_err(tool_error)?))
        })
    }
}

impl Tool for MemorySearch {
    fn name(&self) -> &str {
        "memory.search"
    }

    fn description(&self) -> &str {
        "Finds the texts in long-term memory most similar in meaning to a query; returns {hits: [{id, text, score, metadata}]}."
    }

    fn params_schema(&self) -> Value {
        schema_of::<SearchArgs>()
    }

    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: SearchArgs = parse_args(args)?;
            let request = SearchRequest {
                collection: args.collection.unwrap_or_default(),
                query: args.query,
                top_k: args.top_k.unwrap_or(5),
                filter: args.filter,
                tenant: tenant_of(ctx),
                task_token: task_token_of(ctx),
            };
            let reply = self.0.search(&request).await.map_err(tool_error)?;
            let hits: Vec<Value> = reply
                .hits
                .iter()
                .map(|h| {
                    let mut doc = doc_json(h.doc.as_ref().unwrap_or(&MemoryDoc::default()));
                    doc["score"] = json!(h.score);
                    doc
                })
                .collect();
            Ok(json!({"hits": hits, "count": hits.len()}))
        })
    }
}

/// The tenant whose memory a task's tools use: its goal's (none outside a task).
fn tenant_of(ctx: &ToolContext) -> String {
    ctx.task.as_ref().map(|t| t.tenant.clone()).unwrap_or_default()
}

/// The task's proof of that tenant for the memory service (none outside a task: refused).
fn task_token_of(ctx: &ToolContext) -> String {
    ctx.task.as_ref().map(|t| t.memory_token.clone()).unwrap_or_default()
}
