//! The dispatcher's settings as its parts read them ([`DispatcherConfig`]); `service.rs` builds
//! them from the `[dispatcher]` section.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hermes_core::access;

use hermes_llm::ChatModel;

use crate::engine;

/// Longest goal text accepted.
pub const MAX_GOAL_TEXT_BYTES: usize = 16 * 1024;

/// Dispatcher settings.
#[derive(Debug, Clone)]
pub struct DispatcherConfig {
    /// Where the gRPC API listens.
    pub grpc_listen: SocketAddr,
    pub max_nodes: usize,
    /// Whole-goal timeout when the goal does not set one.
    pub goal_timeout: Duration,
    /// Per-attempt deadline when the node does not set one.
    pub node_timeout: Duration,
    /// How long a catalogue snapshot is reused for plan validation.
    pub catalog_ttl: Duration,
    /// Results applied at once; results of one goal are applied one at a time.
    pub result_concurrency: usize,
    /// How long a node waits for an agent serving its task type before it fails with
    /// `NO_CAPABLE_AGENT`.
    pub no_agent_wait: Duration,
    /// A planner service serves this deployment: goals given as text are accepted and failed
    /// nodes of such goals are replanned.
    pub planner: bool,
    /// Writes the answer of goals given as text from their nodes' outputs.
    pub summarizer: Option<Summarizer>,
    /// LLM prices for goals' estimated cost and cost budgets (0: cost is not estimated).
    pub prices: engine::Prices,
    /// Largest gRPC request decoded; a larger one is refused with `INVALID_ARGUMENT` naming it.
    pub grpc_max_message_bytes: usize,
    /// TLS of the gRPC server (`[grpc.tls]`), or plaintext.
    pub grpc_tls: Option<hermes_core::tls::TlsFiles>,
    /// The HTTP API, or `None` for none (the default of the config; the settings turn it on).
    pub http: Option<HttpConfig>,
    /// Goal event streams (gRPC, SSE, WebSocket) one client may hold open at once.
    pub max_watches_per_client: usize,
    /// Goal event streams all clients together may hold open at once.
    pub max_watches: usize,
    /// Who may call the API doors (API tokens; open when none are configured), read again on
    /// SIGHUP.
    pub access: Arc<access::Tokens>,
    /// Serve a non-loopback address with auth off (behind a proxy that authenticates).
    pub allow_unauthenticated: bool,
    /// Record every model exchange of a goal (planner, summarizer, agents) and its agent loops'
    /// tool calls, for `hermes replay`.
    pub record_model_exchanges: bool,
    /// Outbound webhooks: the retry schedule, the attempt timeout, the address filter.
    pub webhooks: WebhookConfig,
}

/// How webhooks are sent (`[dispatcher.webhooks]`, docs/webhooks.md).
#[derive(Debug, Clone, PartialEq)]
pub struct WebhookConfig {
    /// The wait before each attempt, the first usually zero; its length is the attempts made
    /// before a delivery goes to the DLQ.
    pub schedule: Vec<Duration>,
    /// How long one attempt may take.
    pub timeout: Duration,
    /// Address entries (`10.0.0.0/8`, `127.0.0.1`) sent to despite being private, loopback or
    /// link-local, as in `http.fetch`'s allowlist.
    pub allow: Vec<String>,
}

impl Default for WebhookConfig {
    fn default() -> Self {
        WebhookConfig {
            schedule: crate::webhooks::DEFAULT_SCHEDULE.to_vec(),
            timeout: crate::webhooks::DEFAULT_TIMEOUT,
            allow: Vec::new(),
        }
    }
}

impl Default for DispatcherConfig {
    fn default() -> Self {
        Self {
            grpc_listen: ([127, 0, 0, 1], 50051).into(),
            max_nodes: hermes_core::plan::DEFAULT_MAX_NODES,
            goal_timeout: Duration::from_secs(600),
            node_timeout: Duration::from_secs(180),
            catalog_ttl: Duration::from_secs(2),
            result_concurrency: 256,
            no_agent_wait: Duration::from_secs(30),
            planner: false,
            summarizer: None,
            prices: engine::Prices::default(),
            grpc_max_message_bytes: hermes_core::grpc::DEFAULT_MAX_MESSAGE_BYTES,
            grpc_tls: None,
            http: None,
            max_watches_per_client: 256,
            max_watches: 4096,
            access: access::Tokens::fixed(access::Access::open()),
            allow_unauthenticated: false,
            record_model_exchanges: true,
            webhooks: WebhookConfig::default(),
        }
    }
}

/// Where and how the HTTP API listens (`[dispatcher.http]`).
#[derive(Debug, Clone, PartialEq)]
pub struct HttpConfig {
    pub listen: SocketAddr,
    /// Largest request body; a larger one is `413` with a problem naming the limit.
    pub max_body_bytes: usize,
    /// Origins allowed to call the API from a browser (`*` for any); empty: no CORS headers.
    pub cors_allow_origins: Vec<String>,
    /// Host names the server answers to besides its listen address (and `localhost` on
    /// loopback); `.example.com` allows its subdomains, `*` any. Others are `421`.
    pub allowed_hosts: Vec<String>,
    /// TLS (`[dispatcher.http.tls]`), or plaintext.
    pub tls: Option<hermes_core::tls::TlsFiles>,
    /// The web console at `/` (`[dispatcher.http.console]`).
    pub console: crate::console::ConsoleConfig,
}

/// Default request body limit: 1 MiB.
pub const DEFAULT_MAX_BODY_BYTES: usize = 1024 * 1024;

/// The model that writes answers.
#[derive(Clone)]
pub struct Summarizer(pub Arc<dyn ChatModel>);

impl std::fmt::Debug for Summarizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Summarizer({}/{})", self.0.provider(), self.0.model())
    }
}
