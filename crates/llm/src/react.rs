//! The ReAct text protocol, the fallback for models without tool calling:
//!
//! ```text
//! Thought: I need the total first.
//! Action: table.aggregate
//! Action Input: {"path": "sales.csv", "op": "sum", "value_column": "amount"}
//! ```
//!
//! or `Final Answer: ...`. The action input goes through [`crate::repair`].

use serde_json::Value;

use crate::repair::{RepairError, repair_json};

/// What one ReAct turn asks for.
#[derive(Debug, Clone, PartialEq)]
pub enum ReactStep {
    Action { thought: Option<String>, tool: String, input: Value },
    Final { thought: Option<String>, answer: String },
}

/// Why a turn could not be read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ReactError {
    #[error("the answer has neither `Action:` nor `Final Answer:`")]
    NoAction,
    #[error("`Action:` names no tool")]
    EmptyAction,
    #[error("`Action Input` is not JSON: {0}")]
    BadInput(RepairError),
}

/// Parses one turn. Labels are matched case-insensitively, with `:` or `：`.
pub fn parse_react(text: &str) -> Result<ReactStep, ReactError> {
    let thought = field(text, "thought").map(|t| first_line_block(&t));
    if let Some(answer) = field(text, "final answer") {
        return Ok(ReactStep::Final { thought, answer: answer.trim().to_owned() });
    }
    let tool = field(text, "action").ok_or(ReactError::NoAction)?;
    let tool = tool.lines().next().unwrap_or_default().trim().trim_matches('`').to_owned();
    if tool.is_empty() {
        return Err(ReactError::EmptyAction);
    }
    let input = match field(text, "action input") {
        Some(raw) if !raw.trim().is_empty() => repair_json(&raw).map_err(ReactError::BadInput)?.value,
        _ => Value::Object(Default::default()),
    };
    Ok(ReactStep::Action { thought, tool, input })
}

/// The text after `label:` up to the next known label, or the end.
fn field(text: &str, label: &str) -> Option<String> {
    const LABELS: [&str; 4] = ["thought", "action input", "action", "final answer"];
    // ASCII only: the labels are ASCII, and a full lowercasing changes the UTF-8 length of some
    // letters (`Ⱥ`, `İ`, the Kelvin sign), so offsets found in it would not fit `text`.
    let lower = text.to_ascii_lowercase();
    let (_, start) = find_label(&lower, label)?;
    let rest = &text[start..];
    let rest_lower = &lower[start..];
    let end = LABELS
        .iter()
        .filter(|l| **l != label)
        .filter_map(|l| find_label(rest_lower, l).map(|(label_at, _)| label_at))
        .min()
        .unwrap_or(rest.len());
    Some(rest[..end].trim().to_owned())
}

/// Where `label:` starts at the beginning of a line, and the byte offset just after its colon.
fn find_label(lower: &str, label: &str) -> Option<(usize, usize)> {
    let mut offset = 0;
    for line in lower.split_inclusive('\n') {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        if let Some(after) = trimmed.strip_prefix(label) {
            let sep = after.chars().next();
            if matches!(sep, Some(':') | Some('：')) {
                let at = offset + indent;
                return Some((at, at + label.len() + sep.map_or(0, char::len_utf8)));
            }
        }
        offset += line.len();
    }
    None
}

fn first_line_block(text: &str) -> String {
    text.trim().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reads_an_action_with_repaired_input() {
        let step = parse_react(
            "Thought: need the sum\nAction: table.aggregate\nAction Input: ```json\n{'path': 'a.csv', op: 'sum',}\n```",
        )
        .unwrap();
        assert_eq!(
            step,
            ReactStep::Action {
                thought: Some("need the sum".into()),
                tool: "table.aggregate".into(),
                input: json!({"path": "a.csv", "op": "sum"}),
            }
        );
    }

    #[test]
    fn reads_a_final_answer_and_chinese_colons() {
        let step = parse_react("Thought：完成\nFinal Answer：总计 42").unwrap();
        assert_eq!(step, ReactStep::Final { thought: Some("完成".into()), answer: "总计 42".into() });
    }

    #[test]
    fn letters_whose_lowercase_has_another_length_do_not_shift_the_labels() {
        // Found by tests/fuzz.rs: with `to_lowercase`, `Ⱥ` grew by a byte and `text[start..]`
        // cut `é` in half.
        assert_eq!(
            parse_react("Ⱥ\naction:é"),
            Ok(ReactStep::Action {
                thought: None,
                tool: "é".into(),
                input: Value::Object(Default::default())
            })
        );
        let step = parse_react("İK Ω\nThought: t\nAction: x.y\nAction Input: {\"a\": 1}").unwrap();
        assert_eq!(
            step,
            ReactStep::Action { thought: Some("t".into()), tool: "x.y".into(), input: json!({"a": 1}) }
        );
    }

    #[test]
    fn rejects_turns_without_an_action() {
        assert_eq!(parse_react("I think the answer is 4"), Err(ReactError::NoAction));
        assert!(matches!(parse_react("Action: x\nAction Input: {oops"), Err(ReactError::BadInput(_))));
    }
}
