//! How every Hermes service starts, runs and stops.
//!
//! A binary's `main` is a call to [`main`] with its [`Service`]: the runner loads the settings
//! through one pipeline ([`config`]: defaults, a TOML file, `HERMES_` variables, flags,
//! validation), installs telemetry, serves metrics and `/healthz`, lets the service connect to
//! NATS and start its named tasks and gRPC services on a [`Context`], serves one gRPC server, and
//! on SIGTERM drains the tasks in reverse order, each under a timeout. `hermes up` composes the
//! same services on one context.

pub mod config;
pub mod service;
pub mod settings;

pub use config::{ConfigError, Settings};
pub use service::{Context, Invocation, Service, main, main_with_args, parse, run};
pub use settings::{
    DEFAULT_DRAIN_TIMEOUT_SECS, GRPC_LIMIT_SETTING, GrpcSettings, NatsSettings, ServiceSettings,
};

/// Implements [`ServiceSettings`] for a settings struct with the shared top-level fields `nats`,
/// `metrics_listen` and `drain_timeout_secs`.
#[macro_export]
macro_rules! service_settings {
    ($settings:ty) => {
        impl $crate::ServiceSettings for $settings {
            fn nats(&self) -> &$crate::NatsSettings {
                &self.nats
            }
            fn metrics_listen(&self) -> Option<std::net::SocketAddr> {
                self.metrics_listen
            }
            fn drain_timeout(&self) -> std::time::Duration {
                std::time::Duration::from_secs(self.drain_timeout_secs.max(1))
            }
        }
    };
}
