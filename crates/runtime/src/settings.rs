//! Sections every service's settings share.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a service reaches NATS (`[nats]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsSettings {
    /// The server URL; user and password may be given in it (`nats://user:password@host:4222`).
    pub url: String,
    /// Replicas of the streams and buckets Hermes creates: 1 for a single server, 3 on a
    /// three-node cluster.
    pub replicas: usize,
    /// A NATS credentials file (JWT and NKey seed).
    pub creds: Option<std::path::PathBuf>,
}

impl Default for NatsSettings {
    fn default() -> Self {
        NatsSettings { url: "nats://127.0.0.1:4222".to_owned(), replicas: 1, creds: None }
    }
}

impl NatsSettings {
    /// The bus config for a connection named `name`.
    pub fn bus_config(&self, name: &str) -> hermes_core::BusConfig {
        let mut config = hermes_core::BusConfig::new(&self.url).with_name(name);
        config.replicas = self.replicas;
        config.credentials_file = self.creds.clone();
        config
    }
}

/// The shared top-level settings of a service, which the runner reads.
pub trait ServiceSettings: crate::Settings {
    /// How to reach NATS.
    fn nats(&self) -> &NatsSettings;
    /// Where to serve `/metrics` and `/healthz`; `None`: nowhere.
    fn metrics_listen(&self) -> Option<std::net::SocketAddr>;
    /// The longest each drain step may take on shutdown.
    fn drain_timeout(&self) -> Duration;
}

/// The default of every service's `drain_timeout_secs`.
pub const DEFAULT_DRAIN_TIMEOUT_SECS: u64 = 30;
