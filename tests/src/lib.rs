//! Shared helpers for the end-to-end tests: a [`TestStack`] runs a real nats-server and every
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

/// The repository root; agents use it as their workspace so example paths resolve.
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().expect("repo root")
}

/// Knobs for a test stack.
#[derive(Clone)]
pub struct StackOptions {
    pub agents: u32,
    pub max_concurrency: u32,
    pub max_nodes: usize,
    /// An OpenAI-compatible endpoint (the scripted server) for a planner using the model
    /// `planner-model`, a summarizer using `summarizer-model`, and agents' `agent.run` using
    /// `agent-model`.
    pub llm_base_url: Option<String>,
    /// The agents' workspace; the repository root (so the examples resolve) when unset.
    pub workspace: Option<PathBuf>,
    /// Tools whose calls wait for approval, and how long.
    pub confirm_tools: Vec<String>,
    pub approval_timeout: Duration,
    /// Runs the memory service in the stack.
    pub memory: Option<hermes_memory::MemoryConfig>,
    /// LLM prices for goals' estimated cost.
    pub prices: hermes_dispatcher::engine::Prices,
}

impl Default for StackOptions {
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
        }
    }
}

/// An OpenAI-compatible client for `model` at `base_url`, retrying quickly.
pub fn model(base_url: &str, model: &str) -> std::sync::Arc<dyn hermes_llm::ChatModel> {
    let mut config = hermes_llm::OpenAiConfig::new(base_url, model);
    config.backoff = Duration::from_millis(20);
    config.timeout = Duration::from_secs(10);
    std::sync::Arc::new(hermes_llm::OpenAiChat::new(config).expect("valid llm config"))
}

/// A nats-server plus the whole Hermes stack, stopped on drop of its token.
pub struct TestStack {
    pub nats: NatsServer,
    pub stack: Option<Stack>,
    pub client: DispatcherClient<Channel>,
    pub bus: hermes_core::Bus,
    shutdown: CancellationToken,
}

impl TestStack {
    pub async fn start() -> TestStack {
        Self::start_with(StackOptions::default()).await
    }

    pub async fn start_with(options: StackOptions) -> TestStack {
        Self::start_on(NatsServer::start(), options).await
    }

    /// Stops every service (the nats-server and its store stay) and starts them afresh, as a
    /// redeploy or a crash and restart of every pod would.
    pub async fn restart_services(mut self, options: StackOptions) -> TestStack {
        self.shutdown.cancel();
        if let Some(stack) = self.stack.take() {
            stack.stop().await;
        }
        Self::start_on(self.nats, options).await
    }

    async fn start_on(nats: NatsServer, options: StackOptions) -> TestStack {
        let agents = (1..=options.agents)
            .map(|i| {
                let workspace = options.workspace.clone().unwrap_or_else(repo_root);
                let mut config = AgentConfig::new(format!("test-agent-{i}"), workspace);
                config.max_concurrency = options.max_concurrency;
                config.confirm_tools = options.confirm_tools.clone();
                config.approval_timeout = options.approval_timeout;
                config.llm = options
                    .llm_base_url
                    .as_deref()
                    .map(|url| hermes_executor::agent_loop::AgentModel(model(url, "agent-model")));
                config
            })
            .collect();
        let config = StackConfig {
            nats_url: nats.url(),
            registry: Default::default(),
            agents,
            dispatcher: DispatcherConfig {
                grpc_listen: "127.0.0.1:0".parse().unwrap(),
                max_nodes: options.max_nodes,
                summarizer: options
                    .llm_base_url
                    .as_deref()
                    .map(|url| Summarizer(model(url, "summarizer-model"))),
                prices: options.prices,
                ..Default::default()
            },
            planner: options
                .llm_base_url
                .as_deref()
                .map(|url| PlannerConfig::new(model(url, "planner-model"))),
            memory: options.memory.clone(),
        };
        let shutdown = CancellationToken::new();
        let stack = Stack::start(config, shutdown.clone()).await.expect("stack starts");
        let client = DispatcherClient::connect(stack.grpc_url()).await.expect("grpc connects");
        let bus = stack.bus().clone();
        TestStack { nats, stack: Some(stack), client, bus, shutdown }
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
        let stream = self
            .client
            .watch_goal(WatchGoalRequest { goal_id: goal_id.to_owned(), after_seq: 0 })
            .await
            .expect("watch starts")
            .into_inner();
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
