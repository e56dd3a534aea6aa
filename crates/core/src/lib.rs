//! Foundations shared by every Hermes service: the JetStream bus and its topology, identifiers,
//! the error model, plan validation, trace-context propagation, telemetry set-up and shutdown.

pub mod access;
pub mod agents;
pub mod approvals;
pub mod artifacts;
pub mod broker;
pub mod bus;
pub mod egress;
pub mod error;
pub mod events;
pub mod grpc;
pub mod ids;
pub mod jcs;
pub mod json_ref;
pub mod kv;
pub mod lanes;
pub mod ledger;
pub mod metrics;
pub mod nats_jwt;
pub mod oidc;
pub mod plan;
pub mod plan_file;
pub mod redact;
pub mod reload;
pub mod schema;
pub mod secret;
pub mod shutdown;
pub mod task_kv;
pub mod task_token;
pub mod telemetry;
pub mod text;
pub mod tls;
pub mod tool_cache;
pub mod topology;
pub mod trace;

pub use bus::{Bus, BusConfig, Delivery, PublishOutcome};
pub use error::{Error, ErrorCode, Result};
pub use ids::{AgentId, GoalId, NodeId, TaskId};
pub use topology::Topology;

/// Milliseconds since the Unix epoch, the unit every timestamp on the wire uses.
pub fn now_unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
