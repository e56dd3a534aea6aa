//! JSON repair for model output. It fixes, outside string literals only: a code fence or prose
//! around one JSON value, full-width punctuation (`，：“”｛｝［］`), `//` and `/* */` comments,
//! single-quoted strings, unquoted keys, trailing commas, thousands separators in object values
//! (`"total": 1,234.5`), and missing closing brackets after a complete value.
//!
//! A repair must never change meaning, so anything ambiguous is rejected rather than guessed:
//! two JSON values in one answer, text truncated inside a string or a number, separators in an
//! array (`[1,234]` is two numbers), Python literals, and anything else that still does not parse.

use serde_json::Value;

/// One kind of fix applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fix {
    CodeFence,
    SurroundingProse,
    FullWidthPunctuation,
    Comments,
    SingleQuotes,
    UnquotedKeys,
    TrailingCommas,
    ThousandsSeparators,
    ClosedBrackets,
}

/// A value recovered from model output, with what had to be fixed.
#[derive(Debug, Clone, PartialEq)]
pub struct Repaired {
    pub value: Value,
    pub fixes: Vec<Fix>,
}

/// Why a text could not be turned into JSON.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RepairError {
    #[error("the answer contains no JSON")]
    NoJson,
    #[error("the answer is ambiguous: {0}")]
    Ambiguous(String),
    #[error("the answer is not valid JSON and cannot be repaired safely: {0}")]
    Unrepairable(String),
}

/// Parses `text` as JSON, repairing it when that is safe.
pub fn repair_json(text: &str) -> Result<Repaired, RepairError> {
    let trimmed = text.trim().trim_start_matches('\u{feff}');
    if let Ok(value) = serde_json::from_str::<Value>(trimmed) {
        return Ok(Repaired { value, fixes: Vec::new() });
    }
    let mut fixes = Vec::new();
    let candidate = extract(trimmed, &mut fixes)?;
    let normalized = normalize(&candidate, &mut fixes)?;
    match serde_json::from_str::<Value>(&normalized) {
        Ok(value) => {
            fixes.dedup();
            Ok(Repaired { value, fixes })
        }
        Err(e) => Err(RepairError::Unrepairable(e.to_string())),
    }
}

/// Takes the one JSON-looking value out of fences or prose.
fn extract(text: &str, fixes: &mut Vec<Fix>) -> Result<String, RepairError> {
    let fences = fenced_blocks(text);
    let fences: Vec<&str> = fences.into_iter().filter(|b| b.trim_start().starts_with(is_open)).collect();
    match fences.as_slice() {
        [one] => {
            fixes.push(Fix::CodeFence);
            return Ok(one.trim().to_owned());
        }
        [] => {}
        _ => return Err(RepairError::Ambiguous(format!("{} code blocks hold JSON", fences.len()))),
    }
    let Some(start) = text.find(is_open) else {
        return Err(RepairError::NoJson);
    };
    let end = span_end(&text[start..]).map(|e| start + e);
    let candidate = match end {
        Some(end) => {
            if text[end..].contains(is_open) && text[end..].contains(is_close) {
                return Err(RepairError::Ambiguous("more than one JSON value".into()));
            }
            &text[start..end]
        }
        None => &text[start..],
    };
    if start > 0 || end.is_some_and(|e| !text[e..].trim().is_empty()) {
        fixes.push(Fix::SurroundingProse);
    }
    Ok(candidate.to_owned())
}

fn is_open(c: char) -> bool {
    matches!(c, '{' | '[' | '｛' | '［')
}

fn is_close(c: char) -> bool {
    matches!(c, '}' | ']' | '｝' | '］')
}

/// The contents of ``` fenced blocks.
fn fenced_blocks(text: &str) -> Vec<&str> {
    let mut blocks = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        let after = &rest[open + 3..];
        let body_start = after.find('\n').map_or(after.len(), |n| n + 1);
        let body = &after[body_start..];
        match body.find("```") {
            Some(close) => {
                blocks.push(&body[..close]);
                rest = &body[close + 3..];
            }
            None => {
                // An unclosed fence: the model was cut off; take what there is.
                blocks.push(body);
                break;
            }
        }
    }
    blocks
}

/// Byte offset just past the value starting at the beginning of `text`, if it closes.
fn span_end(text: &str) -> Option<usize> {
    let mut depth = 0usize;
    let mut quote: Option<char> = None;
    let mut escaped = false;
    for (i, c) in text.char_indices() {
        if let Some(q) = quote {
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == q || (q == '“' && c == '”') {
                quote = None;
            }
            continue;
        }
        match c {
            '"' | '\'' => quote = Some(c),
            '“' => quote = Some('“'),
            c if is_open(c) => depth += 1,
            c if is_close(c) => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    return Some(i + c.len_utf8());
                }
            }
            _ => {}
        }
    }
    None
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    Object,
    Array,
}

/// Rewrites the candidate into strict JSON, token by token, touching only what lies outside
/// string literals.
fn normalize(text: &str, fixes: &mut Vec<Fix>) -> Result<String, RepairError> {
    let chars: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut stack: Vec<Frame> = Vec::new();
    // The last structural character emitted: `{`, `[`, `:`, `,`, or 'v' after a value.
    let mut last = ' ';
    let mut i = 0;
    let unrepairable = |why: &str| RepairError::Unrepairable(why.to_owned());
    while i < chars.len() {
        let c = chars[i];
        match c {
            c if c.is_whitespace() => {
                out.push(c);
                i += 1;
            }
            '"' | '\'' | '“' | '”' => {
                if c != '"' {
                    fixes.push(if c == '\'' { Fix::SingleQuotes } else { Fix::FullWidthPunctuation });
                }
                let close: &[char] = match c {
                    '"' => &['"'],
                    '\'' => &['\''],
                    _ => &['”', '“'],
                };
                i = copy_string(&chars, i + 1, close, &mut out)
                    .ok_or_else(|| unrepairable("truncated inside a string"))?;
                last = 'v';
            }
            '/' if chars.get(i + 1) == Some(&'/') => {
                fixes.push(Fix::Comments);
                while i < chars.len() && chars[i] != '\n' {
                    i += 1;
                }
            }
            '/' if chars.get(i + 1) == Some(&'*') => {
                fixes.push(Fix::Comments);
                let end =
                    (i + 2..chars.len().saturating_sub(1)).find(|&j| chars[j] == '*' && chars[j + 1] == '/');
                i = end.map(|j| j + 2).ok_or_else(|| unrepairable("unclosed comment"))?;
            }
            '{' | '｛' | '[' | '［' => {
                if c != '{' && c != '[' {
                    fixes.push(Fix::FullWidthPunctuation);
                }
                let open = if matches!(c, '{' | '｛') { '{' } else { '[' };
                stack.push(if open == '{' { Frame::Object } else { Frame::Array });
                out.push(open);
                last = open;
                i += 1;
            }
            '}' | '｝' | ']' | '］' => {
                if c != '}' && c != ']' {
                    fixes.push(Fix::FullWidthPunctuation);
                }
                let close = if matches!(c, '}' | '｝') { '}' } else { ']' };
                let expected = if close == '}' { Frame::Object } else { Frame::Array };
                if stack.pop() != Some(expected) {
                    return Err(unrepairable("brackets do not match"));
                }
                if last == ',' {
                    fixes.push(Fix::TrailingCommas);
                    let trimmed = out.trim_end().len();
                    out.truncate(trimmed);
                    out.pop();
                }
                out.push(close);
                last = 'v';
                i += 1;
            }
            ',' | '，' => {
                if c == '，' {
                    fixes.push(Fix::FullWidthPunctuation);
                }
                out.push(',');
                last = ',';
                i += 1;
            }
            ':' | '：' => {
                if c == '：' {
                    fixes.push(Fix::FullWidthPunctuation);
                }
                out.push(':');
                last = ':';
                i += 1;
            }
            c if c == '-' || c.is_ascii_digit() => {
                let in_object_value = stack.last() == Some(&Frame::Object) && last == ':';
                i = copy_number(&chars, i, in_object_value, &mut out, fixes)
                    .ok_or_else(|| unrepairable("malformed number"))?;
                last = 'v';
            }
            c if c.is_alphabetic() || c == '_' || c == '$' => {
                let start = i;
                while i < chars.len() && (chars[i].is_alphanumeric() || matches!(chars[i], '_' | '$' | '-')) {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let next = chars[i..].iter().find(|c| !c.is_whitespace());
                let key_position = stack.last() == Some(&Frame::Object) && matches!(last, '{' | ',');
                if key_position && matches!(next, Some(':') | Some('：')) {
                    fixes.push(Fix::UnquotedKeys);
                    out.push('"');
                    out.push_str(&word);
                    out.push('"');
                } else if matches!(word.as_str(), "true" | "false" | "null") {
                    out.push_str(&word);
                } else {
                    return Err(unrepairable(&format!("bare word `{word}`")));
                }
                last = 'v';
            }
            other => return Err(unrepairable(&format!("unexpected `{other}`"))),
        }
    }
    if !stack.is_empty() {
        // Closing brackets are added only after a complete value: a text cut off after `:` or
        // `,`, or inside a number (which may have had more digits), is rejected.
        let ends_complete = matches!(out.trim_end().chars().last(), Some('"' | '}' | ']' | 'e' | 'l'));
        if last != 'v' || !ends_complete {
            return Err(unrepairable("truncated before a value was complete"));
        }
        fixes.push(Fix::ClosedBrackets);
        while let Some(frame) = stack.pop() {
            out.push(if frame == Frame::Object { '}' } else { ']' });
        }
    }
    Ok(out)
}

/// Copies a string literal body starting at `i` (after the opening quote) as a JSON string;
/// returns the index after the closing quote, or `None` when the text ends first.
fn copy_string(chars: &[char], mut i: usize, close: &[char], out: &mut String) -> Option<usize> {
    out.push('"');
    let double = close == ['"'];
    while i < chars.len() {
        let c = chars[i];
        if c == '\\' {
            let next = *chars.get(i + 1)?;
            if next == '\'' && !double {
                out.push('\'');
            } else {
                out.push('\\');
                out.push(next);
            }
            i += 2;
            continue;
        }
        if close.contains(&c) {
            out.push('"');
            return Some(i + 1);
        }
        match c {
            '"' if !double => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
        i += 1;
    }
    None
}

/// Copies a number starting at `i`. In an object value, `1,234,567.5` (groups of exactly three
/// digits) is one number: there a comma followed by a bare number is never valid JSON, so the
/// reading is unambiguous. Returns the index after the number.
fn copy_number(
    chars: &[char],
    mut i: usize,
    in_object_value: bool,
    out: &mut String,
    fixes: &mut Vec<Fix>,
) -> Option<usize> {
    let start = i;
    if chars[i] == '-' {
        i += 1;
    }
    let int_start = i;
    while i < chars.len() && chars[i].is_ascii_digit() {
        i += 1;
    }
    if i == int_start {
        return None;
    }
    let mut digits: String = chars[start..i].iter().collect();
    if in_object_value && i - int_start <= 3 {
        let mut j = i;
        let mut grouped = digits.clone();
        let mut groups = 0;
        while j + 3 < chars.len() + 1
            && chars.get(j) == Some(&',')
            && chars[j + 1..].iter().take(3).filter(|c| c.is_ascii_digit()).count() == 3
            && !chars.get(j + 4).is_some_and(|c| c.is_ascii_digit())
        {
            grouped.extend(&chars[j + 1..j + 4]);
            j += 4;
            groups += 1;
        }
        let next = chars[j..].iter().find(|c| !c.is_whitespace());
        let ends_value = matches!(next, None | Some('}' | ',' | '.' | '｝' | '，'));
        if groups > 0 && ends_value {
            fixes.push(Fix::ThousandsSeparators);
            digits = grouped;
            i = j;
        }
    }
    out.push_str(&digits);
    // Fraction and exponent are copied as they are; serde_json judges them.
    while i < chars.len() && (chars[i].is_ascii_digit() || matches!(chars[i], '.' | 'e' | 'E' | '+' | '-')) {
        out.push(chars[i]);
        i += 1;
    }
    Some(i)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn ok(text: &str) -> Value {
        repair_json(text).unwrap_or_else(|e| panic!("{text:?}: {e}")).value
    }

    #[test]
    fn strict_json_passes_untouched() {
        let r = repair_json(r#"{"a": [1, 2], "b": "x"}"#).unwrap();
        assert!(r.fixes.is_empty());
    }

    #[test]
    fn common_breakage_is_repaired() {
        assert_eq!(ok("```json\n{\"a\": 1,}\n```"), json!({"a": 1}));
        assert_eq!(
            ok("Here is the plan: {a: 'x', // note\n b: [1,2,],} Hope it helps."),
            json!({"a": "x", "b": [1, 2]})
        );
        assert_eq!(
            ok("｛“名称”：“销售”，“数量”：３｝".replace('３', "3").as_str()),
            json!({"名称": "销售", "数量": 3})
        );
        assert_eq!(ok(r#"{"total": 1,234,567.5, "n": 2}"#), json!({"total": 1234567.5, "n": 2}));
        assert_eq!(ok(r#"{"a": {"b": "c"}"#), json!({"a": {"b": "c"}}));
    }

    #[test]
    fn ambiguous_or_truncated_text_is_rejected() {
        for bad in [
            "no json here",
            r#"{"a": 1} and also {"b": 2}"#,
            r#"{"a": 12"#,
            r#"{"a": "unterminated"#,
            r#"{"a": 1,"#,
            "{\"a\": True}",
            r#"[1,234]"#,
        ] {
            let result = repair_json(bad);
            if bad == "[1,234]" {
                // Valid JSON: two numbers, and never one.
                assert_eq!(result.unwrap().value, json!([1, 234]));
            } else {
                assert!(result.is_err(), "{bad:?} was accepted as {result:?}");
            }
        }
    }

    #[test]
    fn quotes_inside_strings_are_kept() {
        assert_eq!(ok(r#"{"text": "他说“你好”", }"#), json!({"text": "他说“你好”"}));
        assert_eq!(ok(r#"{'q': 'say "hi"'}"#), json!({"q": "say \"hi\""}));
    }
}
