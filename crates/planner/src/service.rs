//! The planner as a [`hermes_runtime::Service`]: its settings and how it starts.

use std::time::Duration;

use anyhow::Context as _;
use hermes_llm::config::LlmSettings;
use hermes_runtime::{Context, NatsSettings};
use serde::{Deserialize, Serialize};

use crate::PlannerConfig;

/// The `[planner]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlannerSettings {
    /// Seconds a plan request may go unacknowledged before another planner gets it.
    pub ack_wait_secs: u64,
    /// Times an invalid plan is sent back to the model before the goal fails.
    pub max_corrections: u32,
    /// Task types shown to the model when the catalogue is larger.
    pub top_k: usize,
    /// Plan requests worked on at once.
    pub concurrency: usize,
    /// Most nodes a plan may have.
    pub max_nodes: usize,
}

impl Default for PlannerSettings {
    fn default() -> Self {
        PlannerSettings {
            ack_wait_secs: 120,
            max_corrections: 2,
            top_k: 24,
            concurrency: 4,
            max_nodes: hermes_core::plan::DEFAULT_MAX_NODES,
        }
    }
}

impl PlannerSettings {
    /// The planner's config for `model`.
    pub fn config(&self, model: std::sync::Arc<dyn hermes_llm::ChatModel>) -> PlannerConfig {
        let mut config = PlannerConfig::new(model);
        config.ack_wait = Duration::from_secs(self.ack_wait_secs.max(1));
        config.max_corrections = self.max_corrections;
        config.top_k = self.top_k.max(1);
        config.concurrency = self.concurrency.max(1);
        config.max_nodes = self.max_nodes.max(1);
        config
    }
}

/// Settings of `hermes-planner`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PlannerServiceSettings {
    pub nats: NatsSettings,
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub drain_timeout_secs: u64,
    pub planner: PlannerSettings,
    pub llm: LlmSettings,
}

impl Default for PlannerServiceSettings {
    fn default() -> Self {
        PlannerServiceSettings {
            nats: NatsSettings::default(),
            metrics_listen: None,
            drain_timeout_secs: hermes_runtime::DEFAULT_DRAIN_TIMEOUT_SECS,
            planner: PlannerSettings::default(),
            llm: LlmSettings::default(),
        }
    }
}

impl hermes_runtime::Settings for PlannerServiceSettings {
    fn aliases() -> Vec<(&'static str, &'static str)> {
        [&[("ack_wait_secs", "planner.ack_wait_secs")], hermes_llm::config::ALIASES].concat()
    }

    fn describe(key: &str) -> Option<&'static str> {
        hermes_llm::config::describe(key).or_else(|| describe(key))
    }

    fn validate(&self) -> Result<(), hermes_runtime::ConfigError> {
        if self.llm.is_unset() || self.llm.provider.as_deref() == Some("none") {
            return Err(hermes_runtime::ConfigError::rule(
                "llm.base_url",
                "the planner needs a model: set llm.base_url and llm.model (HERMES_LLM_BASE_URL, HERMES_LLM_MODEL) or llm.provider = \"local\"",
            ));
        }
        Ok(())
    }
}

/// Help for the `[planner]` keys.
pub fn describe(key: &str) -> Option<&'static str> {
    Some(match key {
        "planner.ack_wait_secs" => {
            "Seconds a plan request may go unacknowledged before another planner gets it."
        }
        "planner.max_corrections" => "Times an invalid plan is sent back to the model before the goal fails.",
        "planner.top_k" => "Task types shown to the model when the catalogue is larger.",
        "planner.concurrency" => "Plan requests worked on at once.",
        "planner.max_nodes" => "Most nodes a plan may have.",
        key => return hermes_runtime::settings::describe(key),
    })
}

hermes_runtime::service_settings!(PlannerServiceSettings);

/// `hermes-planner`.
pub struct PlannerService;

impl PlannerService {
    /// Spawns a planner for `config` on `cx`, which must be connected.
    pub fn start_with(config: PlannerConfig, cx: &mut Context) -> anyhow::Result<()> {
        let bus = cx.bus().cloned().context("connect before starting the planner")?;
        cx.spawn("planner", move |token| crate::run(bus, config, token));
        Ok(())
    }
}

impl hermes_runtime::Service for PlannerService {
    const NAME: &'static str = "hermes-planner";
    const ABOUT: &'static str = "Hermes planner";
    type Settings = PlannerServiceSettings;

    async fn start(settings: PlannerServiceSettings, cx: &mut Context) -> anyhow::Result<()> {
        let model = settings
            .llm
            .planner_model()?
            .context("the planner needs a model: set HERMES_LLM_BASE_URL and HERMES_LLM_MODEL")?;
        let bus = cx.connect(&settings.nats).await?;
        settings.llm.govern(&bus).await?;
        Self::start_with(settings.planner.config(model), cx)?;
        println!("hermes planner: serving plan requests");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_do_not_clash() {
        hermes_runtime::config::check_keys::<super::PlannerServiceSettings>().unwrap();
    }
}
