//! Plan validation, shared by explicit plans and (later) planner output: the plan must be a DAG of
//! known task types with resolvable `$ref`s, inputs valid against each task type's schema, and no
//! more nodes than the limit. Every problem is reported, not just the first, so that a client (or a
//! model asked to correct its plan) can fix them all at once.

use std::collections::{BTreeSet, HashMap};

use hermes_proto::{TaskNode, TaskPlan};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::json_ref::{self, RefTarget};
use crate::schema::InputSchema;
use crate::topology::{truncate_for_message, validate_task_type};

/// Default upper bound on plan size.
pub const DEFAULT_MAX_NODES: usize = 2000;
/// Upper bound on one node's serialized inputs.
pub const MAX_INPUTS_BYTES: usize = 256 * 1024;

/// What validation needs to know about task types: whether one exists, and its input schema.
pub trait TaskTypeCatalog {
    /// `None` when no live agent serves `task_type`; `Some(None)` when it has no schema.
    fn input_schema(&self, task_type: &str) -> Option<Option<&InputSchema>>;
}

impl TaskTypeCatalog for HashMap<String, Option<InputSchema>> {
    fn input_schema(&self, task_type: &str) -> Option<Option<&InputSchema>> {
        self.get(task_type).map(Option::as_ref)
    }
}

/// A plan that passed validation.
#[derive(Debug, Clone)]
pub struct ValidatedPlan {
    /// The plan with every `$ref` dependency added to `depends_on`, sorted and deduplicated.
    pub plan: TaskPlan,
    /// Parallel groups computed from the DAG: group i holds the nodes whose dependencies all lie
    /// in groups before i. Never taken from a planner.
    pub groups: Vec<Vec<String>>,
}

/// Validates `plan` against `catalog`.
pub fn validate_plan(
    plan: &TaskPlan,
    catalog: &dyn TaskTypeCatalog,
    max_nodes: usize,
) -> Result<ValidatedPlan> {
    let invalid = |problems: Vec<String>| Error::PlanInvalid { problems };
    if plan.nodes.is_empty() {
        return Err(invalid(vec!["the plan has no nodes".into()]));
    }
    if plan.nodes.len() > max_nodes {
        return Err(invalid(vec![format!(
            "the plan has {} nodes, over the limit of {max_nodes}",
            plan.nodes.len()
        )]));
    }

    let mut problems = Vec::new();
    let mut index: HashMap<&str, usize> = HashMap::new();
    for (i, node) in plan.nodes.iter().enumerate() {
        if !valid_node_id(&node.id) {
            problems.push(format!(
                "node id `{}` must be 1-64 characters of [A-Za-z0-9_-]",
                truncate_for_message(&node.id)
            ));
        } else if index.insert(node.id.as_str(), i).is_some() {
            problems.push(format!("node id `{}` is used more than once", node.id));
        }
    }

    let mut nodes = Vec::with_capacity(plan.nodes.len());
    for node in &plan.nodes {
        nodes.push(check_node(node, &index, catalog, &mut problems));
    }
    if !plan.output_node.is_empty() && !index.contains_key(plan.output_node.as_str()) {
        problems.push(format!("output_node `{}` is not a node of the plan", plan.output_node));
    }
    if !problems.is_empty() {
        return Err(invalid(problems));
    }

    let groups = parallel_groups(&nodes)
        .map_err(|cycle| invalid(vec![format!("the plan has a cycle: {}", cycle.join(" -> "))]))?;
    Ok(ValidatedPlan {
        plan: TaskPlan { nodes, reasoning: plan.reasoning.clone(), output_node: plan.output_node.clone() },
        groups,
    })
}

fn valid_node_id(id: &str) -> bool {
    !id.is_empty() && id.len() <= 64 && id.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Checks one node and returns it with its dependencies made explicit.
fn check_node(
    node: &TaskNode,
    index: &HashMap<&str, usize>,
    catalog: &dyn TaskTypeCatalog,
    problems: &mut Vec<String>,
) -> TaskNode {
    let id = &node.id;
    let mut deps: BTreeSet<String> = BTreeSet::new();
    for dep in &node.depends_on {
        if dep == id {
            problems.push(format!("node `{id}` depends on itself"));
        } else if !index.contains_key(dep.as_str()) {
            problems.push(format!("node `{id}` depends on `{dep}`, which is not in the plan"));
        } else {
            deps.insert(dep.clone());
        }
    }

    let inputs = parse_inputs(node, problems);
    if let Some(inputs) = &inputs {
        for key in &node.secret_inputs {
            if inputs.get(key).is_none() {
                problems.push(format!(
                    "node `{id}`: secret_inputs names `{}`, which is not one of its inputs",
                    truncate_for_message(key)
                ));
            }
        }
        for pointer in crate::artifacts::stub_pointers(inputs) {
            problems.push(format!(
                "node `{id}` input {pointer}: `$artifact` stubs cannot be submitted; Hermes makes them for large outputs, and a plan refers to another node's output with `$ref`"
            ));
        }
        for (pointer, reference) in json_ref::collect_refs(inputs) {
            match RefTarget::parse(&reference) {
                None => problems.push(format!(
                    "node `{id}` input {pointer}: malformed $ref `{}`",
                    truncate_for_message(&reference)
                )),
                Some(target) if target.node_id == *id => {
                    problems.push(format!("node `{id}` input {pointer}: $ref `{reference}` points at itself"))
                }
                Some(target) if !index.contains_key(target.node_id.as_str()) => problems.push(format!(
                    "node `{id}` input {pointer}: $ref `{reference}` names node `{}`, which is not in the plan",
                    target.node_id
                )),
                Some(target) => {
                    deps.insert(target.node_id);
                }
            }
        }
    }

    match validate_task_type(&node.task_type) {
        Err(e) => problems.push(format!("node `{id}`: {e}")),
        Ok(()) => match catalog.input_schema(&node.task_type) {
            None => problems.push(format!(
                "node `{id}`: unknown task type `{}`: no live agent serves it",
                node.task_type
            )),
            Some(Some(schema)) => {
                if let Some(inputs) = &inputs {
                    for violation in schema.check_with_refs(inputs) {
                        problems.push(format!("node `{id}` ({}): input {violation}", node.task_type));
                    }
                }
            }
            Some(None) => {}
        },
    }

    TaskNode { depends_on: deps.into_iter().collect(), ..node.clone() }
}

fn parse_inputs(node: &TaskNode, problems: &mut Vec<String>) -> Option<Value> {
    if node.inputs_json.len() > MAX_INPUTS_BYTES {
        problems.push(format!(
            "node `{}`: inputs are {} bytes, over the limit of {MAX_INPUTS_BYTES}",
            node.id,
            node.inputs_json.len()
        ));
        return None;
    }
    if node.inputs_json.trim().is_empty() {
        return Some(Value::Object(Default::default()));
    }
    match serde_json::from_str::<Value>(&node.inputs_json) {
        Ok(v @ Value::Object(_)) => Some(v),
        Ok(_) => {
            problems.push(format!("node `{}`: inputs must be a JSON object", node.id));
            None
        }
        Err(e) => {
            problems.push(format!("node `{}`: inputs are not valid JSON: {e}", node.id));
            None
        }
    }
}

/// Kahn's algorithm, level by level. On a cycle, returns one cycle as a path of node ids.
fn parallel_groups(nodes: &[TaskNode]) -> Result<Vec<Vec<String>>, Vec<String>> {
    let position: HashMap<&str, usize> = nodes.iter().enumerate().map(|(i, n)| (n.id.as_str(), i)).collect();
    let mut indegree: Vec<usize> = nodes.iter().map(|n| n.depends_on.len()).collect();
    let mut dependents: Vec<Vec<usize>> = vec![Vec::new(); nodes.len()];
    for (i, node) in nodes.iter().enumerate() {
        for dep in &node.depends_on {
            dependents[position[dep.as_str()]].push(i);
        }
    }
    let mut groups = Vec::new();
    let mut current: Vec<usize> = (0..nodes.len()).filter(|&i| indegree[i] == 0).collect();
    let mut placed = 0;
    while !current.is_empty() {
        placed += current.len();
        let mut next = Vec::new();
        for &i in &current {
            for &d in &dependents[i] {
                indegree[d] -= 1;
                if indegree[d] == 0 {
                    next.push(d);
                }
            }
        }
        groups.push(current.iter().map(|&i| nodes[i].id.clone()).collect());
        current = next;
    }
    if placed == nodes.len() {
        return Ok(groups);
    }
    // Every node left has a dependency left, so walking dependencies from any of them must
    // revisit a node: that loop is a cycle.
    let mut path: Vec<usize> = Vec::new();
    let mut at = (0..nodes.len()).find(|&i| indegree[i] > 0).unwrap_or(0);
    loop {
        if let Some(start) = path.iter().position(|&p| p == at) {
            let mut cycle: Vec<String> = path[start..].iter().rev().map(|&i| nodes[i].id.clone()).collect();
            cycle.push(cycle[0].clone());
            return Err(cycle);
        }
        path.push(at);
        at = nodes[at]
            .depends_on
            .iter()
            .map(|d| position[d.as_str()])
            .find(|&d| indegree[d] > 0)
            .unwrap_or(at);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(id: &str, task_type: &str, inputs: Value, deps: &[&str]) -> TaskNode {
        TaskNode {
            id: id.into(),
            task_type: task_type.into(),
            inputs_json: inputs.to_string(),
            depends_on: deps.iter().map(|d| d.to_string()).collect(),
            ..Default::default()
        }
    }

    fn catalog() -> HashMap<String, Option<InputSchema>> {
        let schema = InputSchema::compile(json!({
            "type": "object", "properties": {"x": {"type": "number"}}, "additionalProperties": false
        }))
        .unwrap();
        HashMap::from([("t.a".to_owned(), Some(schema)), ("t.free".to_owned(), None)])
    }

    fn problems(plan: TaskPlan) -> Vec<String> {
        match validate_plan(&plan, &catalog(), 10) {
            Err(Error::PlanInvalid { problems }) => problems,
            other => panic!("expected PlanInvalid, got {other:?}"),
        }
    }

    #[test]
    fn refs_become_dependencies_and_groups_follow_the_dag() {
        let plan = TaskPlan {
            nodes: vec![
                node("a", "t.a", json!({"x": 1}), &[]),
                node("b", "t.a", json!({"x": 2}), &[]),
                node("c", "t.a", json!({"x": {"$ref": "a.value"}}), &["b"]),
            ],
            ..Default::default()
        };
        let v = validate_plan(&plan, &catalog(), 10).unwrap();
        assert_eq!(v.plan.nodes[2].depends_on, vec!["a", "b"]);
        assert_eq!(v.groups, vec![vec!["a".to_owned(), "b".to_owned()], vec!["c".to_owned()]]);
    }

    #[test]
    fn a_cycle_is_named() {
        let plan = TaskPlan {
            nodes: vec![
                node("a", "t.free", json!({}), &["c"]),
                node("b", "t.free", json!({}), &["a"]),
                node("c", "t.free", json!({}), &["b"]),
                node("d", "t.free", json!({}), &[]),
            ],
            ..Default::default()
        };
        let p = problems(plan);
        assert_eq!(p.len(), 1);
        assert!(p[0].contains("cycle"), "{p:?}");
        for id in ["a", "b", "c"] {
            assert!(p[0].contains(id));
        }
        assert!(!p[0].contains('d'));
    }

    #[test]
    fn every_problem_is_reported() {
        let plan = TaskPlan {
            nodes: vec![
                node("a", "t.nope", json!({}), &[]),
                node("b", "t.a", json!({"x": "text"}), &["zz"]),
                node("c", "t.a", json!({"x": {"$ref": "ghost.value"}}), &[]),
                node("a", "t.a", json!({}), &[]),
            ],
            ..Default::default()
        };
        let p = problems(plan).join("\n");
        assert!(p.contains("unknown task type `t.nope`"), "{p}");
        assert!(p.contains("depends on `zz`"), "{p}");
        assert!(p.contains("names node `ghost`"), "{p}");
        assert!(p.contains("node `b` (t.a): input /x"), "{p}");
        assert!(p.contains("`a` is used more than once"), "{p}");
    }

    #[test]
    fn the_node_limit_holds() {
        let nodes = (0..11).map(|i| node(&format!("n{i}"), "t.free", json!({}), &[])).collect();
        let p = problems(TaskPlan { nodes, ..Default::default() });
        assert!(p[0].contains("11 nodes, over the limit of 10"), "{p:?}");
    }
}
