//! Built-in tools. Every one is deterministic and works offline.

mod fs;
mod http;
mod math;
pub mod mcp;
mod memory;
pub mod python;
mod summarize;
mod table;
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
pub use text::TextTemplate;
pub use time::{TimeAdd, TimeNow, TimeSleep};

use crate::tool::Tool;

/// Every built-in tool, `http.fetch` with no allowed host.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
    builtin_tools_with(Vec::new())
}

/// Every built-in tool, `http.fetch` limited to the `http_allow` hosts.
pub fn builtin_tools_with(http_allow: Vec<String>) -> Vec<Arc<dyn Tool>> {
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
