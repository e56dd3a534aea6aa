//! `hermes up` as a [`hermes_runtime::Service`]: every service in one process (development
//! mode), composed on one context from the same start functions the service binaries use.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use hermes_dispatcher::service::DispatchSettings;
use hermes_llm::config::LlmSettings;
use hermes_llm::embed::EmbeddingSettings;
use hermes_memory::MemorySettings;
use hermes_runtime::{Context, GrpcSettings, NatsSettings};
use serde::{Deserialize, Serialize};

use crate::stack::{Stack, StackConfig};

/// The `[agents]` section: the agents `hermes up` runs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpAgents {
    /// Identical agents `local-1..n` with every built-in tool (ignored with `config`).
    pub count: u32,
    /// An agents file (TOML) describing the agents to run instead; see docs/agents.md.
    pub config: Option<PathBuf>,
    /// Tasks each agent runs at once.
    pub max_concurrency: u32,
    /// Dir that the agents' file tools may read and write; unset: `<data_dir>/workspace`, so a
    /// goal cannot touch the directory `hermes up` was started from unless it is named here.
    pub workspace: Option<PathBuf>,
    /// Tools whose calls wait for a person's approval (`hermes approvals`, the console); `none`
    /// for no tool. By default `fs.write`: the side effect the default agents have on (`code.python`
    /// is off and `http.fetch` reaches no host until allowed, docs/agents.md).
    pub confirm_tools: Vec<String>,
}

/// The tools `hermes up`'s default agents ask approval for.
pub const DEFAULT_CONFIRM_TOOLS: &[&str] = &["fs.write"];

impl Default for UpAgents {
    fn default() -> Self {
        UpAgents {
            count: 2,
            config: None,
            max_concurrency: 16,
            workspace: None,
            confirm_tools: DEFAULT_CONFIRM_TOOLS.iter().map(|t| t.to_string()).collect(),
        }
    }
}

impl UpAgents {
    /// The workspace of the default agents: the one set, or `workspace` in the data dir,
    /// created when missing.
    fn workspace(&self, data_dir: &std::path::Path) -> anyhow::Result<PathBuf> {
        let dir = match &self.workspace {
            Some(dir) => dir.clone(),
            None => {
                let dir = data_dir.join("workspace");
                std::fs::create_dir_all(&dir)
                    .with_context(|| format!("creating the workspace {}", dir.display()))?;
                dir
            }
        };
        dir.canonicalize().with_context(|| format!("workspace {} (agents.workspace)", dir.display()))
    }

    /// The tools that wait for approval: `confirm_tools` without `none`.
    fn confirm(&self) -> Vec<String> {
        self.confirm_tools
            .iter()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty() && t != "none")
            .collect()
    }
}

/// Settings of `hermes up`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct UpSettings {
    /// `nats.url` unset: a local nats-server is started; set and unreachable: `hermes up` fails.
    pub nats: NatsSettings,
    pub metrics_listen: Option<SocketAddr>,
    pub drain_timeout_secs: u64,
    pub grpc: GrpcSettings,
    /// Where the local nats-server keeps its store.
    pub data_dir: PathBuf,
    /// Encrypts the local nats-server's store with this secret (JetStream encryption at rest);
    /// it is passed to the server in its environment, never written to disk.
    pub store_secret: Option<String>,
    pub agents: UpAgents,
    /// Seconds without a heartbeat after which the registry drops an agent.
    pub heartbeat_ttl_secs: u64,
    /// Planners run as their own processes (`hermes planner`): accept goals given as text
    /// without running a planner here.
    pub external_planner: bool,
    /// Do not run the memory service in this process.
    pub no_memory: bool,
    pub dispatcher: DispatchSettings,
    pub planner: hermes_planner::service::PlannerSettings,
    pub memory: MemorySettings,
    pub embedding: EmbeddingSettings,
    /// The LLM for the planner, the agents and the summarizer. With none configured, the planner
    /// runs on the embedded model when it is installed ([`LlmSettings::embedded_default`]), and
    /// otherwise goals must come as plans.
    pub llm: LlmSettings,
}

impl Default for UpSettings {
    fn default() -> Self {
        UpSettings {
            nats: NatsSettings { url: Default::default(), ..Default::default() },
            metrics_listen: None,
            drain_timeout_secs: hermes_runtime::DEFAULT_DRAIN_TIMEOUT_SECS,
            grpc: GrpcSettings::local(50051),
            data_dir: ".hermes".into(),
            store_secret: None,
            agents: UpAgents::default(),
            heartbeat_ttl_secs: hermes_registry::RegistryConfig::default().heartbeat_ttl.as_secs(),
            external_planner: false,
            no_memory: false,
            dispatcher: DispatchSettings::default(),
            planner: Default::default(),
            memory: MemorySettings::default(),
            embedding: EmbeddingSettings::default(),
            llm: LlmSettings::default(),
        }
    }
}

impl hermes_runtime::Settings for UpSettings {
    fn aliases() -> Vec<(&'static str, &'static str)> {
        let own: &[(&str, &str)] = &[
            ("agents", "agents.count"),
            ("agent_max_concurrency", "agents.max_concurrency"),
            ("max_concurrency", "agents.max_concurrency"),
            ("agent_workspace", "agents.workspace"),
            ("workspace", "agents.workspace"),
        ];
        [
            own,
            hermes_dispatcher::service::ALIASES,
            hermes_memory::ALIASES,
            hermes_llm::embed::ALIASES,
            hermes_llm::config::ALIASES,
        ]
        .concat()
    }

    fn describe(key: &str) -> Option<&'static str> {
        let own = match key {
            "nats.url" => Some(
                "Use this NATS server; unset: a local nats-server is started (set and unreachable: hermes up fails).",
            ),
            "data_dir" => Some("Where the local nats-server keeps its store."),
            "store_secret" => Some(
                "Encrypt the local nats-server's store with this secret (16+ characters; never written to disk).",
            ),
            "agents.count" => Some("Identical agents local-1..n to run (ignored with agents.config)."),
            "agents.config" => Some("An agents file (TOML) describing the agents to run instead."),
            "agents.max_concurrency" => Some("Tasks each agent runs at once."),
            "agents.workspace" => {
                Some("Dir that the agents' file tools may read and write; unset: <data_dir>/workspace.")
            }
            "agents.confirm_tools" => {
                Some("Tools whose calls wait for approval (default fs.write; `none`: no tool).")
            }
            "heartbeat_ttl_secs" => {
                Some("Seconds without a heartbeat after which the registry drops an agent.")
            }
            "external_planner" => Some("Planners run as their own processes: run none here."),
            "no_memory" => Some("Do not run the memory service in this process."),
            _ => None,
        };
        own.or_else(|| hermes_dispatcher::service::describe(key))
            .or_else(|| hermes_planner::service::describe(key))
            .or_else(|| hermes_memory::describe(key))
            .or_else(|| hermes_llm::config::describe(key))
            .or_else(|| hermes_runtime::settings::describe(key))
    }
}

hermes_runtime::service_settings!(UpSettings);

/// `hermes up`.
pub struct UpService;

impl hermes_runtime::Service for UpService {
    const NAME: &'static str = "hermes-up";
    const ABOUT: &'static str = "Run every Hermes service in this process (development mode)";
    const TELEMETRY_NAME: &'static str = "hermes";
    type Settings = UpSettings;

    async fn start(settings: UpSettings, cx: &mut Context) -> anyhow::Result<()> {
        let llm = &settings.llm;
        // Nothing configured: the planner (only) runs on the embedded model when it is installed.
        // Agents and the summarizer stay without a model: a 0.5B model's prose is not worth the
        // wait, and `agent.run` on it would rarely finish.
        let embedded = (llm.is_unset() && !settings.external_planner).then(|| llm.embedded_default());
        let planner_llm = match &embedded {
            Some(Ok(local)) => local,
            _ => llm,
        };
        let planner = match settings.external_planner {
            true => None,
            false => planner_llm.planner_model()?.map(|model| settings.planner.config(model)),
        };
        let agent_model = llm.agent_model()?.map(hermes_executor::agent_loop::AgentModel);
        let memory = match settings.no_memory {
            true => None,
            false => Some(settings.memory.to_config(&settings.embedding, llm)?),
        };
        let mut nats = settings.nats.clone();
        let mut local_credentials = None;
        let mut users = None;
        // A URL the user gave (flag, HERMES_NATS_URL or the settings file) is the bus they meant:
        // when it is down, starting a second, local one instead would run their goals somewhere
        // no one else sees. Only an unset nats.url gets hermes up's own server.
        if !nats.url.is_empty() && !crate::nats::reachable(&nats.url).await {
            anyhow::bail!(
                "nats.url {} is not reachable (from --nats-url, HERMES_NATS_URL or the settings file): start that server or fix the URL, or leave nats.url unset and hermes up starts its own nats-server",
                nats.url
            );
        }
        if nats.url.is_empty() && nats.tls.enabled() {
            anyhow::bail!(
                "nats.tls is set, but hermes up's own nats-server listens on loopback without TLS: give the TLS server's URL (--nats-url), or leave nats.tls unset"
            );
        }
        if nats.url.is_empty() {
            let local =
                crate::nats::start_local(&settings.data_dir.join("nats"), settings.store_secret.as_deref())
                    .await?;
            // The services connect as their own users; the context's connection is the
            // dispatcher's, which makes the streams and buckets the others look up.
            nats.url = match &local.users {
                Some(local_users) => local_users.url("dispatcher")?,
                None => local.url.clone(),
            };
            users = local.users.clone();
            if users.is_none() {
                println!(
                    "hermes up: this store was made by an earlier release, so its services share one NATS user; start with a new --data-dir for a user per service and agents' own identities (docs/security.md)"
                );
            }
            local_credentials = Some(local.credentials.clone());
            // The first task, so the last drained: the server outlives every service.
            cx.spawn("nats-server", move |stop| async move {
                stop.cancelled().await;
                drop(local);
                Ok(())
            });
        }
        if local_credentials.is_none() && settings.store_secret.is_some() {
            anyhow::bail!(
                "store_secret encrypts the store of the nats-server hermes up starts; this one uses {}, whose encryption is its own configuration (docs/security.md)",
                nats.url
            );
        }
        let bus = cx.connect(&nats).await?;
        llm.govern(&bus).await?;
        let mut default_agents = None;
        let agents = match &settings.agents.config {
            Some(path) => hermes_executor::service::load_agents(path, &[], llm)?,
            None => {
                let workspace = settings.agents.workspace(&settings.data_dir)?;
                let confirm = settings.agents.confirm();
                let agents = (1..=settings.agents.count)
                    .map(|i| {
                        let mut config =
                            hermes_executor::AgentConfig::new(format!("local-{i}"), workspace.clone());
                        config.max_concurrency = settings.agents.max_concurrency;
                        config.confirm_tools = confirm.clone();
                        config.llm = agent_model.clone();
                        config
                    })
                    .collect();
                default_agents = Some((workspace, confirm));
                agents
            }
        };
        let mut dispatcher = settings.dispatcher.config(llm, &settings.grpc)?;
        dispatcher.planner |= settings.external_planner;
        let config = StackConfig {
            nats_url: nats.url.clone(),
            registry: hermes_registry::RegistryConfig {
                heartbeat_ttl: std::time::Duration::from_secs(settings.heartbeat_ttl_secs.max(1)),
                ..Default::default()
            },
            agents,
            dispatcher,
            planner,
            memory,
            users,
        };
        let parts = Stack::start_on(config, cx).await?;
        match &embedded {
            Some(Ok(local)) => println!(
                "hermes up: no model configured; text goals are planned by the embedded model {} \
                 (it first reads the tool catalogue, about two minutes on 2 cores, then about 20-30 s \
                 a plan). Set HERMES_LLM_BASE_URL and HERMES_LLM_MODEL for a real model, or \
                 HERMES_LLM_PROVIDER=none for none.",
                local.local_model.display()
            ),
            Some(Err(why)) => println!(
                "hermes up: no model configured and {why}: goals must come as plans \
                 (or set HERMES_LLM_BASE_URL and HERMES_LLM_MODEL)."
            ),
            None => {}
        }
        if let Some(path) = local_credentials {
            println!(
                "hermes up: the local nats-server refuses anonymous clients; its user `{}` has the password in {}",
                crate::nats::LOCAL_USER,
                path.display()
            );
        }
        let mut workspace_shown = String::new();
        if let Some((workspace, confirm)) = &default_agents {
            let approval = match confirm.is_empty() {
                true => "no tool waits for approval (agents.confirm_tools)".to_owned(),
                false => {
                    format!("{} wait for approval (hermes approvals, or the console)", confirm.join(", "))
                }
            };
            println!(
                "hermes up: the agents work in {}; {approval}; code.python is off and http.fetch reaches no host until allowed (docs/agents.md)",
                workspace.display()
            );
            workspace_shown = format!(" workspace {}", workspace.display());
        }
        // The ready line comes last: whoever waits for it may stop reading there.
        let nats_shown = nats.url;
        match parts.http_addr() {
            Some(http) => {
                println!(
                    "hermes up: grpc {} nats {nats_shown}{workspace_shown} http {http}",
                    parts.grpc_addr()
                )
            }
            None => println!("hermes up: grpc {} nats {nats_shown}{workspace_shown}", parts.grpc_addr()),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_do_not_clash() {
        hermes_runtime::config::check_keys::<super::UpSettings>().unwrap();
    }
}
