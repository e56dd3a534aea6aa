//! Clients of Hermes services, for the services that call them: the memory service
//! ([`memory::MemoryClient`], used by the planner and the agents' `memory.*` tools) and the
//! registry's capability catalogue ([`registry::Catalog`], used by the dispatcher and the planner
//! to validate plans). A caller depends on this crate, not on the service it calls.

pub mod memory;
pub mod registry;
