//! End to end: every service in-process against a real nats-server, through real gRPC.
//!
//! One test binary, not one per file: each links the whole stack, and CI machines have two cores
//! and a bounded disk.

mod approvals;
mod artifacts;
mod bad_input;
mod deadlines;
mod dlq;
mod events;
mod goal_flow;
mod ledger;
mod memory;
mod planning;
mod reconnect;
