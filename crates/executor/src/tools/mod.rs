//! Built-in tools. Every one is deterministic and works offline.

mod fs;
mod http;
mod math;
pub mod mcp;
mod memory;
pub mod python;
mod summarize;
mod table;
pub mod testing;
mod text;
mod time;

use std::sync::Arc;

pub use fs::{FsList, FsRead, FsWrite};
pub use http::HttpFetch;
pub use math::MathEvaluate;
pub use memory::{MemoryGet, MemoryPut, MemorySearch};
pub use python::{CodePython, CodePythonConfig};
pub use summarize::TextSummarize;
pub use table::TableAggregate;
pub(crate) use testing::spin_job;
pub use testing::{TestAbort, TestSpin, test_tools_enabled};
pub use text::TextTemplate;
pub(crate) use text::render_job;
pub use time::{TimeAdd, TimeNow, TimeSleep};

use crate::tool::Tool;

/// Every built-in tool, `http.fetch` with no allowed host.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    builtin_tools_with(Vec::new())
}

/// A registry of [`builtin_tools`].
pub fn builtin_registry() -> crate::ToolRegistry {
    let mut registry = crate::ToolRegistry::default();
    for tool in builtin_tools() {
        registry.register(tool).expect("the built-in tools have distinct names");
    }
    registry
}

/// Every built-in tool, `http.fetch` limited to the `http_allow` hosts; the fault-injection
/// tools too when [`test_tools_enabled`].
pub fn builtin_tools_with(http_allow: Vec<String>) -> Vec<Arc<dyn Tool>> {
    let mut tools = builtin(http_allow);
    if test_tools_enabled() {
        tools.push(Arc::new(TestAbort));
        tools.push(Arc::new(TestSpin));
    }
    tools
}

fn builtin(http_allow: Vec<String>) -> Vec<Arc<dyn Tool>> {
    vec![
        Arc::new(MathEvaluate),
        Arc::new(TimeNow),
        Arc::new(TimeAdd),
        Arc::new(TimeSleep),
        Arc::new(TextTemplate),
        Arc::new(TableAggregate),
        Arc::new(FsRead),
        Arc::new(FsWrite),
        Arc::new(FsList),
        Arc::new(HttpFetch::new(http_allow)),
    ]
}
