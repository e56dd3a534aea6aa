//! End to end: every service in-process (a [`hermes_tests::Sandbox`]) against a real
//! nats-server, through real gRPC, with `hermes agent` processes where a test kills one.
//!
//! One test binary, not one per file: each links the whole stack, and CI machines have two cores
//! and a bounded disk.

mod approval_restart;
mod approvals;
mod artifacts;
mod auth;
mod bad_input;
mod console;
mod cross_site;
mod deadlines;
mod dlq;
mod eval;
mod events;
#[cfg(feature = "local")]
mod gate;
mod goal_flow;
mod goal_index;
mod http;
mod ledger;
mod ledger_kill;
mod memory;
mod model_limits;
mod oidc;
mod plan_answers;
mod planning;
mod quotas;
mod reconnect;
mod redaction;
mod replay;
mod replicas;
mod routing;
#[cfg(feature = "local")]
mod tenancy;
mod webhooks;
