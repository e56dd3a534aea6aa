//! Executor agents as a [`hermes_runtime::Service`]: the settings of `hermes-executor` and
//! `hermes agent` (one agent described by the `[agent]` keys, or every agent of an agents file,
//! see [`crate::config`]) and how they start.

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use hermes_llm::config::LlmSettings;
use hermes_runtime::{Context, NatsSettings};
use serde::{Deserialize, Serialize};

use crate::config::{AgentSpec, AgentsFile};
use crate::{Agent, AgentConfig};

/// The `[agent]` section: the one agent to run when there is no agents file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct AgentSettings {
    /// Unique among live agents: `[A-Za-z0-9_-]{1,64}`. Required without an agents file.
    pub id: Option<String>,
    /// Pool this agent belongs to.
    pub pool: String,
    /// Tools to serve; empty serves every built-in tool.
    pub tools: Vec<String>,
    /// Labels routing can prefer (e.g. gpu,eu-west).
    pub tags: Vec<String>,
    /// Tasks run at once.
    pub max_concurrency: u32,
    /// Dir that file tools may read.
    pub workspace: PathBuf,
    /// Heartbeat period in milliseconds; the registry's TTL must be at least three periods.
    pub heartbeat_ms: u64,
    /// Seconds a pulled task may go without an ack or progress before the server redelivers it.
    pub ack_wait_secs: u64,
    /// Hosts `http.fetch` may reach (`*.example.com` for subdomains).
    pub http_allow: Vec<String>,
    /// Tools whose calls wait for a human's approval (`hermes approve`).
    pub confirm: Vec<String>,
    /// Tools whose results are cached: `tool` (its declared TTL), `tool=SECS`, or `*` (every tool
    /// that declares a TTL). Docs: docs/agents.md, "Cached tool results".
    pub cache: Vec<String>,
    /// Seconds a call waits for approval before it counts as denied.
    pub approval_timeout_secs: u64,
    /// The agent's own instructions for its `agent.run` loop.
    pub system_prompt: Option<String>,
    /// Model turns per agent task.
    pub max_steps: u32,
    /// Tokens per agent task.
    pub max_tokens: u64,
    /// Wall-clock seconds per agent task.
    pub max_wall_secs: u64,
}

impl Default for AgentSettings {
    /// The defaults of [`AgentConfig::new`](crate::AgentConfig::new), written once there.
    fn default() -> Self {
        let d = crate::AgentConfig::new("", ".");
        AgentSettings {
            id: None,
            pool: d.pool,
            tools: d.tools,
            tags: d.tags,
            max_concurrency: d.max_concurrency,
            workspace: d.workspace,
            heartbeat_ms: d.heartbeat_interval.as_millis() as u64,
            ack_wait_secs: d.ack_wait.as_secs(),
            http_allow: d.http_allow,
            confirm: d.confirm_tools,
            cache: Vec::new(),
            approval_timeout_secs: d.approval_timeout.as_secs(),
            system_prompt: None,
            max_steps: d.loop_settings.max_steps,
            max_tokens: d.loop_settings.max_tokens,
            max_wall_secs: d.loop_settings.max_wall.as_secs(),
        }
    }
}

impl AgentSettings {
    /// The agent these settings describe.
    pub fn to_spec(&self) -> anyhow::Result<AgentSpec> {
        let agent_id = self
            .id
            .clone()
            .context("give --agent-id (HERMES_AGENT_ID) or an agents file with --agents-file")?;
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
            cache: Some(self.cache.clone()),
            approval_timeout_secs: Some(self.approval_timeout_secs),
            ..Default::default()
        })
    }
}

/// Settings of `hermes-executor` and `hermes agent`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ExecutorSettings {
    pub nats: NatsSettings,
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub drain_timeout_secs: u64,
    /// An agents file (TOML, see docs/agents.md): runs every agent it defines, and `[agent]` is
    /// ignored.
    pub agents_file: Option<PathBuf>,
    /// With an agents file, run only these agent ids of it.
    pub only: Vec<String>,
    pub agent: AgentSettings,
    /// The model for agent nodes; with one the agent also serves `agent.run`.
    pub llm: LlmSettings,
}

impl Default for ExecutorSettings {
    fn default() -> Self {
        ExecutorSettings {
            nats: NatsSettings::default(),
            metrics_listen: None,
            drain_timeout_secs: hermes_runtime::DEFAULT_DRAIN_TIMEOUT_SECS,
            agents_file: None,
            only: Vec::new(),
            agent: AgentSettings::default(),
            llm: LlmSettings::default(),
        }
    }
}

/// Earlier names of `[agent]` keys: the flags `--pool`, `--tools`, ... and the variables
/// `HERMES_AGENT_CONFIG`, `HERMES_HEARTBEAT_MS` and `HERMES_APPROVAL_TIMEOUT_SECS`.
pub const ALIASES: &[(&str, &str)] = &[
    ("agent_config", "agents_file"),
    ("heartbeat_ms", "agent.heartbeat_ms"),
    ("approval_timeout_secs", "agent.approval_timeout_secs"),
    ("pool", "agent.pool"),
    ("tools", "agent.tools"),
    ("tags", "agent.tags"),
    ("max_concurrency", "agent.max_concurrency"),
    ("workspace", "agent.workspace"),
    ("http_allow", "agent.http_allow"),
    ("confirm", "agent.confirm"),
    ("cache", "agent.cache"),
    ("system_prompt", "agent.system_prompt"),
    ("max_steps", "agent.max_steps"),
    ("max_tokens", "agent.max_tokens"),
    ("max_wall_secs", "agent.max_wall_secs"),
    ("ack_wait_secs", "agent.ack_wait_secs"),
];

/// Help for the executor's own keys.
pub fn describe(key: &str) -> Option<&'static str> {
    Some(match key {
        "agents_file" => "An agents file (TOML): run every agent it defines instead of [agent].",
        "only" => "With an agents file, run only these agent ids.",
        "agent.id" => "Unique among live agents; required without an agents file.",
        "agent.pool" => "Pool this agent belongs to.",
        "agent.tools" => "Tools to serve; empty serves every built-in tool.",
        "agent.tags" => "Labels routing can prefer.",
        "agent.max_concurrency" => "Tasks run at once.",
        "agent.workspace" => "Dir that file tools may read.",
        "agent.heartbeat_ms" => "Heartbeat period in milliseconds.",
        "agent.ack_wait_secs" => "Seconds a pulled task may go without an ack before redelivery.",
        "agent.http_allow" => "Hosts http.fetch may reach.",
        "agent.confirm" => "Tools whose calls wait for a human's approval.",
        "agent.cache" => {
            "Tools whose results are cached: tool (its declared TTL), tool=SECS, or * (every tool declaring one)."
        }
        "agent.approval_timeout_secs" => "Seconds a call waits for approval before it counts as denied.",
        "agent.system_prompt" => "The agent's own instructions for agent.run.",
        "agent.max_steps" => "Model turns per agent task.",
        "agent.max_tokens" => "Tokens per agent task.",
        "agent.max_wall_secs" => "Wall-clock seconds per agent task.",
        _ => return None,
    })
}

impl hermes_runtime::Settings for ExecutorSettings {
    fn aliases() -> Vec<(&'static str, &'static str)> {
        [ALIASES, hermes_llm::config::ALIASES].concat()
    }

    fn describe(key: &str) -> Option<&'static str> {
        describe(key)
            .or_else(|| hermes_llm::config::describe(key))
            .or_else(|| hermes_runtime::settings::describe(key))
    }
}

hermes_runtime::service_settings!(ExecutorSettings);

impl ExecutorSettings {
    /// Every agent to run: the agents file's (filtered by `only`), else the one of `[agent]`.
    pub fn agent_configs(&self) -> anyhow::Result<Vec<AgentConfig>> {
        let Some(path) = &self.agents_file else {
            let cwd = std::env::current_dir()?;
            return Ok(vec![self.agent.to_spec()?.to_config(&self.llm, &cwd)?]);
        };
        load_agents(path, &self.only, &self.llm)
    }
}

/// The agents of an agents file, relative paths taken from the file's dir; `only` (when not
/// empty) picks agents by id and must name existing ones.
pub fn load_agents(path: &Path, only: &[String], llm: &LlmSettings) -> anyhow::Result<Vec<AgentConfig>> {
    let file = AgentsFile::load(path)?;
    let base = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
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

/// `hermes-executor`: one or more agents in one process.
pub struct ExecutorService;

impl ExecutorService {
    /// Builds an agent on `cx` (connected) and spawns it as a task; returns the task types it
    /// serves. On its turn to drain it finishes its running tasks and hands back the rest.
    pub async fn start_agent(config: AgentConfig, cx: &mut Context) -> anyhow::Result<Vec<String>> {
        let bus = cx.bus().cloned().context("connect before starting agents")?;
        let id = config.agent_id.clone();
        let agent = Agent::build(bus, config).await.with_context(|| format!("failed to start agent {id}"))?;
        let types: Vec<String> = agent.tool_registry().names().map(str::to_owned).collect();
        println!("hermes agent {id}: serving {}", types.join(","));
        cx.spawn("agent", move |token| async move {
            agent.run(token).await.with_context(|| format!("agent {id} failed"))
        });
        Ok(types)
    }
}

impl hermes_runtime::Service for ExecutorService {
    const NAME: &'static str = "hermes-executor";
    const ABOUT: &'static str = "Hermes executor agent";
    const TELEMETRY_NAME: &'static str = "hermes-agent";
    type Settings = ExecutorSettings;

    async fn start(settings: ExecutorSettings, cx: &mut Context) -> anyhow::Result<()> {
        let configs = settings.agent_configs()?;
        let user = settings.nats.bus_config("").user();
        check_identity(user.as_deref(), &configs)?;
        // An agent's own identity is issued by the registry (the server's auth callout): until the
        // registry answers, the server refuses the connection, so a while of that is waited out.
        let identity = user.as_deref().is_some_and(hermes_core::broker::is_agent_identity);
        let deadline = std::time::Instant::now() + IDENTITY_WAIT;
        let bus = loop {
            match cx.connect(&settings.nats).await {
                Ok(bus) => break bus,
                Err(e) if identity && std::time::Instant::now() < deadline && refused(&e) => {
                    tracing::warn!(error = %format!("{e:#}"), "the NATS server refused this agent's identity; trying again (is the registry issuing identities, and is the token in its tokens file?)");
                    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                }
                Err(e) => return Err(e),
            }
        };
        settings.llm.govern(&bus).await?;
        for config in configs {
            Self::start_agent(config, cx).await?;
        }
        Ok(())
    }
}

/// Whether connecting failed because the server refused the credentials.
fn refused(e: &anyhow::Error) -> bool {
    e.chain().any(|c| matches!(c.downcast_ref(), Some(hermes_core::Error::Connect { refused: true, .. })))
}

/// How long an agent with its own identity waits for the server to admit it at start.
const IDENTITY_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// With an agent's own NATS identity (the user `agent_<id>`, docs/security.md), the process runs
/// that one agent: its permissions are that agent's only, and another id's work would be refused
/// by the server, operation by operation.
fn check_identity(user: Option<&str>, configs: &[AgentConfig]) -> anyhow::Result<()> {
    let Some(id) = user.and_then(|u| u.strip_prefix(hermes_core::broker::AGENT_IDENTITY_PREFIX)) else {
        return Ok(());
    };
    match configs {
        [one] if one.agent_id == id => Ok(()),
        [one] => anyhow::bail!(
            "the NATS user `agent_{id}` is agent `{id}`'s identity, but this agent's id is `{}`: run it with --agent-id {id}, or connect with that agent's own token",
            one.agent_id
        ),
        _ => anyhow::bail!(
            "the NATS user `agent_{id}` is one agent's identity: run only agent `{id}` in this process (each agent connects with its own token)"
        ),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn an_agents_identity_runs_only_that_agent() {
        let config = |id: &str| crate::AgentConfig::new(id.to_owned(), std::env::temp_dir());
        assert!(super::check_identity(None, &[config("a"), config("b")]).is_ok());
        assert!(super::check_identity(Some("agent"), &[config("a"), config("b")]).is_ok());
        assert!(super::check_identity(Some("agent_a"), &[config("a")]).is_ok());
        let other = super::check_identity(Some("agent_a"), &[config("b")]).unwrap_err().to_string();
        assert!(other.contains("--agent-id a"), "{other}");
        assert!(super::check_identity(Some("agent_a"), &[config("a"), config("b")]).is_err());
    }

    #[test]
    fn keys_do_not_clash() {
        hermes_runtime::config::check_keys::<super::ExecutorSettings>().unwrap();
    }
}
