//! Dispatcher settings shared by `hermes-dispatcher` and `hermes up`, as flags with `HERMES_*`
//! environment variables, each with its one default.

use std::time::Duration;

/// Timeouts and request limits of the dispatcher.
#[derive(clap::Args, Debug, Clone)]
pub struct LimitArgs {
    /// Whole-goal timeout for goals that do not set one, in seconds.
    #[arg(long, env = "HERMES_GOAL_TIMEOUT_SECS", default_value_t = 600)]
    pub goal_timeout_secs: u64,
    /// Per-attempt deadline for nodes that do not set one, in seconds.
    #[arg(long, env = "HERMES_NODE_TIMEOUT_SECS", default_value_t = 180)]
    pub node_timeout_secs: u64,
    /// Largest gRPC request accepted, in bytes; a larger one gets INVALID_ARGUMENT naming it.
    #[arg(long, env = "HERMES_GRPC_MAX_MESSAGE_BYTES", default_value_t = hermes_core::grpc::DEFAULT_MAX_MESSAGE_BYTES)]
    pub grpc_max_message_bytes: usize,
}

impl LimitArgs {
    pub fn goal_timeout(&self) -> Duration {
        Duration::from_secs(self.goal_timeout_secs.max(1))
    }

    pub fn node_timeout(&self) -> Duration {
        Duration::from_secs(self.node_timeout_secs.max(1))
    }

    /// Applies these settings to a dispatcher config.
    pub fn apply(&self, config: &mut crate::DispatcherConfig) {
        config.goal_timeout = self.goal_timeout();
        config.node_timeout = self.node_timeout();
        config.grpc_max_message_bytes = self.grpc_max_message_bytes;
    }
}
