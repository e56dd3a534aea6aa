//! The registry as a [`hermes_runtime::Service`]: its settings and how it starts.

use std::time::Duration;

use hermes_runtime::{Context, GrpcSettings, NatsSettings};
use serde::{Deserialize, Serialize};

use crate::RegistryConfig;

/// Settings of `hermes-registry`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct RegistrySettings {
    pub nats: NatsSettings,
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub drain_timeout_secs: u64,
    pub grpc: GrpcSettings,
    /// The API tokens file (docs/security.md): each call needs a token; empty: none checked.
    pub api_tokens_file: String,
    /// Seconds without a heartbeat after which an agent is offline.
    pub heartbeat_ttl_secs: u64,
    /// Agents' NATS identities, issued as the NATS server's auth callout (`crate::identities`).
    pub identities: crate::identities::IdentitySettings,
}

impl Default for RegistrySettings {
    fn default() -> Self {
        RegistrySettings {
            nats: NatsSettings::default(),
            metrics_listen: None,
            drain_timeout_secs: hermes_runtime::DEFAULT_DRAIN_TIMEOUT_SECS,
            grpc: GrpcSettings::local(50052),
            api_tokens_file: String::new(),
            heartbeat_ttl_secs: RegistryConfig::default().heartbeat_ttl.as_secs(),
            identities: Default::default(),
        }
    }
}

impl RegistrySettings {
    pub fn config(&self) -> RegistryConfig {
        RegistryConfig {
            heartbeat_ttl: Duration::from_secs(self.heartbeat_ttl_secs.max(1)),
            ..Default::default()
        }
    }
}

impl hermes_runtime::Settings for RegistrySettings {
    fn aliases() -> Vec<(&'static str, &'static str)> {
        vec![("registry_grpc_listen", "grpc.listen")]
    }

    fn describe(key: &str) -> Option<&'static str> {
        match key {
            "heartbeat_ttl_secs" => Some("Seconds without a heartbeat after which an agent is offline."),
            "api_tokens_file" => Some(
                "API tokens (docs/security.md): calls need a token; unset: none checked. Its [[agent]] entries are the agents the identities callout admits.",
            ),
            "identities.issuer_seed" => Some(
                "Account seed (SA...) whose key the NATS server's auth_callout.issuer names: the registry issues each agent a NATS identity of its own (docs/security.md); unset: none.",
            ),
            "identities.account" => Some("The NATS account agents are placed in."),
            "identities.ttl_secs" => {
                Some("Seconds an issued agent identity lasts before the agent is checked again.")
            }
            "identities.kubernetes.issuer" => Some(
                "The cluster's service-account token issuer: pods of the service accounts below connect as agent_<pod name> with their projected token (docs/security.md); unset: none.",
            ),
            "identities.kubernetes.audience" => Some("The audience the pods' projected tokens are made for."),
            "identities.kubernetes.jwks_url" => Some(
                "Where the cluster's keys are (https://kubernetes.default.svc/openid/v1/jwks); unset: discovery.",
            ),
            "identities.kubernetes.ca_file" => {
                Some("CA certificates (PEM) trusted for fetching the cluster's keys.")
            }
            "identities.kubernetes.token_file" => {
                Some("A bearer token file sent when fetching the cluster's keys.")
            }
            "identities.kubernetes.service_accounts" => {
                Some("namespace/name of each service account whose pods are admitted as agents.")
            }
            key => hermes_runtime::settings::describe(key),
        }
    }
}

hermes_runtime::service_settings!(RegistrySettings);

/// `hermes-registry`.
pub struct RegistryService;

impl hermes_runtime::Service for RegistryService {
    const NAME: &'static str = "hermes-registry";
    const ABOUT: &'static str = "Hermes agent registry";
    type Settings = RegistrySettings;

    async fn start(settings: RegistrySettings, cx: &mut Context) -> anyhow::Result<()> {
        let bus = cx.connect(&settings.nats).await?;
        let limit = settings.grpc.max_message_bytes;
        cx.grpc_listen(settings.grpc.listen, limit, hermes_runtime::GRPC_LIMIT_SETTING).await?;
        cx.grpc_tls(settings.grpc.tls.load("grpc.tls")?)?;
        let tokens = cx.grpc_api_tokens(&settings.api_tokens_file)?;
        let registry = crate::start(settings.config(), cx)?;
        if let Some(identities) =
            crate::identities::Identities::new(&settings.identities, tokens, bus.topology().clone())?
        {
            let (b, identities) = (bus.clone(), identities.with_registry(registry.clone()));
            cx.spawn("identities", move |token| crate::identities::serve(b, identities, token));
        }
        cx.spawn("registry", move |token| crate::run(bus, registry, token));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn keys_do_not_clash() {
        hermes_runtime::config::check_keys::<super::RegistrySettings>().unwrap();
    }
}
