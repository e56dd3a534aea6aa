//! Command-line flags for running one agent as its own process, shared by the `hermes-executor`
//! binary and `hermes agent`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use crate::{Agent, AgentConfig};

/// Flags (each with an environment variable) for one agent.
#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// NATS server URL.
    #[arg(long, env = "HERMES_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// Unique among live agents: [A-Za-z0-9_-]{1,64}.
    #[arg(long, env = "HERMES_AGENT_ID")]
    pub agent_id: String,
    /// Pool this agent belongs to.
    #[arg(long, env = "HERMES_AGENT_POOL", default_value = "default")]
    pub pool: String,
    /// Comma-separated tools to serve; empty serves every built-in tool.
    #[arg(long, env = "HERMES_AGENT_TOOLS", value_delimiter = ',', default_value = "")]
    pub tools: Vec<String>,
    /// Comma-separated labels routing can prefer (e.g. gpu,eu-west).
    #[arg(long, env = "HERMES_AGENT_TAGS", value_delimiter = ',', default_value = "")]
    pub tags: Vec<String>,
    /// Tasks run at once.
    #[arg(long, env = "HERMES_AGENT_MAX_CONCURRENCY", default_value_t = 16)]
    pub max_concurrency: u32,
    /// Dir that file tools may read.
    #[arg(long, env = "HERMES_AGENT_WORKSPACE", default_value = ".")]
    pub workspace: PathBuf,
    /// Heartbeat period in milliseconds; the registry's TTL must be at least three periods.
    #[arg(long, env = "HERMES_HEARTBEAT_MS", default_value_t = 10_000)]
    pub heartbeat_ms: u64,
    /// Comma-separated hosts `http.fetch` may reach (`*.example.com` for subdomains).
    #[arg(long, env = "HERMES_AGENT_HTTP_ALLOW", value_delimiter = ',', default_value = "")]
    pub http_allow: Vec<String>,
    /// Comma-separated tools whose calls wait for a human's approval (`hermes approve`).
    #[arg(long, env = "HERMES_AGENT_CONFIRM", value_delimiter = ',', default_value = "")]
    pub confirm: Vec<String>,
    /// Seconds a call waits for approval before it counts as denied.
    #[arg(long, env = "HERMES_APPROVAL_TIMEOUT_SECS", default_value_t = 600)]
    pub approval_timeout_secs: u64,
    /// The model for agent nodes; with one the agent also serves `agent.run`.
    #[command(flatten)]
    pub llm: hermes_llm::config::LlmArgs,
}

impl AgentArgs {
    pub fn to_config(&self) -> anyhow::Result<AgentConfig> {
        let mut config = AgentConfig::new(self.agent_id.clone(), self.workspace.clone());
        config.pool = self.pool.clone();
        config.tools = self.tools.iter().filter(|t| !t.is_empty()).cloned().collect();
        config.tags = self.tags.iter().filter(|t| !t.is_empty()).cloned().collect();
        config.max_concurrency = self.max_concurrency;
        config.heartbeat_interval = Duration::from_millis(self.heartbeat_ms.max(50));
        config.llm = self.llm.agent_model()?.map(crate::agent_loop::AgentModel);
        config.http_allow = self.http_allow.iter().filter(|h| !h.is_empty()).cloned().collect();
        config.confirm_tools = self.confirm.iter().filter(|t| !t.is_empty()).cloned().collect();
        config.approval_timeout = Duration::from_secs(self.approval_timeout_secs.max(1));
        Ok(config)
    }
}

/// Connects, builds the agent and serves until SIGTERM/SIGINT, then drains.
pub async fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    let bus = hermes_core::Bus::connect(
        hermes_core::BusConfig::new(&args.nats_url).with_name(format!("hermes-agent-{}", args.agent_id)),
    )
    .await
    .context("failed to connect to NATS")?;
    let agent = Agent::build(bus, args.to_config()?).await.context("failed to start the agent")?;
    println!(
        "hermes agent {}: serving {}",
        args.agent_id,
        agent.tool_registry().names().collect::<Vec<_>>().join(",")
    );
    agent.run(shutdown).await.context("agent failed")
}
