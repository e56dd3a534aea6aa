//! The plan file: the human-written shape of a plan that `hermes submit --plan` reads and
//! `POST /v1/goals` accepts. Inputs are plain YAML or JSON objects; they become the node's
//! `inputs_json`. YAML is a superset of JSON, so [`parse_plan`] reads both.

use hermes_proto::{TaskNode, TaskPlan};
use serde::Deserialize;

/// A plan as written by a person.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PlanFile {
    pub nodes: Vec<NodeFile>,
    #[serde(default)]
    pub output_node: String,
    #[serde(default)]
    pub reasoning: String,
}

/// One node of a [`PlanFile`].
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct NodeFile {
    pub id: String,
    pub task_type: String,
    #[serde(default)]
    pub inputs: serde_json::Value,
    #[serde(default)]
    pub depends_on: Vec<String>,
    #[serde(default)]
    pub max_retries: u32,
    #[serde(default)]
    pub timeout_ms: u64,
    /// Routing preferences.
    #[serde(default)]
    pub tags: Vec<String>,
    #[serde(default)]
    pub tools: Vec<String>,
    #[serde(default)]
    pub model: String,
    /// Input keys whose values are secrets (redacted wherever the plan is shown).
    #[serde(default)]
    pub secret_inputs: Vec<String>,
}

/// Why a plan file is not a plan.
#[derive(Debug, thiserror::Error)]
#[error("the plan file is not a valid plan: {0}")]
pub struct PlanFileError(String);

impl PlanFile {
    /// The wire plan. Inputs must be an object (or absent).
    pub fn into_plan(self) -> Result<TaskPlan, PlanFileError> {
        let nodes = self
            .nodes
            .into_iter()
            .map(|n| {
                let inputs_json = match &n.inputs {
                    serde_json::Value::Null => "{}".to_owned(),
                    serde_json::Value::Object(_) => n.inputs.to_string(),
                    other => {
                        return Err(PlanFileError(format!(
                            "node `{}`: inputs must be an object, not {other}",
                            n.id
                        )));
                    }
                };
                Ok(TaskNode {
                    id: n.id,
                    task_type: n.task_type,
                    inputs_json,
                    depends_on: n.depends_on,
                    max_retries: n.max_retries,
                    timeout_ms: n.timeout_ms,
                    tags: n.tags,
                    tools: n.tools,
                    model: n.model,
                    secret_inputs: n.secret_inputs,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(TaskPlan { nodes, reasoning: self.reasoning, output_node: self.output_node })
    }
}

/// Parses plan text, YAML or JSON.
pub fn parse_plan(text: &str) -> Result<TaskPlan, PlanFileError> {
    let file: PlanFile = serde_norway::from_str(text).map_err(|e| PlanFileError(e.to_string()))?;
    file.into_plan()
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
        assert!(err.to_string().contains("task_typ"), "{err}");
    }

    #[test]
    fn inputs_that_are_not_an_object_are_refused() {
        let err = parse_plan("nodes:\n  - id: a\n    task_type: time.now\n    inputs: [1]\n").unwrap_err();
        assert!(err.to_string().contains("node `a`: inputs must be an object"), "{err}");
    }
}
