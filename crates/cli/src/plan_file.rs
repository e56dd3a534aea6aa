//! The YAML (or JSON) plan file that `hermes submit --plan` reads. Inputs are written as plain
//! YAML and become the node's `inputs_json`.

use std::path::Path;

use anyhow::Context;
use hermes_proto::{TaskNode, TaskPlan};
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PlanFile {
    nodes: Vec<NodeFile>,
    #[serde(default)]
    output_node: String,
    #[serde(default)]
    reasoning: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct NodeFile {
    id: String,
    task_type: String,
    #[serde(default)]
    inputs: serde_json::Value,
    #[serde(default)]
    depends_on: Vec<String>,
    #[serde(default)]
    max_retries: u32,
    #[serde(default)]
    timeout_ms: u64,
    /// Routing preferences.
    #[serde(default)]
    tags: Vec<String>,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    model: String,
}

/// Parses plan text; YAML is a superset of JSON, so both work.
pub fn parse_plan(text: &str) -> anyhow::Result<TaskPlan> {
    let file: PlanFile = serde_norway::from_str(text).context("the plan file is not a valid plan")?;
    Ok(TaskPlan {
        nodes: file
            .nodes
            .into_iter()
            .map(|n| TaskNode {
                id: n.id,
                task_type: n.task_type,
                inputs_json: if n.inputs.is_null() { "{}".to_owned() } else { n.inputs.to_string() },
                depends_on: n.depends_on,
                max_retries: n.max_retries,
                timeout_ms: n.timeout_ms,
                tags: n.tags,
                tools: n.tools,
                model: n.model,
            })
            .collect(),
        reasoning: file.reasoning,
        output_node: file.output_node,
    })
}

pub fn load_plan(path: &Path) -> anyhow::Result<TaskPlan> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    parse_plan(&text).with_context(|| format!("in {}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_yaml_with_nested_inputs() {
        let plan = parse_plan(
            "nodes:\n  - id: a\n    task_type: math.evaluate\n    inputs: {expression: '1+x', variables: {x: {$ref: b.value}}}\n    depends_on: [b]\n  - id: b\n    task_type: time.now\noutput_node: a\n",
        )
        .unwrap();
        assert_eq!(plan.nodes.len(), 2);
        assert_eq!(plan.output_node, "a");
        let inputs: serde_json::Value = serde_json::from_str(&plan.nodes[0].inputs_json).unwrap();
        assert_eq!(inputs["variables"]["x"]["$ref"], "b.value");
        assert_eq!(plan.nodes[1].inputs_json, "{}");
    }

    #[test]
    fn typos_fail_loudly() {
        let err = parse_plan("nodes:\n  - id: a\n    task_typ: x\n").unwrap_err();
        assert!(format!("{err:#}").contains("task_typ"), "{err:#}");
    }
}
