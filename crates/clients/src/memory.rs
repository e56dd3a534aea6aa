//! The memory service over NATS request/reply, for the planner, agents' `memory.*` tools and
//! anything else inside the cluster. Requests go to `hermes.memory.rpc.<method>`; replicas of the
//! service share them in a queue group.

use std::time::Duration;

use hermes_core::text::clip;
use hermes_core::{Result, Topology};
use hermes_proto::{
    AppendTurnRequest, ContextReply, ContextRequest, GetDocRequest, ListCollectionsReply,
    ListCollectionsRequest, MemoryDoc, SearchReply, SearchRequest, SessionRequest, SessionState, UpsertReply,
    UpsertRequest,
};

pub use hermes_core::broker::{ERROR_CODE_HEADER, ERROR_MESSAGE_HEADER};
/// The collection memories go to when a request names none.
pub const DEFAULT_COLLECTION: &str = "memory";

/// A client of the memory service. Cheap to clone.
#[derive(Clone)]
pub struct MemoryClient {
    client: async_nats::Client,
    topology: Topology,
    timeout: Duration,
}

impl MemoryClient {
    pub fn new(bus: &hermes_core::Bus) -> Self {
        Self {
            client: bus.client().clone(),
            topology: bus.topology().clone(),
            timeout: Duration::from_secs(15),
        }
    }

    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    async fn call<Q: prost::Message, R: prost::Message + Default>(
        &self,
        method: &str,
        request: &Q,
    ) -> Result<R> {
        hermes_core::broker::request(&self.client, &self.topology, method, request, self.timeout).await
    }

    pub async fn context(&self, request: &ContextRequest) -> Result<ContextReply> {
        self.call("context", request).await
    }

    pub async fn append_turn(&self, request: &AppendTurnRequest) -> Result<SessionState> {
        self.call("append_turn", request).await
    }

    /// Session `session_id` of `tenant` (empty: no tenant, auth off).
    pub async fn session(&self, tenant: &str, session_id: &str) -> Result<SessionState> {
        let request = SessionRequest { session_id: session_id.to_owned(), tenant: tenant.to_owned() };
        self.call("session", &request).await
    }

    /// The sessions of `tenant`; with the empty tenant, every session under its stored name.
    pub async fn sessions(&self, tenant: &str) -> Result<Vec<SessionState>> {
        let request = hermes_proto::ListSessionsRequest { tenant: tenant.to_owned() };
        let reply: hermes_proto::ListSessionsReply = self.call("list_sessions", &request).await?;
        Ok(reply.sessions)
    }

    pub async fn upsert(&self, request: &UpsertRequest) -> Result<UpsertReply> {
        self.call("upsert", request).await
    }

    pub async fn search(&self, request: &SearchRequest) -> Result<SearchReply> {
        self.call("search", request).await
    }

    pub async fn get_doc(&self, request: &GetDocRequest) -> Result<MemoryDoc> {
        self.call("get_doc", request).await
    }

    /// The collections of `tenant` (empty: every collection under its stored name).
    pub async fn collections(&self, tenant: &str) -> Result<ListCollectionsReply> {
        self.call("collections", &ListCollectionsRequest { tenant: tenant.to_owned() }).await
    }
}

/// A session as a prompt section: the summary, then the recent turns.
pub fn render_session(state: &SessionState) -> String {
    let mut text = String::new();
    if let Some(summary) = &state.summary {
        let section = |title: &str, items: &[String], text: &mut String| {
            if !items.is_empty() {
                text.push_str(&format!("{title}:\n"));
                for item in items {
                    text.push_str(&format!("- {item}\n"));
                }
            }
        };
        section("User preferences", &summary.preferences, &mut text);
        section("Confirmed facts", &summary.facts, &mut text);
        section("Open items", &summary.open_items, &mut text);
    }
    if !state.turns.is_empty() {
        text.push_str("Recent turns, oldest first:\n");
        for turn in &state.turns {
            text.push_str(&format!("{}: {}\n", turn.role, clip(&turn.content, 1000)));
        }
    }
    text
}
