//! The memory service over NATS request/reply, for the planner, agents' `memory.*` tools and
//! anything else inside the cluster. Requests go to `hermes.memory.rpc.<method>`; replicas of the
//! service share them in a queue group.

use std::time::Duration;

use hermes_core::text::clip;
use hermes_core::{Error, ErrorCode, Result, Topology};
use hermes_proto::{
    AppendTurnRequest, ContextReply, ContextRequest, GetDocRequest, ListCollectionsReply,
    ListCollectionsRequest, MemoryDoc, SearchReply, SearchRequest, SessionRequest, SessionState, UpsertReply,
    UpsertRequest,
};

/// Reply header with the error code of a failed memory request.
pub const ERROR_CODE_HEADER: &str = "Hermes-Error-Code";
/// Reply header with the error message of a failed memory request.
pub const ERROR_MESSAGE_HEADER: &str = "Hermes-Error-Message";
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
        let subject = self.topology.memory_rpc(method);
        let sent =
            tokio::time::timeout(self.timeout, self.client.request(subject, request.encode_to_vec().into()))
                .await;
        let reply = match sent {
            Err(_) => {
                return Err(Error::Timeout {
                    what: format!("memory `{method}`"),
                    elapsed_ms: self.timeout.as_millis() as u64,
                });
            }
            Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
                return Err(Error::Unavailable("the memory service (no replica is running)".into()));
            }
            Ok(Err(e)) => return Err(Error::Unavailable(format!("the memory service ({e})"))),
            Ok(Ok(reply)) => reply,
        };
        if let Some(headers) = &reply.headers
            && let Some(code) = headers.get(ERROR_CODE_HEADER)
        {
            let message =
                headers.get(ERROR_MESSAGE_HEADER).map(|m| m.as_str().to_owned()).unwrap_or_default();
            return Err(match ErrorCode::parse(code.as_str()) {
                Some(ErrorCode::InvalidArgument) => {
                    Error::InvalidArgument { field: method.to_owned(), reason: message }
                }
                Some(ErrorCode::NotFound) => Error::NotFound { what: "memory", id: message },
                Some(ErrorCode::FailedPrecondition) => Error::FailedPrecondition(message),
                // Refused for its task token: not to be retried as if the service were away.
                Some(ErrorCode::Denied) => Error::Denied { reason: message },
                _ => Error::Unavailable(message),
            });
        }
        R::decode(reply.payload).map_err(|e| Error::Decode { kind: "memory reply", reason: e.to_string() })
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
