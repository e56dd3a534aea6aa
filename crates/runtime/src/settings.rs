//! Sections every service's settings share.

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// How a service reaches NATS (`[nats]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsSettings {
    /// The server URL; user and password may be given in it (`nats://user:password@host:4222`).
    pub url: hermes_core::secret::SecretUrl,
    /// Replicas of the streams and buckets Hermes creates: 1 for a single server, 3 on a
    /// three-node cluster.
    pub replicas: usize,
    /// A NATS credentials file (JWT and NKey seed).
    pub creds: Option<std::path::PathBuf>,
    /// The prefix of the connection's reply subjects; unset: `_INBOX_<user>` with a user in the
    /// URL, else `_INBOX`.
    pub inbox_prefix: Option<String>,
    /// TLS to the server (`[nats.tls]`: `ca_file`, `cert_file`, `key_file`); plaintext without.
    pub tls: hermes_core::bus::NatsTls,
    /// A file holding the password of the URL's user, read at every connect (an agent's
    /// Kubernetes service-account token).
    pub password_file: Option<std::path::PathBuf>,
}

impl Default for NatsSettings {
    fn default() -> Self {
        NatsSettings {
            url: "nats://127.0.0.1:4222".into(),
            replicas: 1,
            creds: None,
            inbox_prefix: None,
            tls: Default::default(),
            password_file: None,
        }
    }
}

impl NatsSettings {
    /// The bus config for a connection named `name`.
    pub fn bus_config(&self, name: &str) -> hermes_core::BusConfig {
        let mut config = hermes_core::BusConfig::new(&self.url).with_name(name);
        config.replicas = self.replicas;
        config.credentials_file = self.creds.clone();
        config.inbox_prefix = self.inbox_prefix.clone();
        config.tls = self.tls.clone();
        config.password_file = self.password_file.clone();
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

/// A service's gRPC server (`[grpc]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct GrpcSettings {
    /// The address it listens on.
    pub listen: std::net::SocketAddr,
    /// Largest request accepted, in bytes; a larger one gets INVALID_ARGUMENT naming it.
    pub max_message_bytes: usize,
    /// TLS (`[grpc.tls]`); off without a certificate.
    pub tls: hermes_core::tls::TlsSettings,
}

impl GrpcSettings {
    /// Listening on 127.0.0.1:`port` with the default limit.
    pub fn local(port: u16) -> Self {
        GrpcSettings {
            listen: ([127, 0, 0, 1], port).into(),
            max_message_bytes: hermes_core::grpc::DEFAULT_MAX_MESSAGE_BYTES,
            tls: Default::default(),
        }
    }
}

impl Default for GrpcSettings {
    fn default() -> Self {
        GrpcSettings::local(50051)
    }
}

/// Where the gRPC limit is set, for the over-limit error.
pub const GRPC_LIMIT_SETTING: &str = "grpc.max_message_bytes, HERMES_GRPC_MAX_MESSAGE_BYTES";

/// Help for the shared keys.
pub fn describe(key: &str) -> Option<&'static str> {
    Some(match key {
        "nats.url" => {
            "NATS server URL (user and password may be given in it); a cluster: its URLs, comma-separated."
        }
        "nats.replicas" => "Replicas of the streams and buckets Hermes creates (1, or 3 on a cluster).",
        "nats.creds" => "A NATS credentials file.",
        "nats.password_file" => {
            "A file holding the password of the URL's user (nats://agent_<id>@host), read at every connect: an agent's Kubernetes service-account token (docs/security.md)."
        }
        "nats.inbox_prefix" => {
            "Prefix of the connection's reply subjects; unset: _INBOX_<user> with a user in the URL."
        }
        "nats.tls.ca_file" => {
            "CAs (PEM) to trust for the NATS server's certificate; any nats.tls file makes TLS required."
        }
        "nats.tls.cert_file" => {
            "The client certificate (PEM) for a NATS server that verifies clients (mTLS)."
        }
        "nats.tls.key_file" => "The private key of nats.tls.cert_file (PEM).",
        "metrics_listen" => "Serve /metrics and /healthz on this address; unset: nowhere.",
        "drain_timeout_secs" => "Longest each shutdown step may take, in seconds.",
        "grpc.listen" => "Address the gRPC API listens on.",
        "grpc.max_message_bytes" => "Largest gRPC request accepted; a larger one gets INVALID_ARGUMENT.",
        "grpc.tls.cert_file" => "The gRPC server's TLS certificate chain (PEM); unset: plaintext.",
        "grpc.tls.key_file" => "The private key of grpc.tls.cert_file (PEM).",
        "grpc.tls.client_ca_file" => "CAs (PEM) whose client certificates the gRPC server requires (mTLS).",
        _ => return None,
    })
}
