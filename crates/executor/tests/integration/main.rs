//! The executor's tools and tool loop against real peers: the scripted OpenAI-compatible server,
//! a real MCP server, real HTTP, Python in the sandbox and a temporary workspace.
//!
//! One test binary, not one per file, to keep links and disk down on CI machines.

mod agent_loop;
mod code_python;
mod fs_tools;
mod http_fetch;
mod mcp;
mod tool_cache;
mod tool_policy;
