//! Built-in tools. Every one is deterministic and works offline.

mod fs;
mod math;
mod table;
mod text;
mod time;

use std::sync::Arc;

pub use fs::{FsList, FsRead, FsWrite};
pub use math::MathEvaluate;
pub use table::TableAggregate;
pub use text::TextTemplate;
pub use time::{TimeAdd, TimeNow, TimeSleep};

use crate::tool::Tool;

/// Every built-in tool.
pub fn builtin_tools() -> Vec<Arc<dyn Tool>> {
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
    ]
}
