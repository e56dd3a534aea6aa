//! The planner's prompt: fixed system sections (role, decomposition rules, tool rules with
//! negative examples, output format), then the goal, the relevant task types and, for a replan,
//! what already happened.

use std::collections::HashSet;

use hermes_proto::{CatalogEntry, PlanRequest};
use serde_json::{Value, json};

pub const SYSTEM: &str = r#"# Role
You are the planner of Hermes, an orchestrator of tools and agents. You turn a user's goal into a plan: a DAG of steps, each run by one task type from the catalogue below. You never run anything yourself.

# Decomposition rules
- Single responsibility: each node does one thing with one task type.
- Explicit dependencies: when a node needs another node's output, write the value as {"$ref": "node_id.path"} (for example {"$ref": "april.total"}); that makes it a dependency. Use "depends_on" only for ordering without data.
- Parallel where independent: nodes that do not need each other's output must not depend on each other.
- Use as few nodes as the goal needs. Node ids are short, unique, [A-Za-z0-9_-].

# Tool rules
- Use only task types listed in the catalogue, with inputs that match their JSON Schema exactly.
- Never invent a task type, a parameter, a file or a value. Wrong: {"task_type": "web.search"} when no such type is listed. Wrong: {"expression": "x"} for math.evaluate without giving "variables". Wrong: a path you were not told exists.
- If the goal cannot be done with the listed task types, do not plan: answer {"needs_input": "<what is missing, in the user's language>"}.

# Output format
Answer with one JSON object only, no prose:
{"reasoning": "<one or two sentences>", "nodes": [{"id": "...", "task_type": "...", "inputs": {...}, "depends_on": []}], "output_node": "<id of the node whose output answers the goal>"}
or {"needs_input": "..."}."#;

/// The JSON Schema the answer must match, for `response_format`: either `needs_input`, or a plan
/// whose nodes are each one of the offered task types with that type's own input schema. Being
/// this precise lets a constrained decoder (the local model) produce only plans that name real
/// task types with well-formed inputs.
pub fn answer_schema(entries: &[&CatalogEntry]) -> Value {
    let node_kinds: Vec<Value> = entries
        .iter()
        .map(|entry| {
            let inputs = entry
                .tool
                .as_ref()
                .and_then(|t| serde_json::from_str::<Value>(&t.params_schema_json).ok())
                .map(|s| hermes_core::schema::inline_refs(&s))
                .unwrap_or_else(|| json!({"type": "object"}));
            json!({
                "type": "object",
                "properties": {
                    "id": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,24}$"},
                    "task_type": {"const": entry.task_type},
                    "inputs": inputs,
                    "depends_on": {"type": "array", "items": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,24}$"}}
                },
                "required": ["id", "task_type", "inputs"],
                "additionalProperties": false
            })
        })
        .collect();
    json!({
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "reasoning": {"type": "string"},
                    "nodes": {"type": "array", "minItems": 1, "items": {"anyOf": node_kinds}},
                    "output_node": {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,24}$"}
                },
                "required": ["reasoning", "nodes"],
                "additionalProperties": false
            },
            {
                "type": "object",
                "properties": {"needs_input": {"type": "string"}},
                "required": ["needs_input"],
                "additionalProperties": false
            }
        ]
    })
}

/// Words of a text for lexical relevance: lowercase alphanumeric runs, plus each CJK character
/// (Chinese has no spaces between words).
fn terms(text: &str) -> HashSet<String> {
    let mut out = HashSet::new();
    let mut word = String::new();
    for c in text.chars().flat_map(char::to_lowercase) {
        if is_cjk(c) {
            out.insert(c.to_string());
        }
        if c.is_ascii_alphanumeric() {
            word.push(c);
        } else if !word.is_empty() {
            out.insert(std::mem::take(&mut word));
        }
    }
    if !word.is_empty() {
        out.insert(word);
    }
    out
}

fn is_cjk(c: char) -> bool {
    matches!(c as u32, 0x4E00..=0x9FFF | 0x3400..=0x4DBF)
}

/// The `top_k` task types most relevant to the goal by shared terms (all of them when the
/// catalogue is small). Ties keep catalogue order.
pub fn select_entries<'a>(entries: &'a [CatalogEntry], goal: &str, top_k: usize) -> Vec<&'a CatalogEntry> {
    if entries.len() <= top_k {
        return entries.iter().collect();
    }
    let goal_terms = terms(goal);
    let mut scored: Vec<(usize, usize, &CatalogEntry)> = entries
        .iter()
        .enumerate()
        .map(|(i, e)| {
            let description = e.tool.as_ref().map(|t| t.description.as_str()).unwrap_or("");
            let entry_terms = terms(&format!("{} {}", e.task_type.replace('.', " "), description));
            (goal_terms.intersection(&entry_terms).count(), i, e)
        })
        .collect();
    scored.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    scored.into_iter().take(top_k).map(|(_, _, e)| e).collect()
}

/// The system message: the fixed sections, then the catalogue. The catalogue sits here, not in
/// the user message, because it changes rarely: a provider that caches prompt prefixes (the local
/// model does) then reads it once.
pub fn system_message(entries: &[&CatalogEntry]) -> String {
    let mut text = format!("{SYSTEM}\n\n# Catalogue\n");
    for entry in entries {
        let (description, schema) = entry
            .tool
            .as_ref()
            .map(|t| (t.description.as_str(), t.params_schema_json.as_str()))
            .unwrap_or(("", "{}"));
        text.push_str(&format!("- {}: {description}\n  inputs schema: {schema}\n", entry.task_type));
    }
    text
}

/// Recalled memories below this cosine similarity are left out of the prompt.
pub const MIN_MEMORY_SCORE: f32 = 0.3;

/// The user message: the session and recalled memories when there are any, the goal, and the
/// replan context when there is one.
pub fn user_message(request: &PlanRequest, context: Option<&hermes_proto::ContextReply>) -> String {
    let mut text = String::new();
    if let Some(context) = context {
        if let Some(session) = context.session.as_ref().filter(|s| !s.turns.is_empty() || s.summary.is_some())
        {
            text.push_str(
                "# Session\nEarlier in this conversation (use it to resolve references such as \"the same\" or \"that month\"):\n",
            );
            text.push_str(&hermes_clients::memory::render_session(session));
            text.push('\n');
        }
        let memories: Vec<_> = context.memories.iter().filter(|m| m.score >= MIN_MEMORY_SCORE).collect();
        if !memories.is_empty() {
            text.push_str(
                "# Memory\nRecalled from earlier goals; may be outdated, use only what is relevant:\n",
            );
            for hit in memories {
                let doc = hit.doc.clone().unwrap_or_default();
                let recalled: String = doc.text.chars().take(600).collect();
                text.push_str(&format!(
                    "- (similarity {:.2}) {}\n",
                    hit.score,
                    recalled.replace('\n', " / ")
                ));
            }
            text.push('\n');
        }
    }
    text.push_str(&format!("# Goal\n{}\n", request.goal_text));
    if let Some(replan) = &request.replan {
        let error = replan.error.clone().unwrap_or_default();
        text.push_str(&format!(
            "\n# Replan\nNode `{}` failed: {}: {}\n",
            replan.failed_node_id, error.code, error.message
        ));
        for (i, e) in replan.previous_errors.iter().enumerate() {
            text.push_str(&format!("Earlier failure {}: {}: {}\n", i + 1, e.code, e.message));
        }
        text.push_str("Completed nodes (they will not run again; refer to their outputs with $ref):\n");
        for done in &replan.completed {
            text.push_str(&format!("- {} ({}): {}\n", done.node_id, done.task_type, done.output_summary));
        }
        if let Some(plan) = &replan.current_plan {
            let nodes: Vec<Value> = plan
                .nodes
                .iter()
                .map(|n| {
                    json!({"id": n.id, "task_type": n.task_type, "inputs": serde_json::from_str::<Value>(&n.inputs_json).unwrap_or(Value::Null), "depends_on": n.depends_on})
                })
                .collect();
            text.push_str(&format!("Current plan: {}\n", Value::Array(nodes)));
        }
        text.push_str(&format!(
            "Answer with only the nodes that replace `{}` and the nodes depending on it, in the output format. Keep the id `{}` for its replacement. Do not repeat completed nodes.\n",
            replan.failed_node_id, replan.failed_node_id
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_proto::ToolSpec;

    fn entry(name: &str, description: &str) -> CatalogEntry {
        CatalogEntry {
            task_type: name.into(),
            tool: Some(ToolSpec { name: name.into(), description: description.into(), ..Default::default() }),
            live_agents: 1,
        }
    }

    #[test]
    fn picks_the_relevant_task_types_when_the_catalogue_is_large() {
        let entries = vec![
            entry("time.now", "current time"),
            entry("table.aggregate", "sum sales in a csv table"),
            entry("math.evaluate", "arithmetic"),
        ];
        let picked = select_entries(&entries, "sum the April sales table", 1);
        assert_eq!(picked[0].task_type, "table.aggregate");
        assert_eq!(select_entries(&entries, "anything", 5).len(), 3);
    }

    #[test]
    fn chinese_goals_match_by_character() {
        let entries = vec![entry("time.now", "当前时间"), entry("table.aggregate", "汇总销售表格")];
        let picked = select_entries(&entries, "汇总四月销售", 1);
        assert_eq!(picked[0].task_type, "table.aggregate");
    }
}
