//! Command-line flags for running agents as their own process, shared by the `hermes-executor`
//! binary and `hermes agent`: either one agent described by flags (each with an environment
//! variable), or every agent of a config file (`--config`, see [`crate::config`]).

use std::path::PathBuf;

use anyhow::Context;

use crate::config::{AgentSpec, AgentsFile};
use crate::{Agent, AgentConfig};

/// Flags (each with an environment variable) for one agent.
#[derive(clap::Args, Debug, Clone)]
pub struct AgentArgs {
    /// NATS server URL.
    #[arg(long, env = "HERMES_NATS_URL", default_value = "nats://127.0.0.1:4222")]
    pub nats_url: String,
    /// An agent config file (TOML); runs every agent it defines, and the agent flags below are
    /// ignored. The NATS and LLM flags still apply.
    #[arg(long, env = "HERMES_AGENT_CONFIG")]
    pub config: Option<PathBuf>,
    /// With --config, run only these agent ids of the file (comma-separated).
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// Unique among live agents: [A-Za-z0-9_-]{1,64}. Required without --config.
    #[arg(long, env = "HERMES_AGENT_ID")]
    pub agent_id: Option<String>,
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
    /// Seconds a pulled task may go without an ack or progress before the server redelivers it
    /// (applied when this agent creates a consumer; progress acks keep live tasks alive).
    #[arg(long, env = "HERMES_AGENT_ACK_WAIT_SECS", default_value_t = 30)]
    pub ack_wait_secs: u64,
    /// Comma-separated hosts `http.fetch` may reach (`*.example.com` for subdomains).
    #[arg(long, env = "HERMES_AGENT_HTTP_ALLOW", value_delimiter = ',', default_value = "")]
    pub http_allow: Vec<String>,
    /// Comma-separated tools whose calls wait for a human's approval (`hermes approve`).
    #[arg(long, env = "HERMES_AGENT_CONFIRM", value_delimiter = ',', default_value = "")]
    pub confirm: Vec<String>,
    /// Seconds a call waits for approval before it counts as denied.
    #[arg(long, env = "HERMES_APPROVAL_TIMEOUT_SECS", default_value_t = 600)]
    pub approval_timeout_secs: u64,
    /// The agent's own instructions for its `agent.run` loop.
    #[arg(long, env = "HERMES_AGENT_SYSTEM_PROMPT")]
    pub system_prompt: Option<String>,
    /// Model turns per agent task.
    #[arg(long, env = "HERMES_AGENT_MAX_STEPS", default_value_t = crate::agent_loop::DEFAULT_MAX_STEPS)]
    pub max_steps: u32,
    /// Tokens per agent task.
    #[arg(long, env = "HERMES_AGENT_MAX_TOKENS", default_value_t = crate::agent_loop::DEFAULT_MAX_TOKENS)]
    pub max_tokens: u64,
    /// Wall-clock seconds per agent task.
    #[arg(long, env = "HERMES_AGENT_MAX_WALL_SECS", default_value_t = 180)]
    pub max_wall_secs: u64,
    /// Serve Prometheus metrics on this address (`/metrics`); unset: no endpoint.
    #[arg(long, env = "HERMES_METRICS_LISTEN")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// The model for agent nodes; with one the agent also serves `agent.run`.
    #[command(flatten)]
    pub llm: hermes_llm::config::LlmArgs,
}

impl AgentArgs {
    /// The agent the flags describe.
    pub fn to_spec(&self) -> anyhow::Result<AgentSpec> {
        let agent_id = self
            .agent_id
            .clone()
            .context("give --agent-id (HERMES_AGENT_ID) or an agent config file with --config")?;
        Ok(AgentSpec {
            id: Some(agent_id),
            pool: Some(self.pool.clone()),
            tools: Some(self.tools.clone()),
            tags: Some(self.tags.clone()),
            max_concurrency: Some(self.max_concurrency),
            system_prompt: self.system_prompt.clone(),
            max_steps: Some(self.max_steps),
            max_tokens: Some(self.max_tokens),
            max_wall_secs: Some(self.max_wall_secs),
            workspace: Some(self.workspace.clone()),
            heartbeat_ms: Some(self.heartbeat_ms),
            ack_wait_secs: Some(self.ack_wait_secs),
            http_allow: Some(self.http_allow.clone()),
            confirm: Some(self.confirm.clone()),
            approval_timeout_secs: Some(self.approval_timeout_secs),
            ..Default::default()
        })
    }

    /// Every agent to run: the config file's (filtered by --only), else the one of the flags.
    pub fn to_configs(&self) -> anyhow::Result<Vec<AgentConfig>> {
        let Some(path) = &self.config else {
            let cwd = std::env::current_dir()?;
            return Ok(vec![self.to_spec()?.to_config(&self.llm, &cwd)?]);
        };
        load_agents(path, &self.only, &self.llm)
    }
}

/// The agents of a config file, relative paths taken from the file's dir; `only` (when not
/// empty) picks agents by id and must name existing ones.
pub fn load_agents(
    path: &std::path::Path,
    only: &[String],
    llm: &hermes_llm::config::LlmArgs,
) -> anyhow::Result<Vec<AgentConfig>> {
    let file = AgentsFile::load(path)?;
    let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(std::path::Path::new("."));
    let specs = file.resolved();
    if let Some(missing) = only.iter().find(|id| !specs.iter().any(|s| s.id.as_ref() == Some(*id))) {
        anyhow::bail!("{}: no agent with id `{missing}`", path.display());
    }
    let mut configs = Vec::new();
    for spec in specs {
        if only.is_empty() || spec.id.as_ref().is_some_and(|id| only.contains(id)) {
            configs.push(spec.to_config(llm, base)?);
        }
    }
    let mut ids: Vec<&str> = configs.iter().map(|c| c.agent_id.as_str()).collect();
    ids.sort_unstable();
    if let Some(dup) = ids.windows(2).find(|w| w[0] == w[1]) {
        anyhow::bail!("{}: agent id `{}` appears twice", path.display(), dup[0]);
    }
    Ok(configs)
}

/// Connects, builds every agent and serves until SIGTERM/SIGINT, then drains them all.
pub async fn run_agent(args: AgentArgs) -> anyhow::Result<()> {
    let shutdown = hermes_core::shutdown::install_signal_handlers();
    let configs = args.to_configs()?;
    let name = match configs.as_slice() {
        [one] => format!("hermes-agent-{}", one.agent_id),
        _ => "hermes-agents".to_owned(),
    };
    let bus = hermes_core::Bus::connect(hermes_core::BusConfig::new(&args.nats_url).with_name(name))
        .await
        .context("failed to connect to NATS")?;
    hermes_core::metrics::serve_if(args.metrics_listen, shutdown.clone()).await?;
    let mut running = tokio::task::JoinSet::new();
    for config in configs {
        let id = config.agent_id.clone();
        let agent =
            Agent::build(bus.clone(), config).await.with_context(|| format!("failed to start agent {id}"))?;
        println!(
            "hermes agent {id}: serving {}",
            agent.tool_registry().names().collect::<Vec<_>>().join(",")
        );
        let token = shutdown.clone();
        running.spawn(async move { agent.run(token).await.with_context(|| format!("agent {id} failed")) });
    }
    let mut result = Ok(());
    while let Some(done) = running.join_next().await {
        if let Ok(Err(e)) = done {
            result = Err(e);
        }
    }
    result
}
