//! The memory service: artifacts by reference (the `hermes_artifacts` object store, see
//! [`hermes_core::artifacts`]), session memory ([`sessions`]) and long-term semantic memory
//! ([`vectors`]). It answers the gRPC `Memory` API and the same operations as NATS request/reply
//! on `hermes.memory.rpc.<method>` in a queue group, so replicas share the load; it follows the
//! goal events to record session turns and to remember each completed goal; and it deletes
//! artifacts past their TTL.

pub mod grpc;
pub mod service;
pub mod sessions;
pub mod tenancy;
pub mod vectors;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_nats::jetstream::consumer::{self, DeliverPolicy};
use futures::StreamExt;
use hermes_core::bus::Handled;
use hermes_core::{Bus, Error, Result, now_unix_ms};
use hermes_llm::ChatModel;
use hermes_llm::embed::Embedder;
use hermes_proto::event::Kind;
use hermes_proto::{
    AppendTurnRequest, ContextReply, ContextRequest, Event, EventBatch, GetDocRequest, LedgerReply,
    LedgerRequest, ListCollectionsReply, ListCollectionsRequest, ListSessionsReply, ListSessionsRequest,
    MemoryDoc, SearchReply, SearchRequest, SessionRequest, SessionState, SessionTurn, TaskArtifactCommit,
    TaskArtifactInfo, TaskArtifactPart, TaskArtifactPiece, TaskArtifactRequest, UpsertReply, UpsertRequest,
};
use prost::Message as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

// The client lives with the other service clients; callers depend on `hermes-clients`.
pub use hermes_clients::memory::{DEFAULT_COLLECTION, ERROR_CODE_HEADER, ERROR_MESSAGE_HEADER, MemoryClient};
pub use sessions::Sessions;
pub use vectors::Vectors;

/// How the memory service runs.
#[derive(Clone)]
pub struct MemoryConfig {
    /// Session turns kept verbatim.
    pub window: usize,
    /// How long an idle session is kept.
    pub sessions_ttl: Duration,
    /// How often expired artifacts are deleted.
    pub sweep_every: Duration,
    /// Embeddings for semantic memory; without one, upsert and search answer FAILED_PRECONDITION.
    pub embedder: Option<Arc<dyn Embedder>>,
    /// Folds old session turns; without one, the extractive fallback does.
    pub summarizer: Option<Arc<dyn ChatModel>>,
    /// Memories recalled for a new goal.
    pub recall_top_k: usize,
    /// The longest an artifact is kept: set on the artifact store's stream at start.
    pub artifacts_max_age: Duration,
    /// Semantic memories not rewritten for this long are deleted; `None` keeps them.
    pub memories_ttl: Option<Duration>,
    /// How the vector index is built and snapshotted (not a setting: tests lower its threshold).
    pub vectors: vectors::VectorOptions,
}

impl Default for MemoryConfig {
    fn default() -> Self {
        Self {
            window: sessions::DEFAULT_WINDOW,
            sessions_ttl: Duration::from_secs(30 * 24 * 3600),
            sweep_every: Duration::from_secs(60),
            embedder: None,
            summarizer: None,
            recall_top_k: 3,
            artifacts_max_age: Duration::from_secs(7 * 24 * 3600),
            memories_ttl: None,
            vectors: vectors::VectorOptions::default(),
        }
    }
}

impl std::fmt::Debug for MemoryConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryConfig")
            .field("window", &self.window)
            .field("embedder", &self.embedder.as_ref().map(|e| e.model().to_owned()))
            .field("summarizer", &self.summarizer.as_ref().map(|m| m.model().to_owned()))
            .finish()
    }
}

/// The `[memory]` settings of the memory service, shared by `hermes-memory` and `hermes up`.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemorySettings {
    /// Session turns kept verbatim; older ones are folded into the summary.
    pub session_window: usize,
    /// Days an idle session is kept.
    pub session_ttl_days: u64,
    /// Days an artifact is kept at most (the object store's max age; per-artifact TTLs can be
    /// shorter).
    pub artifact_retention_days: u64,
    /// Days a semantic memory is kept after its last write; 0 keeps it until deleted.
    pub ttl_days: u64,
    /// Memories recalled into the planner's prompt for a new goal.
    pub recall: usize,
}

impl Default for MemorySettings {
    fn default() -> Self {
        MemorySettings {
            session_window: sessions::DEFAULT_WINDOW,
            session_ttl_days: 30,
            artifact_retention_days: 7,
            ttl_days: 0,
            recall: 3,
        }
    }
}

/// Earlier names of `[memory]` keys (`HERMES_SESSION_WINDOW`, ...).
pub const ALIASES: &[(&str, &str)] = &[
    ("session_window", "memory.session_window"),
    ("session_ttl_days", "memory.session_ttl_days"),
    ("artifact_retention_days", "memory.artifact_retention_days"),
];

/// One line of help for each `[memory]` and `[embedding]` key.
pub fn describe(key: &str) -> Option<&'static str> {
    Some(match key {
        "memory.session_window" => "Session turns kept verbatim; older ones are folded into the summary.",
        "memory.session_ttl_days" => "Days an idle session is kept.",
        "memory.artifact_retention_days" => "Days an artifact is kept at most.",
        "memory.ttl_days" => "Days a semantic memory is kept after its last write; 0: until deleted.",
        "memory.recall" => "Memories recalled into the planner's prompt for a new goal.",
        "embedding.provider" => "`local` (all-MiniLM-L6-v2) or `openai`; unset: no semantic memory.",
        "embedding.base_url" => "OpenAI-compatible base URL for embeddings.",
        "embedding.model" => "Embedding model name on that endpoint.",
        "embedding.api_key_env" => "Environment variable holding the endpoint's API key.",
        "embedding.local_dir" => "The local embedding model's dir.",
        _ => return None,
    })
}

impl MemorySettings {
    pub fn artifacts_max_age(&self) -> Duration {
        Duration::from_secs(self.artifact_retention_days.max(1) * 24 * 3600)
    }

    /// The config, with the embedder of `embedding` and the summarizer model of `llm`.
    pub fn to_config(
        &self,
        embedding: &hermes_llm::embed::EmbeddingSettings,
        llm: &hermes_llm::config::LlmSettings,
    ) -> anyhow::Result<MemoryConfig> {
        Ok(MemoryConfig {
            window: self.session_window.max(1),
            sessions_ttl: Duration::from_secs(self.session_ttl_days.max(1) * 24 * 3600),
            embedder: embedding.embedder()?,
            summarizer: llm.summarizer_model()?,
            recall_top_k: self.recall,
            artifacts_max_age: self.artifacts_max_age(),
            memories_ttl: (self.ttl_days > 0).then(|| Duration::from_secs(self.ttl_days * 24 * 3600)),
            ..MemoryConfig::default()
        })
    }
}

/// The service's state; cheap to clone.
#[derive(Clone)]
pub struct Memory {
    bus: Bus,
    config: MemoryConfig,
    sessions: Sessions,
    vectors: Vectors,
    /// Running goals' text and tenant, with semantic memory on (see [`Memory::on_event`]).
    goal_notes: Option<async_nats::jetstream::kv::Store>,
    /// Checks the task tokens of agents' memory requests over NATS (`hermes_core::task_token`).
    task_key: hermes_core::task_token::TaskKey,
}

impl Memory {
    /// Opens the buckets and loads the vector index (then follows it until `shutdown`).
    pub async fn open(bus: Bus, config: MemoryConfig, shutdown: CancellationToken) -> Result<Memory> {
        let sessions_kv = Sessions::open_bucket(&bus, config.sessions_ttl).await?;
        let sessions = Sessions::new(sessions_kv, config.window, config.summarizer.clone());
        let vectors = Vectors::load(&bus, config.vectors.clone(), shutdown).await?;
        set_artifact_retention(&bus, config.artifacts_max_age).await?;
        let goal_notes = match config.embedder {
            Some(_) => Some(
                bus.ensure_bucket(async_nats::jetstream::kv::Config {
                    bucket: bus.topology().memory_goals_bucket(),
                    description: "Hermes memory: running goals' text, until they end".into(),
                    history: 1,
                    max_age: Duration::from_secs(7 * 24 * 3600),
                    num_replicas: bus.config().replicas,
                    ..Default::default()
                })
                .await?,
            ),
            None => None,
        };
        let task_key = hermes_core::task_token::TaskKey::open(&bus).await?;
        Ok(Memory { bus, config, sessions, vectors, goal_notes, task_key })
    }

    pub fn bus(&self) -> &Bus {
        &self.bus
    }

    /// Checks an agent's memory request over NATS: its task token verifies and names the tenant
    /// the request does; `DENIED` otherwise (logged, with the goal the token names).
    fn task_tenant(&self, token: &str, tenant: &str) -> Result<()> {
        let claims = self.task_claims(token)?;
        if claims.tenant != tenant {
            warn!(goal_id = %claims.goal_id, token_tenant = %claims.tenant, tenant = %tenant, event = "memory_request_refused", "an agent's memory request for another tenant than its task's was refused");
            return Err(Error::Denied {
                reason: format!("the task token is for tenant `{}`, not `{tenant}`", claims.tenant),
            });
        }
        Ok(())
    }

    /// What an agent's task token says, or `DENIED` (logged).
    fn task_claims(&self, token: &str) -> Result<hermes_core::task_token::TaskClaims> {
        self.task_key.verify(token, now_unix_ms()).inspect_err(|e| {
            warn!(error = %e, event = "memory_request_refused", "an agent's request without a valid task token was refused");
        })
    }

    /// An agent's ledger operation through the memory service: only on its task's goal's keys.
    pub async fn task_ledger(&self, request: LedgerRequest) -> Result<LedgerReply> {
        let claims = self.task_claims(&request.task_token)?;
        let goal = hermes_core::broker::ledger_key_goal(&request.key);
        if goal != claims.goal_id {
            warn!(goal_id = %claims.goal_id, key = %request.key, event = "memory_request_refused", "an agent's ledger request for another goal's entry was refused");
            return Err(Error::Denied {
                reason: format!(
                    "the task token is for goal `{}`; ledger key `{}` is not of it",
                    claims.goal_id, request.key
                ),
            });
        }
        self.bus.ledger().serve(&request).await
    }

    /// An agent's tool cache operation through the memory service: only on its task's tenant's
    /// entries (their keys start with the tenant's token, `hermes_core::tool_cache::tenant_token`).
    pub async fn task_tool_cache(&self, request: LedgerRequest) -> Result<LedgerReply> {
        let claims = self.task_claims(&request.task_token)?;
        let tenant = hermes_core::tool_cache::tenant_token(&claims.tenant);
        if request.key.split('.').next() != Some(tenant.as_str()) {
            warn!(goal_id = %claims.goal_id, key = %request.key, event = "memory_request_refused", "an agent's tool cache request for another tenant's entry was refused");
            return Err(Error::Denied {
                reason: format!(
                    "the task token is for tenant `{}`; cache key `{}` is not its",
                    claims.tenant, request.key
                ),
            });
        }
        let bucket = hermes_core::tool_cache::bucket(&self.bus).await?;
        hermes_core::task_kv::TaskKv::new(bucket, hermes_core::task_kv::TOOL_CACHE).serve(&request).await
    }

    /// An agent's artifact requests through the memory service (`artifact_info`, `artifact_read`,
    /// `artifact_part`, `artifact_commit`): only its task's goal's artifacts, and what it stores
    /// is its task's goal's and tenant's.
    pub async fn task_artifact_info(&self, request: TaskArtifactRequest) -> Result<TaskArtifactInfo> {
        let claims = self.task_claims(&request.task_token)?;
        self.bus.artifacts().serve_info(&request, &claims.goal_id).await
    }

    pub async fn task_artifact_read(&self, request: TaskArtifactRequest) -> Result<TaskArtifactPiece> {
        let claims = self.task_claims(&request.task_token)?;
        let most = hermes_core::broker::piece_bytes(self.bus.client().server_info().max_payload);
        self.bus.artifacts().serve_read(&request, &claims.goal_id, most).await
    }

    pub async fn task_artifact_part(&self, request: TaskArtifactPart) -> Result<hermes_proto::MemoryRef> {
        let claims = self.task_claims(&request.task_token)?;
        self.bus.artifacts().serve_part(&request, &claims.goal_id, &claims.tenant).await
    }

    pub async fn task_artifact_commit(&self, request: TaskArtifactCommit) -> Result<hermes_proto::MemoryRef> {
        let claims = self.task_claims(&request.task_token)?;
        self.bus.artifacts().serve_commit(&request, &claims.goal_id, &claims.tenant).await
    }

    pub async fn append_turn(&self, request: AppendTurnRequest) -> Result<SessionState> {
        let mut turn = request
            .turn
            .ok_or_else(|| Error::InvalidArgument { field: "turn".into(), reason: "missing".into() })?;
        turn.session_id = tenancy::session_key(&request.tenant, &turn.session_id);
        Ok(as_seen_by(&request.tenant, self.sessions.append(turn).await?))
    }

    /// The session, empty when it has no turns yet.
    pub async fn session(&self, request: SessionRequest) -> Result<SessionState> {
        let key = tenancy::session_key(&request.tenant, &request.session_id);
        Ok(match self.sessions.get(&key).await? {
            Some(state) => as_seen_by(&request.tenant, state),
            None => SessionState { session_id: request.session_id, ..Default::default() },
        })
    }

    /// The sessions of the request's tenant.
    pub async fn list_sessions(&self, request: ListSessionsRequest) -> Result<ListSessionsReply> {
        let sessions = self.sessions.list().await?.into_iter();
        let sessions = sessions
            .filter(|s| tenancy::session_of(&request.tenant, &s.session_id).is_some())
            .map(|s| as_seen_by(&request.tenant, s))
            .collect();
        Ok(ListSessionsReply { sessions })
    }

    fn embedder(&self) -> Result<&Arc<dyn Embedder>> {
        self.config.embedder.as_ref().ok_or_else(|| {
            Error::FailedPrecondition(
                "semantic memory needs an embedding model: set HERMES_EMBEDDING_PROVIDER (local or openai)"
                    .into(),
            )
        })
    }

    pub async fn upsert(&self, request: UpsertRequest) -> Result<UpsertReply> {
        let collection = collection_or_default(&request.collection);
        vectors::validate_collection(&collection)?;
        let collection = tenancy::collection_key(&request.tenant, &collection);
        if request.docs.is_empty() {
            return Ok(UpsertReply { upserted: 0 });
        }
        let embedder = self.embedder()?;
        let texts: Vec<String> = request.docs.iter().map(|d| d.text.clone()).collect();
        let vectors = embedder
            .embed(&texts)
            .await
            .map_err(|e| Error::Unavailable(format!("the embedding model ({e})")))?;
        let upserted = self.vectors.upsert(&collection, embedder.model(), request.docs, vectors).await?;
        Ok(UpsertReply { upserted: upserted as u32 })
    }

    pub async fn search(&self, request: SearchRequest) -> Result<SearchReply> {
        self.search_excluding(request, &[]).await
    }

    async fn search_excluding(&self, request: SearchRequest, exclude: &[String]) -> Result<SearchReply> {
        let collection = collection_or_default(&request.collection);
        vectors::validate_collection(&collection)?;
        let collection = tenancy::collection_key(&request.tenant, &collection);
        let embedder = self.embedder()?;
        let query = embedder
            .embed(std::slice::from_ref(&request.query))
            .await
            .map_err(|e| Error::Unavailable(format!("the embedding model ({e})")))?
            .pop()
            .unwrap_or_default();
        self.vectors.index().check(&collection, embedder.model(), query.len())?;
        let top_k = if request.top_k == 0 { 5 } else { request.top_k.min(1000) } as usize;
        let filter: HashMap<String, String> = request.filter.into_iter().collect();
        Ok(SearchReply { hits: self.vectors.index().search(&collection, &query, top_k, &filter, exclude) })
    }

    pub fn get_doc(&self, request: GetDocRequest) -> Result<MemoryDoc> {
        let collection =
            tenancy::collection_key(&request.tenant, &collection_or_default(&request.collection));
        self.vectors
            .index()
            .get(&collection, &request.id)
            .ok_or(Error::NotFound { what: "memory document", id: request.id })
    }

    /// The collections of the request's tenant, named as it named them.
    pub fn collections(&self, request: ListCollectionsRequest) -> ListCollectionsReply {
        let collections = self.vectors.index().collections().into_iter();
        let collections = collections
            .filter_map(|mut c| {
                c.name = tenancy::collection_of(&request.tenant, &c.name)?.to_owned();
                Some(c)
            })
            .collect();
        ListCollectionsReply { collections }
    }

    /// What the planner gets: the session window and the memories most related to the goal.
    pub async fn context(&self, request: ContextRequest) -> Result<ContextReply> {
        let mut session = match request.session_id.as_str() {
            "" => None,
            id => self.sessions.get(&tenancy::session_key(&request.tenant, id)).await?,
        }
        .map(|s| as_seen_by(&request.tenant, s));
        // The goal being planned may already be a turn; the planner has its text anyway.
        if let Some(session) = session.as_mut() {
            session.turns.retain(|t| request.goal_id.is_empty() || t.goal_id != request.goal_id);
        }
        let mut memories = Vec::new();
        if self.config.embedder.is_some() && !request.goal_text.trim().is_empty() {
            let top_k = if request.top_k == 0 { self.config.recall_top_k as u32 } else { request.top_k };
            let search = SearchRequest {
                query: request.goal_text.clone(),
                top_k,
                tenant: request.tenant.clone(),
                ..Default::default()
            };
            match self.search_excluding(search, std::slice::from_ref(&request.goal_id)).await {
                Ok(reply) => memories = reply.hits,
                Err(e) => warn!(error = %e, "cannot recall memories for a goal"),
            }
        }
        Ok(ContextReply { session, memories })
    }

    /// Records a goal's events: its text as the session's user turn at `GoalAccepted`, its
    /// answer (or failure) as the assistant's turn at the end, and, with semantic memory on, the
    /// goal and answer as a memory. Everything comes from the events themselves (the session is
    /// on goal-level events; the text on `GoalAccepted`, noted in memory's own bucket until the
    /// goal ends): memory does not read the dispatcher's goal store. `delivered` is how many times
    /// this event was delivered; a completion whose note has not been written yet (another
    /// replica still handles the acceptance) is retried a few times.
    async fn on_event(&self, event: &Event, delivered: i64) -> Result<()> {
        let turn = |role: &str, content: String| SessionTurn {
            session_id: tenancy::session_key(&event.tenant, &event.session_id),
            role: role.to_owned(),
            content,
            goal_id: event.goal_id.clone(),
            at_unix_ms: event.at_unix_ms,
        };
        let session = !event.session_id.is_empty();
        match &event.kind {
            Some(Kind::GoalAccepted(accepted)) => {
                if session {
                    let content = if accepted.text.trim().is_empty() {
                        format!("(a plan of {} nodes)", accepted.plan_nodes)
                    } else {
                        accepted.text.clone()
                    };
                    self.sessions.append(turn("user", content)).await?;
                }
                if let Some(notes) = &self.goal_notes
                    && !accepted.text.trim().is_empty()
                {
                    let note = GoalNote {
                        text: accepted.text.clone(),
                        tenant: accepted.labels.get("tenant").cloned(),
                    };
                    let value = serde_json::to_vec(&note).unwrap_or_default();
                    notes.put(&event.goal_id, value.into()).await.map_err(|e| kv_error("note goal", e))?;
                }
            }
            Some(Kind::GoalCompleted(done)) => {
                let answer = answer_text(&done.output_json);
                if session {
                    self.sessions.append(turn("assistant", answer.clone())).await?;
                }
                if let Some(notes) = &self.goal_notes {
                    let note = notes.get(&event.goal_id).await.map_err(|e| kv_error("read goal note", e))?;
                    let note = note.and_then(|v| serde_json::from_slice::<GoalNote>(&v).ok());
                    match note {
                        Some(note) => {
                            self.remember_goal(event, &note, &answer).await?;
                            let _ = notes.delete(&event.goal_id).await;
                        }
                        None if delivered < 3 => {
                            return Err(Error::Unavailable(format!(
                                "goal {} has no note yet",
                                event.goal_id
                            )));
                        }
                        // A goal given as a plan (no text), or one accepted before memory ran.
                        None => {}
                    }
                }
            }
            Some(Kind::GoalFailed(failed)) => {
                if session {
                    let e = failed.error.clone().unwrap_or_default();
                    let content = format!("The goal failed: {}: {}", e.code, e.message);
                    self.sessions.append(turn("assistant", content)).await?;
                }
                self.forget_note(&event.goal_id).await;
            }
            Some(Kind::GoalNeedsInput(needs)) if session => {
                self.sessions
                    .append(turn("assistant", format!("Needs input: {}", needs.explanation)))
                    .await?;
            }
            Some(Kind::GoalCancelled(_)) => self.forget_note(&event.goal_id).await,
            _ => {}
        }
        Ok(())
    }

    async fn forget_note(&self, goal_id: &str) {
        if let Some(notes) = &self.goal_notes {
            let _ = notes.delete(goal_id).await;
        }
    }

    /// Stores a finished goal and its answer as a semantic memory.
    async fn remember_goal(&self, event: &Event, note: &GoalNote, answer: &str) -> Result<()> {
        let mut metadata: HashMap<String, String> = [("kind", "goal"), ("goal", event.goal_id.as_str())]
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        if !event.session_id.is_empty() {
            metadata.insert("session".into(), event.session_id.clone());
        }
        if let Some(tenant) = &note.tenant {
            metadata.insert("tenant".into(), tenant.clone());
        }
        let doc = MemoryDoc {
            id: event.goal_id.clone(),
            text: format!("Goal: {}\nAnswer: {}", note.text.trim(), answer),
            metadata,
            updated_unix_ms: now_unix_ms(),
        };
        let request = UpsertRequest {
            collection: DEFAULT_COLLECTION.into(),
            docs: vec![doc],
            tenant: event.tenant.clone(),
            task_token: String::new(),
        };
        self.upsert(request).await?;
        Ok(())
    }
}

/// `state` (stored under its tenant's name) named as `tenant` gave it.
fn as_seen_by(tenant: &str, mut state: SessionState) -> SessionState {
    if let Some(id) = tenancy::session_of(tenant, &state.session_id) {
        state.session_id = id.to_owned();
    }
    for turn in &mut state.turns {
        turn.session_id.clone_from(&state.session_id);
    }
    state
}

/// What memory notes of a running goal (see `Topology::memory_goals_bucket`).
#[derive(serde::Serialize, serde::Deserialize)]
struct GoalNote {
    text: String,
    tenant: Option<String>,
}

use sessions::kv_error;

/// Makes the artifact store's max age the configured retention, whoever created it.
async fn set_artifact_retention(bus: &Bus, max_age: Duration) -> Result<()> {
    let name = format!("OBJ_{}", bus.topology().artifacts_bucket());
    let js = bus.jetstream();
    let jetstream_error = |e: &dyn std::fmt::Display| Error::JetStream {
        operation: "artifact retention",
        reason: e.to_string(),
    };
    let mut stream = js.get_stream(&name).await.map_err(|e| jetstream_error(&e))?;
    let mut config = stream.info().await.map_err(|e| jetstream_error(&e))?.config.clone();
    if config.max_age != max_age {
        config.max_age = max_age;
        js.update_stream(config).await.map_err(|e| jetstream_error(&e))?;
        info!(days = max_age.as_secs() / 86_400, "artifact retention set");
    }
    Ok(())
}

fn collection_or_default(name: &str) -> String {
    if name.is_empty() { DEFAULT_COLLECTION.to_owned() } else { name.to_owned() }
}

/// A goal's answer as text: the summarizer's `answer`, a top-level `text`, else the JSON.
fn answer_text(output_json: &str) -> String {
    let value: serde_json::Value = serde_json::from_str(output_json).unwrap_or(serde_json::Value::Null);
    let text = value
        .get("answer")
        .or_else(|| value.get("text"))
        .and_then(|v| v.as_str())
        .map(str::to_owned)
        .unwrap_or_else(|| output_json.to_owned());
    text.chars().take(2000).collect()
}

/// Serves NATS requests, follows goal events and sweeps expired artifacts until `shutdown`.
pub async fn run(memory: Memory, shutdown: CancellationToken) -> anyhow::Result<()> {
    let bus = memory.bus.clone();
    let topology = bus.topology().clone();
    let mut requests =
        bus.client().queue_subscribe(topology.all_memory_rpc(), topology.memory_queue_group()).await?;
    let consumer = bus
        .jetstream()
        .get_stream(topology.events_stream())
        .await?
        .get_or_create_consumer(
            topology.memory_consumer(),
            consumer::pull::Config {
                durable_name: Some(topology.memory_consumer().to_owned()),
                description: Some("Hermes memory: session turns and goal memories from goal events".into()),
                // Events from before the first start are history, not new turns.
                deliver_policy: DeliverPolicy::New,
                ack_wait: Duration::from_secs(60),
                max_deliver: 5,
                ..Default::default()
            },
        )
        .await?;
    let mut events = consumer.messages().await?;
    // Goal events are consumed as every other consumer's messages are (`consume_concurrently`,
    // settled by `Handled`), one at a time so a session's turns are recorded in their order; a
    // message that is no event is dead-lettered there. Requests and the sweep go on beside it.
    let consumed = {
        let (memory, bus, shutdown) = (memory.clone(), bus.clone(), shutdown.clone());
        async move {
            hermes_core::bus::consume_concurrently::<EventBatch, _, _, _, _>(
                &bus,
                "event",
                &mut events,
                1,
                &shutdown,
                move |delivery| {
                    let memory = memory.clone();
                    async move {
                        // A message holds a transition's events (one bare event, if stored before
                        // batching). Only goal-level events change memory, and a transition's
                        // last event is the one that can ask for a retry (a completion whose
                        // acceptance is still being noted), so a retry repeats no turn.
                        let events = hermes_core::events::of(&delivery.message, delivery.payload())
                            .unwrap_or_default();
                        for event in events.iter() {
                            if let Err(e) = memory.on_event(event, delivery.delivered()).await {
                                warn!(goal_id = %event.goal_id, error = %e, "cannot record a goal event in memory; will retry");
                                return Handled::Retry { after: Duration::from_secs(2) };
                            }
                        }
                        Handled::Done
                    }
                },
            )
            .await
        }
    };
    let serving = async {
        let mut sweep = tokio::time::interval(memory.config.sweep_every);
        info!(embedder = ?memory.config.embedder.as_ref().map(|e| e.model().to_owned()), "memory service serving");
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => break,
                Some(request) = requests.next() => {
                    let memory = memory.clone();
                    tokio::spawn(async move { serve_request(&memory, request).await });
                }
                _ = sweep.tick() => {
                    match bus.artifacts().sweep_expired(now_unix_ms()).await {
                        Ok(0) => {}
                        Ok(n) => info!(deleted = n, "expired artifacts deleted"),
                        Err(e) => warn!(error = %e, "artifact sweep failed"),
                    }
                    if let Some(ttl) = memory.config.memories_ttl {
                        match memory.vectors.expire(ttl).await {
                            Ok(0) => {}
                            Ok(n) => info!(deleted = n, "expired memories deleted"),
                            Err(e) => warn!(error = %e, "memory expiry failed"),
                        }
                    }
                }
            }
        }
    };
    tokio::join!(consumed, serving);
    // What changed since the last periodic snapshot, so the next start replays little. The
    // index's follower runs until this returns (its token is cancelled after `run`).
    let written = memory.vectors.snapshot_changed().await;
    if written > 0 {
        info!(collections = written, "vector snapshots written at shutdown");
    }
    Ok(())
}

/// Answers one NATS request: decode by method, run, reply with the proto or an error header.
async fn serve_request(memory: &Memory, request: async_nats::Message) {
    let Some(reply) = request.reply.clone() else { return };
    let method = request.subject.rsplit('.').next().unwrap_or_default().to_owned();
    let body = request.payload;
    fn decode<T: prost::Message + Default>(body: bytes::Bytes) -> Result<T> {
        T::decode(body).map_err(|e| Error::Decode { kind: "memory request", reason: e.to_string() })
    }
    let result: Result<Vec<u8>> = async {
        Ok(match method.as_str() {
            "context" => memory.context(decode(body)?).await?.encode_to_vec(),
            "append_turn" => memory.append_turn(decode(body)?).await?.encode_to_vec(),
            "session" => memory.session(decode(body)?).await?.encode_to_vec(),
            "list_sessions" => memory.list_sessions(decode(body)?).await?.encode_to_vec(),
            // What agents' memory tools send: each must carry its task's token, for its tenant.
            "upsert" => {
                let request: UpsertRequest = decode(body)?;
                memory.task_tenant(&request.task_token, &request.tenant)?;
                memory.upsert(request).await?.encode_to_vec()
            }
            "search" => {
                let request: SearchRequest = decode(body)?;
                memory.task_tenant(&request.task_token, &request.tenant)?;
                memory.search(request).await?.encode_to_vec()
            }
            "get_doc" => {
                let request: GetDocRequest = decode(body)?;
                memory.task_tenant(&request.task_token, &request.tenant)?;
                memory.get_doc(request)?.encode_to_vec()
            }
            "collections" => memory.collections(decode(body)?).encode_to_vec(),
            // Task data an agent with its own identity reaches only through here, with its task's token.
            "ledger" => memory.task_ledger(decode(body)?).await?.encode_to_vec(),
            "tool_cache" => memory.task_tool_cache(decode(body)?).await?.encode_to_vec(),
            "artifact_info" => memory.task_artifact_info(decode(body)?).await?.encode_to_vec(),
            "artifact_read" => memory.task_artifact_read(decode(body)?).await?.encode_to_vec(),
            "artifact_part" => memory.task_artifact_part(decode(body)?).await?.encode_to_vec(),
            "artifact_commit" => memory.task_artifact_commit(decode(body)?).await?.encode_to_vec(),
            other => {
                return Err(Error::InvalidArgument {
                    field: "method".into(),
                    reason: format!("no memory method `{other}`"),
                });
            }
        })
    }
    .await;
    let client = memory.bus.client();
    let sent = match result {
        Ok(body) => client.publish(reply, body.into()).await,
        Err(e) => {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(ERROR_CODE_HEADER, e.code().as_str());
            headers.insert(ERROR_MESSAGE_HEADER, e.to_string().replace(['\r', '\n'], " ").as_str());
            client.publish_with_headers(reply, headers, bytes::Bytes::new()).await
        }
    };
    if let Err(e) = sent {
        warn!(error = %e, "cannot reply to a memory request");
    }
}
