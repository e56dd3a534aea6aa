//! The plan file that `hermes submit --plan` reads: [`hermes_core::plan_file`], the shape the
//! HTTP API accepts too.

use std::path::Path;

use anyhow::Context;
use hermes_proto::TaskPlan;

pub use hermes_core::plan_file::parse_plan;

pub fn load_plan(path: &Path) -> anyhow::Result<TaskPlan> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_plan(&text).with_context(|| format!("in {}", path.display()))
}
