//! Wiring shared by the `hermes` command and the end-to-end tests: the all-in-one [`stack`], the
//! local nats-server launcher, and the plan file format.

pub mod api_client;
pub mod memory_cmd;
pub mod nats;
pub mod plan_file;
pub mod stack;
pub mod trace_cmd;
pub mod up;
