//! Shared helpers for the end-to-end tests: a [`Sandbox`] runs a real nats-server and every
//! service in-process, and hands out a real gRPC client.

use std::path::{Path, PathBuf};
use std::time::Duration;

use futures::StreamExt;
use hermes_cli::stack::{Stack, StackConfig};
use hermes_dispatcher::DispatcherConfig;
use hermes_dispatcher::Summarizer;
use hermes_executor::AgentConfig;
use hermes_planner::PlannerConfig;
use hermes_proto::dispatcher_client::DispatcherClient;
use hermes_proto::{Event, GoalSpec, SubmitGoalRequest, TaskPlan, WatchGoalRequest};
use hermes_test_util::NatsServer;
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;

/// The `hermes` binary, built by `hermes-cli` (`make test` builds it before the tests run).
pub fn hermes_bin() -> PathBuf {
    hermes_test_util::process::built_binary("hermes")
}

/// The repository root; agents use it as their workspace so example paths resolve.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("repo root")
}

/// How to build a [`Sandbox`]: every knob a test turns, with the defaults of a plain stack (two
/// agents serving every built-in tool over the repository root, no model, no memory).
#[derive(Clone)]
pub struct SandboxBuilder {
    agents: u32,
    max_concurrency: u32,
    max_nodes: usize,
    llm_base_url: Option<String>,
    workspace: Option<PathBuf>,
    confirm_tools: Vec<String>,
    approval_timeout: Duration,
    memory: Option<hermes_memory::MemoryConfig>,
    prices: hermes_dispatcher::engine::Prices,
    extra_agents: Vec<AgentConfig>,
    heartbeat_ttl: Option<Duration>,
    no_agent_wait: Option<Duration>,
    catalog_ttl: Option<Duration>,
    max_watches_per_client: Option<usize>,
    api_tokens: Option<String>,
    cors_allow_origins: Vec<String>,
    webhooks: Option<hermes_dispatcher::WebhookConfig>,
    cache_tools: std::collections::BTreeMap<String, u64>,
}

impl Default for SandboxBuilder {
    fn default() -> Self {
        Self {
            agents: 2,
            max_concurrency: 16,
            max_nodes: hermes_core::plan::DEFAULT_MAX_NODES,
            llm_base_url: None,
            workspace: None,
            confirm_tools: Vec::new(),
            approval_timeout: Duration::from_secs(600),
            memory: None,
            prices: Default::default(),
            extra_agents: Vec::new(),
            heartbeat_ttl: None,
            no_agent_wait: None,
            catalog_ttl: None,
            max_watches_per_client: None,
            api_tokens: None,
            cors_allow_origins: Vec::new(),
            webhooks: None,
            cache_tools: Default::default(),
        }
    }
}

impl SandboxBuilder {
    /// How many generic agents (`test-agent-1`, ...) run in the stack (default 2).
    pub fn agents(mut self, n: u32) -> Self {
        self.agents = n;
        self
    }

    /// Each generic agent's `max_concurrency` (default 16).
    pub fn max_concurrency(mut self, n: u32) -> Self {
        self.max_concurrency = n;
        self
    }

    /// Tools whose results the generic agents cache, by tool name to seconds (0: the tool's
    /// declared TTL), as an agent config's `cache` names them.
    pub fn cache(mut self, tools: &[(&str, u64)]) -> Self {
        self.cache_tools = tools.iter().map(|(t, s)| ((*t).to_owned(), *s)).collect();
        self
    }

    /// Adds an agent configured by the test, beside the generic ones.
    pub fn agent(mut self, config: AgentConfig) -> Self {
        self.extra_agents.push(config);
        self
    }

    /// The dispatcher's plan size limit.
    pub fn max_nodes(mut self, n: usize) -> Self {
        self.max_nodes = n;
        self
    }

    /// An OpenAI-compatible endpoint (the scripted server) for a planner using the model
    /// `planner-model`, a summarizer using `summarizer-model`, and the generic agents' `agent.run`
    /// using `agent-model`.
    pub fn llm(mut self, base_url: impl Into<String>) -> Self {
        self.llm_base_url = Some(base_url.into());
        self
    }

    /// The generic agents' workspace (default: the repository root, so the examples resolve).
    pub fn workspace(mut self, dir: impl Into<PathBuf>) -> Self {
        self.workspace = Some(dir.into());
        self
    }

    /// Origins a browser may call the HTTP API from (`dispatcher.http.cors_allow_origins`).
    pub fn cors_allow_origins(mut self, origins: &[&str]) -> Self {
        self.cors_allow_origins = origins.iter().map(|o| o.to_string()).collect();
        self
    }

    /// Tools whose calls wait for approval on the generic agents, and for how long.
    pub fn confirm(mut self, tools: &[&str], timeout: Duration) -> Self {
        self.confirm_tools = tools.iter().map(|t| t.to_string()).collect();
        self.approval_timeout = timeout;
        self
    }

    /// Runs the memory service in the stack.
    pub fn memory(mut self, config: hermes_memory::MemoryConfig) -> Self {
        self.memory = Some(config);
        self
    }

    /// LLM prices for goals' estimated cost.
    pub fn prices(mut self, prices: hermes_dispatcher::engine::Prices) -> Self {
        self.prices = prices;
        self
    }

    /// The registry's heartbeat TTL (default the registry's).
    pub fn heartbeat_ttl(mut self, ttl: Duration) -> Self {
        self.heartbeat_ttl = Some(ttl);
        self
    }

    /// Event streams one client may hold open (default the dispatcher's).
    pub fn max_watches_per_client(mut self, n: usize) -> Self {
        self.max_watches_per_client = Some(n);
        self
    }

    /// Turns auth on with these API tokens (the TOML of an API tokens file, docs/security.md).
    pub fn api_tokens(mut self, toml: &str) -> Self {
        self.api_tokens = Some(toml.to_owned());
        self
    }

    /// How long a node waits for an agent serving its type (default the dispatcher's).
    pub fn no_agent_wait(mut self, wait: Duration) -> Self {
        self.no_agent_wait = Some(wait);
        self
    }

    /// How long the dispatcher trusts its cached copy of the registry's catalogue (default the
    /// dispatcher's).
    pub fn catalog_ttl(mut self, ttl: Duration) -> Self {
        self.catalog_ttl = Some(ttl);
        self
    }

    /// Starts a nats-server and the stack on it.
    pub async fn start(self) -> Sandbox {
        self.start_on(NatsServer::start()).await
    }

    /// How webhooks are sent (a short schedule, a local receiver allowed).
    pub fn webhooks(mut self, config: hermes_dispatcher::WebhookConfig) -> Self {
        self.webhooks = Some(config);
        self
    }

    /// Starts the stack on `nats`.
    pub async fn start_on(self, nats: NatsServer) -> Sandbox {
        let mut agents: Vec<AgentConfig> = (1..=self.agents)
            .map(|i| {
                let workspace = self.workspace.clone().unwrap_or_else(repo_root);
                let mut config = AgentConfig::new(format!("test-agent-{i}"), workspace);
                config.max_concurrency = self.max_concurrency;
                config.confirm_tools = self.confirm_tools.clone();
                config.approval_timeout = self.approval_timeout;
                config.cache_tools = self.cache_tools.clone();
                config.llm = self
                    .llm_base_url
                    .as_deref()
                    .map(|url| hermes_executor::agent_loop::AgentModel(model(url, "agent-model")));
                config
            })
            .collect();
        agents.extend(self.extra_agents.iter().cloned());
        let mut registry = hermes_registry::RegistryConfig::default();
        if let Some(ttl) = self.heartbeat_ttl {
            registry.heartbeat_ttl = ttl;
        }
        let mut dispatcher = DispatcherConfig {
            grpc_listen: "127.0.0.1:0".parse().unwrap(),
            max_nodes: self.max_nodes,
            summarizer: self.llm_base_url.as_deref().map(|url| Summarizer(model(url, "summarizer-model"))),
            prices: self.prices,
            // The HTTP API on a free port, as `hermes up` serves it.
            http: Some(hermes_dispatcher::http::HttpConfig {
                listen: "127.0.0.1:0".parse().unwrap(),
                max_body_bytes: hermes_dispatcher::http::DEFAULT_MAX_BODY_BYTES,
                cors_allow_origins: self.cors_allow_origins.clone(),
                allowed_hosts: Vec::new(),
                tls: None,
                console: Default::default(),
            }),
            ..Default::default()
        };
        if let Some(n) = self.max_watches_per_client {
            dispatcher.max_watches_per_client = n;
        }
        if let Some(tokens) = &self.api_tokens {
            let access = hermes_dispatcher::access::Access::parse(tokens).expect("valid API tokens");
            dispatcher.access = hermes_dispatcher::access::Tokens::fixed(access);
        }
        if let Some(ttl) = self.catalog_ttl {
            dispatcher.catalog_ttl = ttl;
        }
        if let Some(wait) = self.no_agent_wait {
            dispatcher.no_agent_wait = wait;
        }
        if let Some(webhooks) = &self.webhooks {
            dispatcher.webhooks = webhooks.clone();
        }
        let config = StackConfig {
            nats_url: nats.url().into(),
            registry,
            agents,
            dispatcher,
            planner: self.llm_base_url.as_deref().map(|url| PlannerConfig::new(model(url, "planner-model"))),
            memory: self.memory.clone(),
            users: None,
        };
        let shutdown = CancellationToken::new();
        let stack = Stack::start(config, shutdown.clone()).await.expect("stack starts");
        let client = DispatcherClient::connect(stack.grpc_url()).await.expect("grpc connects");
        let bus = stack.bus().clone();
        Sandbox { nats, stack: Some(stack), client, bus, shutdown, builder: self }
    }
}

/// An OpenAI-compatible client for `model` at `base_url`, retrying quickly.
pub fn model(base_url: &str, model: &str) -> std::sync::Arc<dyn hermes_llm::ChatModel> {
    let mut config = hermes_llm::OpenAiConfig::new(base_url, model);
    config.backoff = Duration::from_millis(20);
    config.timeout = Duration::from_secs(10);
    std::sync::Arc::new(hermes_llm::OpenAiChat::new(config).expect("valid llm config"))
}

/// The in-process test harness: a real nats-server and every Hermes service in this process
/// (composed by the same [`Stack`] as `hermes up`), with a real gRPC client. Built with
/// [`Sandbox::builder`]; the processes a test kills or freezes are the process builders of
/// `hermes_test_util::process`.
pub struct Sandbox {
    pub nats: NatsServer,
    pub stack: Option<Stack>,
    pub client: DispatcherClient<Channel>,
    pub bus: hermes_core::Bus,
    shutdown: CancellationToken,
    builder: SandboxBuilder,
}

impl Sandbox {
    pub fn builder() -> SandboxBuilder {
        SandboxBuilder::default()
    }

    /// A plain stack: the builder's defaults.
    pub async fn start() -> Sandbox {
        Self::builder().start().await
    }

    /// The running stack, for what only it can do (stop one agent, restart the registry, ...).
    pub fn stack(&mut self) -> &mut Stack {
        self.stack.as_mut().expect("the stack runs")
    }

    /// The HTTP API's base URL, `http://127.0.0.1:PORT`.
    pub fn http_url(&self) -> String {
        self.stack.as_ref().expect("the stack runs").http_url().expect("the sandbox serves HTTP")
    }

    /// A Registry API client.
    pub async fn registry_client(&self) -> hermes_proto::registry_client::RegistryClient<Channel> {
        let url = self.stack.as_ref().expect("the stack runs").grpc_url();
        hermes_proto::registry_client::RegistryClient::connect(url).await.expect("grpc connects")
    }

    /// Kills the nats-server (`kill -9`, its store kept) and waits until the stack's connection
    /// has noticed, which can take the client a moment.
    pub async fn crash_nats(&mut self) {
        self.nats.kill();
        let noticed = std::time::Instant::now();
        while self.bus.client().connection_state() == async_nats::connection::State::Connected {
            assert!(noticed.elapsed() < Duration::from_secs(30), "the client never noticed the crash");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Stops every service (the nats-server and its store stay) and starts them afresh with the
    /// same settings, as a redeploy or a crash and restart of every pod would.
    pub async fn restart_services(self) -> Sandbox {
        self.restart_services_with(|| async {}).await
    }

    /// [`Sandbox::restart_services`], running `between` while every service is stopped.
    pub async fn restart_services_with<F: std::future::Future<Output = ()>>(
        mut self,
        between: impl FnOnce() -> F,
    ) -> Sandbox {
        self.shutdown.cancel();
        if let Some(stack) = self.stack.take() {
            stack.stop().await;
        }
        between().await;
        let builder = self.builder.clone();
        builder.start_on(self.nats).await
    }

    /// Submits a plan and returns the goal id.
    pub async fn submit(&mut self, plan: TaskPlan) -> Result<String, tonic::Status> {
        let spec = GoalSpec { plan: Some(plan), ..Default::default() };
        self.submit_spec(spec).await.map(|(id, _)| id)
    }

    pub async fn submit_spec(&mut self, spec: GoalSpec) -> Result<(String, bool), tonic::Status> {
        let reply = self.client.submit_goal(SubmitGoalRequest { spec: Some(spec) }).await?.into_inner();
        Ok((reply.goal_id, reply.duplicate))
    }

    /// Every event of a goal until it ends, within 30 s.
    pub async fn events(&mut self, goal_id: &str) -> Vec<Event> {
        let request = tonic::Request::new(WatchGoalRequest { goal_id: goal_id.to_owned(), after_seq: 0 });
        self.watch_to_end(request).await
    }

    /// [`Sandbox::events`] for a caller with an API token (auth on).
    pub async fn events_as(&self, goal_id: &str, token: &str) -> Vec<Event> {
        let mut request = tonic::Request::new(WatchGoalRequest { goal_id: goal_id.to_owned(), after_seq: 0 });
        request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("a token"));
        self.watch_to_end(request).await
    }

    async fn watch_to_end(&self, request: tonic::Request<WatchGoalRequest>) -> Vec<Event> {
        let stream = self.client.clone().watch_goal(request).await.expect("watch starts").into_inner();
        tokio::time::timeout(Duration::from_secs(30), stream.map(|e| e.expect("event")).collect::<Vec<_>>())
            .await
            .expect("goal ends within 30 s")
    }

    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(stack) = self.stack.take() {
            stack.stop().await;
        }
    }
}

/// A short name for an event's kind, for order assertions.
pub fn kind_name(event: &Event) -> String {
    use hermes_proto::event::Kind;
    match &event.kind {
        Some(Kind::GoalAccepted(_)) => "accepted".into(),
        Some(Kind::PlanCreated(_)) => "plan".into(),
        Some(Kind::TaskDispatched(e)) => format!("dispatched:{}", e.node_id),
        Some(Kind::TaskSucceeded(e)) => format!("succeeded:{}", e.node_id),
        Some(Kind::TaskFailed(e)) => format!("failed:{}", e.node_id),
        Some(Kind::TaskRetrying(e)) => format!("retrying:{}", e.node_id),
        Some(Kind::GoalCompleted(_)) => "completed".into(),
        Some(Kind::GoalFailed(_)) => "goal_failed".into(),
        Some(Kind::GoalCancelled(_)) => "cancelled".into(),
        Some(Kind::ToolCalled(e)) => format!("tool:{}:{}", e.node_id, e.tool),
        Some(other) => format!("{other:?}"),
        None => "none".into(),
    }
}

/// A plan node from a JSON inputs literal.
pub fn node(id: &str, task_type: &str, inputs: serde_json::Value, deps: &[&str]) -> hermes_proto::TaskNode {
    hermes_proto::TaskNode {
        id: id.into(),
        task_type: task_type.into(),
        inputs_json: inputs.to_string(),
        depends_on: deps.iter().map(|d| d.to_string()).collect(),
        ..Default::default()
    }
}

/// `message` as a gRPC request carrying `token` (`authorization: Bearer <token>`), for stacks
/// with auth on.
pub fn with_token<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    request.metadata_mut().insert("authorization", format!("Bearer {token}").parse().expect("a token"));
    request
}

/// The memory service with the local MiniLM embeddings (`HERMES_LOCAL_EMBEDDING_DIR`, else
/// `.tools/models/all-MiniLM-L6-v2`; `make models`), so goals are remembered and recalled.
#[cfg(feature = "local")]
pub fn local_memory() -> hermes_memory::MemoryConfig {
    let dir = std::env::var_os("HERMES_LOCAL_EMBEDDING_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join(".tools/models/all-MiniLM-L6-v2"));
    let embedding = hermes_llm::embed::EmbeddingSettings {
        provider: Some("local".into()),
        local_dir: dir,
        ..Default::default()
    };
    hermes_memory::MemoryConfig {
        embedder: embedding.embedder().expect("the local embedding model"),
        ..Default::default()
    }
}
