//! The memory service as a [`hermes_runtime::Service`]: its settings and how it starts.

use hermes_llm::config::LlmSettings;
use hermes_llm::embed::EmbeddingSettings;
use hermes_runtime::{Context, GrpcSettings, NatsSettings};
use serde::{Deserialize, Serialize};

use crate::MemorySettings;

/// Settings of `hermes-memory`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct MemoryServiceSettings {
    pub nats: NatsSettings,
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub drain_timeout_secs: u64,
    pub grpc: GrpcSettings,
    /// The API tokens file (docs/security.md): each call needs an operator's token and is kept
    /// in its tenant; empty: no token is checked and a call names its tenant.
    pub api_tokens_file: String,
    pub memory: MemorySettings,
    pub embedding: EmbeddingSettings,
    /// The model that folds old session turns (the summarizer model).
    pub llm: LlmSettings,
}

impl Default for MemoryServiceSettings {
    fn default() -> Self {
        MemoryServiceSettings {
            nats: NatsSettings::default(),
            metrics_listen: None,
            drain_timeout_secs: hermes_runtime::DEFAULT_DRAIN_TIMEOUT_SECS,
            grpc: GrpcSettings::local(50053),
            api_tokens_file: String::new(),
            memory: MemorySettings::default(),
            embedding: EmbeddingSettings::default(),
            llm: LlmSettings::default(),
        }
    }
}

impl hermes_runtime::Settings for MemoryServiceSettings {
    fn aliases() -> Vec<(&'static str, &'static str)> {
        let mut aliases = vec![("memory_grpc_listen", "grpc.listen")];
        aliases.extend_from_slice(crate::ALIASES);
        aliases.extend_from_slice(hermes_llm::embed::ALIASES);
        aliases.extend_from_slice(hermes_llm::config::ALIASES);
        aliases
    }

    fn describe(key: &str) -> Option<&'static str> {
        if key == "api_tokens_file" {
            return Some(
                "API tokens (docs/security.md): calls need an operator's token, kept in its tenant; unset: none checked.",
            );
        }
        crate::describe(key)
            .or_else(|| hermes_llm::config::describe(key))
            .or_else(|| hermes_runtime::settings::describe(key))
    }
}

hermes_runtime::service_settings!(MemoryServiceSettings);

/// `hermes-memory`.
pub struct MemoryService;

impl MemoryService {
    /// Opens the memory service with `config` on `cx` (connected, gRPC bound) and spawns its
    /// request loop; its gRPC API goes on the context's server (`hermes up` composes it with the
    /// dispatcher's).
    pub async fn start_config(config: crate::MemoryConfig, cx: &mut Context) -> anyhow::Result<()> {
        let bus = cx.bus().cloned().ok_or_else(|| anyhow::anyhow!("connect before starting memory"))?;
        let token = tokio_util::sync::CancellationToken::new();
        let memory = crate::Memory::open(bus, config, token.clone())
            .await
            .map_err(|e| anyhow::anyhow!("failed to start the memory service: {e}"))?;
        let limit = cx.grpc_max_message_bytes();
        let grpc =
            crate::grpc::MemoryGrpc::new(memory.clone()).into_service().max_decoding_message_size(limit);
        cx.grpc("hermes.v1.Memory")?.add_service(grpc);
        cx.spawn("memory", move |stop| async move {
            let result = crate::run(memory, stop).await;
            token.cancel();
            result
        });
        Ok(())
    }
}

impl hermes_runtime::Service for MemoryService {
    const NAME: &'static str = "hermes-memory";
    const ABOUT: &'static str = "Hermes memory service";
    type Settings = MemoryServiceSettings;

    async fn start(settings: MemoryServiceSettings, cx: &mut Context) -> anyhow::Result<()> {
        let bus = cx.connect(&settings.nats).await?;
        settings.llm.govern(&bus).await?;
        let grpc = &settings.grpc;
        cx.grpc_listen(grpc.listen, grpc.max_message_bytes, hermes_runtime::GRPC_LIMIT_SETTING).await?;
        cx.grpc_tls(grpc.tls.load("grpc.tls")?)?;
        cx.grpc_api_tokens(&settings.api_tokens_file)?;
        let config = settings.memory.to_config(&settings.embedding, &settings.llm)?;
        Self::start_config(config, cx).await
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_do_not_clash() {
        hermes_runtime::config::check_keys::<super::MemoryServiceSettings>().unwrap();
    }
}
