//! The agent config file: one TOML file describes one or more agents, which `hermes up
//! --agents-config` and `hermes-executor --agents-file` run in one process (each pod of a pool can
//! run the same file). A `[defaults]` table applies to every `[[agent]]` entry that does not set
//! the field itself. `${NAME}` and `${NAME:-fallback}` in the file are replaced by environment
//! variables before parsing, so ids can carry the pod name and secrets stay out of the file.
//!
//! ```toml
//! [defaults]
//! workspace = "./data"
//! max_concurrency = 8
//!
//! [[agent]]
//! id = "analyst-${HOSTNAME:-1}"
//! pool = "analysts"
//! tools = ["fs.read", "table.aggregate", "math.evaluate", "agent.run"]
//! system_prompt = "You are a careful data analyst. Quote the numbers you used."
//! max_steps = 6
//!
//! [[agent.mcp]]
//! name = "notes"
//! command = "python3"
//! args = ["notes_server.py"]
//! ```

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::agent_loop::{AgentModel, LoopSettings};
use crate::tools::python::CodePythonConfig;
use crate::{AgentConfig, Error};

/// The whole file.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentsFile {
    /// Values every agent takes unless it sets its own.
    #[serde(default)]
    pub defaults: AgentSpec,
    #[serde(default, rename = "agent")]
    pub agents: Vec<AgentSpec>,
}

/// One agent as the file (or the command-line flags) describe it; unset fields take defaults.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentSpec {
    /// Unique among live agents: `[A-Za-z0-9_-]{1,64}`.
    pub id: Option<String>,
    /// Pool the agent belongs to (default `default`).
    pub pool: Option<String>,
    /// Tools (task types) served; unset or empty serves every built-in tool except
    /// `code.python`, plus `agent.run` and `text.summarize` when a model is configured.
    pub tools: Option<Vec<String>>,
    /// Labels routing can prefer.
    pub tags: Option<Vec<String>>,
    /// Model name for this agent's LLM steps on the configured provider (default: the agent
    /// model of the process, `HERMES_AGENT_MODEL` or `HERMES_LLM_MODEL`).
    pub model: Option<String>,
    /// Tasks run at once (default 16).
    pub max_concurrency: Option<u32>,
    /// The agent's own instructions for its `agent.run` loop.
    pub system_prompt: Option<String>,
    /// Model turns per agent task (default 8).
    pub max_steps: Option<u32>,
    /// Tokens per agent task (default 50000).
    pub max_tokens: Option<u64>,
    /// Wall-clock seconds per agent task (default 180).
    pub max_wall_secs: Option<u64>,
    /// `agent.run`'s context management (on by default): off, every turn carries the whole
    /// transcript verbatim.
    pub manage_context: Option<bool>,
    /// The dir file tools are confined to (default `.`).
    pub workspace: Option<PathBuf>,
    /// Heartbeat period in milliseconds (default 10000).
    pub heartbeat_ms: Option<u64>,
    /// Seconds before an unacked task is redelivered (default 30); progress acks extend it.
    pub ack_wait_secs: Option<u64>,
    /// Hosts `http.fetch` may reach; empty denies all.
    pub http_allow: Option<Vec<String>>,
    /// Tools whose calls wait for a human's approval.
    pub confirm: Option<Vec<String>>,
    /// Tools whose results are cached: `tool`, `tool=SECS` or `*` (docs/agents.md).
    pub cache: Option<Vec<String>>,
    /// Seconds a call waits for approval before it counts as denied (default 600).
    pub approval_timeout_secs: Option<u64>,
    /// Enables `code.python` with these limits.
    pub code_python: Option<CodePythonSpec>,
    /// MCP servers whose tools this agent mounts.
    pub mcp: Option<Vec<McpServerSpec>>,
}

/// The `cache` entries as tool to TTL in seconds (0: the tool's declared TTL).
pub fn cache_ttls(entries: &[String]) -> Result<std::collections::BTreeMap<String, u64>, String> {
    entries
        .iter()
        .map(|entry| match entry.split_once('=') {
            None => Ok((entry.clone(), 0)),
            Some((tool, secs)) => match secs.trim().parse::<u64>() {
                Ok(secs) if secs > 0 => Ok((tool.trim().to_owned(), secs)),
                _ => Err(format!("`{entry}`: the TTL must be a whole number of seconds above 0")),
            },
        })
        .collect()
}

/// `code.python` settings. The section's presence enables the tool unless `enabled = false`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CodePythonSpec {
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Calls wait for a human's approval (default true).
    #[serde(default = "yes")]
    pub confirm: bool,
    /// Wall-clock seconds per snippet (default 10).
    pub timeout_secs: Option<u64>,
    /// Address-space limit in MiB, per process (default 512).
    pub memory_mb: Option<u64>,
    /// Processes or threads a snippet may start besides itself (default 0: it cannot fork).
    pub max_processes: Option<u32>,
    /// The interpreter: a path, or a name looked up in `/usr/bin` first, then `PATH` (default
    /// `python3`).
    pub python: Option<String>,
    /// bubblewrap: a path, or a name looked up in `PATH`, then `/usr/bin` (default `bwrap`).
    pub bwrap: Option<String>,
}

fn yes() -> bool {
    true
}

/// An MCP server started over stdio. Its tools are mounted as `<name>.<tool>` (the tool name
/// lower-cased, other characters than `[a-z0-9-]` turned into `-`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct McpServerSpec {
    /// The tools' domain prefix: `[a-z0-9-]`.
    pub name: String,
    pub command: String,
    #[serde(default)]
    pub args: Vec<String>,
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Only these of the server's tools (by their MCP names); unset mounts all.
    pub tools: Option<Vec<String>>,
    /// Seconds per call (default 10).
    pub timeout_secs: Option<u64>,
    /// Whether calls may change the world, so they go through the side-effect ledger (default
    /// true: Hermes cannot know what a foreign tool does).
    #[serde(default = "yes")]
    pub side_effects: bool,
}

impl AgentsFile {
    /// Reads, expands `${VAR}` references and parses the file.
    pub fn load(path: &Path) -> Result<AgentsFile, Error> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| Error::Config(format!("cannot read {}: {e}", path.display())))?;
        Self::parse(&text).map_err(|e| match e {
            Error::Config(why) => Error::Config(format!("{}: {why}", path.display())),
            other => other,
        })
    }

    pub fn parse(text: &str) -> Result<AgentsFile, Error> {
        let expanded = expand_env(text, |name| std::env::var(name).ok())?;
        let file: AgentsFile = toml::from_str(&expanded).map_err(|e| Error::Config(e.to_string()))?;
        if file.agents.is_empty() {
            return Err(Error::Config("the file defines no [[agent]]".into()));
        }
        Ok(file)
    }

    /// Every agent with the defaults applied.
    pub fn resolved(&self) -> Vec<AgentSpec> {
        self.agents.iter().map(|agent| agent.clone().or(&self.defaults)).collect()
    }
}

impl AgentSpec {
    /// Fills every field this spec leaves unset from `defaults`.
    pub fn or(self, defaults: &AgentSpec) -> AgentSpec {
        let d = defaults.clone();
        AgentSpec {
            id: self.id.or(d.id),
            pool: self.pool.or(d.pool),
            tools: self.tools.or(d.tools),
            tags: self.tags.or(d.tags),
            model: self.model.or(d.model),
            max_concurrency: self.max_concurrency.or(d.max_concurrency),
            system_prompt: self.system_prompt.or(d.system_prompt),
            max_steps: self.max_steps.or(d.max_steps),
            max_tokens: self.max_tokens.or(d.max_tokens),
            max_wall_secs: self.max_wall_secs.or(d.max_wall_secs),
            manage_context: self.manage_context.or(d.manage_context),
            workspace: self.workspace.or(d.workspace),
            heartbeat_ms: self.heartbeat_ms.or(d.heartbeat_ms),
            ack_wait_secs: self.ack_wait_secs.or(d.ack_wait_secs),
            http_allow: self.http_allow.or(d.http_allow),
            confirm: self.confirm.or(d.confirm),
            cache: self.cache.or(d.cache),
            approval_timeout_secs: self.approval_timeout_secs.or(d.approval_timeout_secs),
            code_python: self.code_python.or(d.code_python),
            mcp: self.mcp.or(d.mcp),
        }
    }

    /// The runnable config. `llm` supplies the provider; `base_dir` anchors a relative workspace
    /// (the config file's dir, so a file works from any working directory).
    pub fn to_config(
        &self,
        llm: &hermes_llm::config::LlmSettings,
        base_dir: &Path,
    ) -> Result<AgentConfig, Error> {
        let id = self.id.clone().ok_or_else(|| Error::Config("an agent has no `id`".into()))?;
        let workspace = match &self.workspace {
            Some(dir) if dir.is_absolute() => dir.clone(),
            Some(dir) => base_dir.join(dir),
            None => base_dir.to_path_buf(),
        };
        let workspace = workspace
            .canonicalize()
            .map_err(|e| Error::Config(format!("agent {id}: workspace {}: {e}", workspace.display())))?;
        let mut config = AgentConfig::new(id.clone(), workspace);
        let non_empty = |v: &Option<Vec<String>>| -> Vec<String> {
            v.iter().flatten().filter(|s| !s.trim().is_empty()).map(|s| s.trim().to_owned()).collect()
        };
        config.pool = self.pool.clone().unwrap_or_else(|| "default".into());
        config.tools = non_empty(&self.tools);
        config.tags = non_empty(&self.tags);
        config.http_allow = non_empty(&self.http_allow);
        config.confirm_tools = non_empty(&self.confirm);
        config.cache_tools = cache_ttls(&non_empty(&self.cache))
            .map_err(|e| Error::Config(format!("agent {id}: cache: {e}")))?;
        if let Some(n) = self.max_concurrency {
            config.max_concurrency = n;
        }
        if let Some(ms) = self.heartbeat_ms {
            config.heartbeat_interval = Duration::from_millis(ms.max(50));
        }
        if let Some(secs) = self.ack_wait_secs {
            config.ack_wait = Duration::from_secs(secs.max(1));
        }
        if let Some(secs) = self.approval_timeout_secs {
            config.approval_timeout = Duration::from_secs(secs.max(1));
        }
        let model = llm
            .agent_model_named(self.model.as_deref())
            .map_err(|e| Error::Config(format!("agent {id}: {e}")))?;
        config.model = model.as_ref().map(|m| m.model().to_owned()).unwrap_or_default();
        config.llm = model.map(AgentModel);
        let defaults = LoopSettings::default();
        config.loop_settings = LoopSettings {
            system_prompt: self.system_prompt.clone().filter(|p| !p.trim().is_empty()),
            max_steps: self.max_steps.unwrap_or(defaults.max_steps).max(1),
            max_tokens: self.max_tokens.unwrap_or(defaults.max_tokens).max(1),
            max_wall: self.max_wall_secs.map(|s| Duration::from_secs(s.max(1))).unwrap_or(defaults.max_wall),
            manage_context: self.manage_context.unwrap_or(defaults.manage_context),
        };
        config.code_python = self.code_python.as_ref().filter(|c| c.enabled).map(|c| {
            let defaults = CodePythonConfig::default();
            CodePythonConfig {
                confirm: c.confirm,
                timeout: c.timeout_secs.map(|s| Duration::from_secs(s.max(1))).unwrap_or(defaults.timeout),
                memory_mb: c.memory_mb.unwrap_or(defaults.memory_mb).max(16),
                max_processes: c.max_processes.unwrap_or(defaults.max_processes),
                python: c.python.clone().unwrap_or(defaults.python),
                bwrap: c.bwrap.clone().unwrap_or(defaults.bwrap),
            }
        });
        config.mcp = self.mcp.clone().unwrap_or_default();
        Ok(config)
    }
}

/// Replaces `${NAME}` and `${NAME:-fallback}`; an unset variable without a fallback is an error
/// naming it, so a typo does not silently become an empty id.
pub fn expand_env(text: &str, lookup: impl Fn(&str) -> Option<String>) -> Result<String, Error> {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let after = &rest[start + 2..];
        let end = after.find('}').ok_or_else(|| Error::Config("an unclosed `${` in the file".to_owned()))?;
        let expr = &after[..end];
        let (name, fallback) = match expr.split_once(":-") {
            Some((name, fallback)) => (name, Some(fallback)),
            None => (expr, None),
        };
        match (lookup(name).filter(|v| !v.is_empty()), fallback) {
            (Some(value), _) => out.push_str(&value),
            (None, Some(fallback)) => out.push_str(fallback),
            (None, None) => return Err(Error::Config(format!("environment variable `{name}` is not set"))),
        }
        rest = &after[end + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_references_expand_with_fallbacks_and_unset_ones_are_named() {
        let lookup = |name: &str| (name == "POD").then(|| "pod-7".to_owned());
        assert_eq!(expand_env("id = \"a-${POD}\"", lookup).unwrap(), "id = \"a-pod-7\"");
        assert_eq!(expand_env("${NOPE:-x}${POD:-y}", lookup).unwrap(), "xpod-7");
        assert!(expand_env("${NOPE}", lookup).unwrap_err().to_string().contains("`NOPE`"));
        assert!(expand_env("${POD", lookup).is_err());
    }

    #[test]
    fn defaults_fill_unset_fields_and_unknown_fields_are_rejected() {
        let file = AgentsFile::parse(
            r#"
            [defaults]
            max_concurrency = 4
            pool = "analysts"
            [[agent]]
            id = "a"
            [[agent]]
            id = "b"
            pool = "writers"
            system_prompt = "Write well."
            [agent.code_python]
            timeout_secs = 3
            "#,
        )
        .unwrap();
        let agents = file.resolved();
        assert_eq!(agents[0].pool.as_deref(), Some("analysts"));
        assert_eq!(agents[0].max_concurrency, Some(4));
        assert_eq!(agents[1].pool.as_deref(), Some("writers"));
        assert!(agents[1].code_python.as_ref().is_some_and(|c| c.enabled && c.confirm));
        let err = AgentsFile::parse("[[agent]]\nid = \"a\"\nmax_concurency = 3\n").unwrap_err();
        assert!(err.to_string().contains("max_concurency"), "{err}");
        assert!(
            AgentsFile::parse("[defaults]\npool = \"x\"\n").unwrap_err().to_string().contains("no [[agent]]")
        );
    }

    #[test]
    fn a_spec_becomes_a_config_with_its_prompt_budgets_and_workspace() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        let spec = AgentSpec {
            id: Some("a1".into()),
            workspace: Some("data".into()),
            system_prompt: Some("Be brief.".into()),
            max_steps: Some(3),
            confirm: Some(vec!["fs.write".into(), " ".into()]),
            ..Default::default()
        };
        let config = spec.to_config(&Default::default(), dir.path()).unwrap();
        assert_eq!(config.workspace, dir.path().join("data").canonicalize().unwrap());
        assert_eq!(config.loop_settings.system_prompt.as_deref(), Some("Be brief."));
        assert_eq!(config.loop_settings.max_steps, 3);
        assert_eq!(config.confirm_tools, vec!["fs.write".to_owned()]);
        assert!(config.code_python.is_none() && config.llm.is_none());
        let missing =
            AgentSpec { id: Some("a2".into()), workspace: Some("nope".into()), ..Default::default() };
        assert!(missing.to_config(&Default::default(), dir.path()).is_err());
    }
}
