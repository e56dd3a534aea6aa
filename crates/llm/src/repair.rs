//! JSON repair for model output. One rule: syntax may be fixed, content is never invented or
//! dropped. It fixes, outside string literals only: a code fence or prose around the JSON,
//! reasoning blocks (`<think>…</think>`, `<reasoning>…</reasoning>`), full-width punctuation
//! (`，：“”｛｝［］`), `//` and `/* */` comments, single-quoted strings, unquoted keys, trailing
//! commas, thousands separators in object values (`"total": 1,234.5`), identical duplicate keys
//! (folded into one), Python's `True`, `False` and `None` where a value goes, and, where the
//! caller looks for a shape a bare string cannot have, a value sent as one JSON-encoded string.
//!
//! Anything that could change meaning is refused rather than guessed, with a [`RepairError`] the
//! caller can send back to the model:
//! - an answer cut off ([`RepairError::Truncated`]): structures left open at the end, text ending
//!   inside a string or a number. Closing them would drop whatever the model had still to say;
//! - a key given twice with different values ([`RepairError::DuplicateKey`]);
//! - two different wanted values in one answer ([`RepairError::Ambiguous`]);
//! - separators in an array (`[1,234]` is two numbers), a Python literal where a key goes, any
//!   other bare word, anything else that still does not parse ([`RepairError::Unrepairable`]).

use std::cell::Cell;
use std::fmt;

use serde::de::{DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

/// One kind of fix applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Fix {
    CodeFence,
    SurroundingProse,
    ReasoningBlock,
    FullWidthPunctuation,
    Comments,
    SingleQuotes,
    UnquotedKeys,
    TrailingCommas,
    ThousandsSeparators,
    DuplicateKeysFolded,
    DoubleEncoded,
    /// `True`, `False` and `None` outside strings, where a value goes, read as `true`, `false`
    /// and `null` (a Python dict's literals).
    PythonLiterals,
}

impl Fix {
    /// A short name for events and logs: `code_fence`, `trailing_commas`, ...
    pub fn name(self) -> &'static str {
        match self {
            Fix::CodeFence => "code_fence",
            Fix::SurroundingProse => "surrounding_prose",
            Fix::ReasoningBlock => "reasoning_block",
            Fix::FullWidthPunctuation => "full_width_punctuation",
            Fix::Comments => "comments",
            Fix::SingleQuotes => "single_quotes",
            Fix::UnquotedKeys => "unquoted_keys",
            Fix::TrailingCommas => "trailing_commas",
            Fix::ThousandsSeparators => "thousands_separators",
            Fix::DuplicateKeysFolded => "duplicate_keys_folded",
            Fix::DoubleEncoded => "double_encoded",
            Fix::PythonLiterals => "python_literals",
        }
    }
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
    #[error("the answer was cut off before the JSON was complete ({0})")]
    Truncated(String),
    #[error("duplicate key `{0}` with different values")]
    DuplicateKey(String),
    #[error("the answer is ambiguous: {0}")]
    Ambiguous(String),
    #[error("the answer is not valid JSON and cannot be repaired safely: {0}")]
    Unrepairable(String),
}

/// Parses `text` as JSON, repairing it when that is safe. Two different JSON values in one text
/// are ambiguous.
pub fn repair_json(text: &str) -> Result<Repaired, RepairError> {
    repair_json_where(text, |_| true)
}

/// Finds the one value in `text` that `wanted` accepts, repairing syntax when that is safe.
///
/// Prose may hold other JSON-looking text (`{name}`, a small example object): values `wanted`
/// refuses, and candidates that do not parse, are ignored beside a wanted one. Copies of one
/// value count once; two different wanted values are [`RepairError::Ambiguous`]. An answer whose
/// end leaves a structure open is [`RepairError::Truncated`] even beside a complete value: what
/// was cut off may have been the real answer. When the whole text is one JSON string that
/// `wanted` refuses and whose content is JSON, that content is read instead
/// ([`Fix::DoubleEncoded`]). [`RepairError::NoJson`] when nothing wanted is found.
pub fn repair_json_where(text: &str, wanted: impl Fn(&Value) -> bool) -> Result<Repaired, RepairError> {
    let mut fixes = Vec::new();
    let text = strip_reasoning(text.trim_start_matches('\u{feff}'), &mut fixes);
    let trimmed = text.trim().trim_start_matches('\u{feff}');
    if let Ok((value, folded)) = parse_checked(trimmed) {
        if folded {
            fixes.push(Fix::DuplicateKeysFolded);
        }
        if let Value::String(inner) = &value
            && !wanted(&value)
            && inner.trim_start().starts_with(is_open)
        {
            let mut repaired = repair_json_where(inner, wanted)?;
            fixes.push(Fix::DoubleEncoded);
            fixes.append(&mut repaired.fixes);
            dedup_fixes(&mut fixes);
            return Ok(Repaired { value: repaired.value, fixes });
        }
        return Ok(Repaired { value, fixes });
    }
    let (candidates, from_fence) = candidates(trimmed)?;
    let mut found: Vec<(Value, Vec<Fix>)> = Vec::new();
    let mut failed: Option<(usize, RepairError)> = None;
    for candidate in &candidates {
        let mut own = Vec::new();
        let parsed = normalize(&candidate.text, &mut own).and_then(|n| {
            parse_checked(&n).map_err(|e| match e {
                e @ RepairError::DuplicateKey(_) => e,
                e => RepairError::Unrepairable(e.to_string()),
            })
        });
        match parsed {
            Ok((value, folded)) if wanted(&value) => {
                if folded {
                    own.push(Fix::DuplicateKeysFolded);
                }
                if !found.iter().any(|(v, _)| *v == value) {
                    found.push((value, own));
                }
            }
            Ok(_) => {}
            // Braces in prose (`{name}`, `[1]`) are no attempt at JSON; a key or a string is.
            Err(_) if !candidate.text.contains([':', '"', '：', '“']) && !candidate.open_at_end => {}
            Err(e) => {
                if candidate.open_at_end {
                    return Err(match e {
                        e @ RepairError::Truncated(_) => e,
                        _ => RepairError::Truncated("the answer ends inside a JSON value".into()),
                    });
                }
                if failed.as_ref().is_none_or(|(len, _)| candidate.text.len() > *len) {
                    failed = Some((candidate.text.len(), e));
                }
            }
        }
    }
    match found.len() {
        1 => {
            let (value, mut own) = found.pop().expect("one value");
            fixes.push(if from_fence { Fix::CodeFence } else { Fix::SurroundingProse });
            fixes.append(&mut own);
            dedup_fixes(&mut fixes);
            Ok(Repaired { value, fixes })
        }
        0 => Err(failed.map(|(_, e)| e).unwrap_or(RepairError::NoJson)),
        n => Err(RepairError::Ambiguous(format!("{n} different JSON values"))),
    }
}

fn dedup_fixes(fixes: &mut Vec<Fix>) {
    let mut seen = std::collections::HashSet::new();
    fixes.retain(|f| seen.insert(*f));
}

/// Removes `<think>…</think>` and `<reasoning>…</reasoning>` blocks, a reasoning preamble that
/// ends in a lone `</think>` (templates that open the block in the prompt), and everything after
/// an unclosed opening tag (the model never finished thinking).
fn strip_reasoning(text: &str, fixes: &mut Vec<Fix>) -> String {
    let mut out = text.to_owned();
    for (open, close) in [("<think>", "</think>"), ("<reasoning>", "</reasoning>")] {
        if let Some(end) = out.find(close)
            && out[..end].find(open).is_none()
        {
            out = out[end + close.len()..].to_owned();
            fixes.push(Fix::ReasoningBlock);
        }
        while let Some(start) = out.find(open) {
            fixes.push(Fix::ReasoningBlock);
            match out[start..].find(close) {
                Some(len) => out.replace_range(start..start + len + close.len(), ""),
                None => out.truncate(start),
            }
        }
    }
    out
}

/// One piece of the answer that may be the JSON value.
struct Candidate {
    text: String,
    /// It runs to the end of the answer without closing.
    open_at_end: bool,
}

/// The JSON-looking pieces of `text`: the bodies of ``` fences that hold JSON when there are
/// any, else every bracketed span in the prose. Also says whether they came from fences.
fn candidates(text: &str) -> Result<(Vec<Candidate>, bool), RepairError> {
    let fences: Vec<Candidate> = fenced_blocks(text)
        .into_iter()
        .filter(|(b, _)| b.trim_start().starts_with(is_open))
        .map(|(body, closed)| Candidate {
            open_at_end: !closed && span_end(body.trim()).is_none(),
            text: body.trim().to_owned(),
        })
        .collect();
    if !fences.is_empty() {
        return Ok((fences, true));
    }
    let spans: Vec<Candidate> = bracketed_spans(text)
        .into_iter()
        .map(|(span, open_at_end)| Candidate { text: span.to_owned(), open_at_end })
        .collect();
    if spans.is_empty() {
        return Err(RepairError::NoJson);
    }
    Ok((spans, false))
}

/// Parses strict JSON like `serde_json::from_str::<Value>`, but refuses a key given twice with
/// different values; identical repeats are folded, and the flag says so.
fn parse_checked(text: &str) -> Result<(Value, bool), RepairError> {
    let folded = Cell::new(false);
    let mut de = serde_json::Deserializer::from_str(text);
    let value = CheckedValue(&folded).deserialize(&mut de).map_err(|e| duplicate_or(e.to_string()))?;
    de.end().map_err(|e| RepairError::Unrepairable(e.to_string()))?;
    Ok((value, folded.get()))
}

const DUPLICATE_MARK: &str = "\u{0}duplicate key\u{0}";

fn duplicate_or(message: String) -> RepairError {
    match message.split(DUPLICATE_MARK).nth(1) {
        Some(key) => RepairError::DuplicateKey(key.to_owned()),
        None => RepairError::Unrepairable(message),
    }
}

/// A `Value` seed that watches for duplicate keys.
#[derive(Clone, Copy)]
struct CheckedValue<'a>(&'a Cell<bool>);

impl<'de> DeserializeSeed<'de> for CheckedValue<'_> {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for CheckedValue<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut items = Vec::new();
        while let Some(item) = seq.next_element_seed(self)? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let value = map.next_value_seed(self)?;
            match out.get(&key) {
                Some(old) if *old == value => self.0.set(true),
                Some(_) => {
                    return Err(serde::de::Error::custom(format!("{DUPLICATE_MARK}{key}{DUPLICATE_MARK}")));
                }
                None => {
                    out.insert(key, value);
                }
            }
        }
        Ok(Value::Object(out))
    }
}

fn is_open(c: char) -> bool {
    matches!(c, '{' | '[' | '｛' | '［')
}

fn is_close(c: char) -> bool {
    matches!(c, '}' | ']' | '｝' | '］')
}

/// The contents of ``` fenced blocks, each with whether its closing fence came.
fn fenced_blocks(text: &str) -> Vec<(&str, bool)> {
    split_fences(text).0
}

/// The bodies of the ``` fences of `text`, each with whether its fence closes, and the prose
/// outside them (the pieces joined by newlines).
fn split_fences(text: &str) -> (Vec<(&str, bool)>, String) {
    let mut blocks = Vec::new();
    let mut prose = String::new();
    let mut rest = text;
    while let Some(open) = rest.find("```") {
        prose.push_str(&rest[..open]);
        prose.push('\n');
        let after = &rest[open + 3..];
        let body_start = after.find('\n').map_or(after.len(), |n| n + 1);
        let body = &after[body_start..];
        match body.find("```") {
            Some(close) => {
                blocks.push((&body[..close], true));
                rest = &body[close + 3..];
            }
            None => {
                // No closing fence: the JSON inside may still be complete.
                blocks.push((body, false));
                rest = "";
                break;
            }
        }
    }
    prose.push_str(rest);
    (blocks, prose)
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
                    .ok_or_else(|| RepairError::Truncated("the text ends inside a string".into()))?;
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
                    if python_literal(&word).is_some() {
                        // A Python dict's `True:` key is a boolean, which no JSON key is.
                        return Err(unrepairable(&format!("`{word}` where a key goes")));
                    }
                    fixes.push(Fix::UnquotedKeys);
                    out.push('"');
                    out.push_str(&word);
                    out.push('"');
                } else if matches!(word.as_str(), "true" | "false" | "null") {
                    out.push_str(&word);
                } else if let Some(literal) = python_literal(&word) {
                    fixes.push(Fix::PythonLiterals);
                    out.push_str(literal);
                } else {
                    return Err(unrepairable(&format!("bare word `{word}`")));
                }
                last = 'v';
            }
            other => return Err(unrepairable(&format!("unexpected `{other}`"))),
        }
    }
    if !stack.is_empty() {
        return Err(RepairError::Truncated(format!("{} bracket(s) left open", stack.len())));
    }
    Ok(out)
}

/// The JSON literal a Python literal stands for.
fn python_literal(word: &str) -> Option<&'static str> {
    match word {
        "True" => Some("true"),
        "False" => Some("false"),
        "None" => Some("null"),
        _ => None,
    }
}

/// One JSON-looking piece of a text ([`json_pieces`]).
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// It parses, repaired as [`repair_json`] would.
    Value(Value),
    /// It does not parse, even repaired: its text.
    Unparsed(String),
}

/// Every JSON-looking piece of `text`: the whole text when it is one value (the content of a
/// JSON string that holds JSON, too), else each bracketed span, in code fences and in prose
/// alike, parsed as [`repair_json`] would repair it. [`repair_json_where`] takes the one value
/// it wants and passes over the rest; a caller that must not take a value when the text holds
/// others like it (two candidate plans) looks at them all here.
pub fn json_pieces(text: &str) -> Vec<Piece> {
    let mut fixes = Vec::new();
    let text = strip_reasoning(text.trim_start_matches('\u{feff}'), &mut fixes);
    let trimmed = text.trim();
    if let Ok((value, _)) = parse_checked(trimmed) {
        return match &value {
            Value::String(inner) if inner.trim_start().starts_with(is_open) => json_pieces(inner),
            _ => vec![Piece::Value(value)],
        };
    }
    // The fences' bodies, and the prose around them, each on its own: an apostrophe in the
    // prose (`[the user's goal]`) must not open a string that swallows a fenced value.
    let mut pieces = Vec::new();
    let (fences, prose) = split_fences(trimmed);
    for (body, _) in fences {
        spans_of(body, &mut pieces, &mut fixes);
    }
    spans_of(&prose, &mut pieces, &mut fixes);
    pieces
}

/// Each bracketed span of `text`, parsed, onto `pieces`.
fn spans_of(text: &str, pieces: &mut Vec<Piece>, fixes: &mut Vec<Fix>) {
    for (span, _) in bracketed_spans(text) {
        let parsed = normalize(span, fixes).and_then(|n| parse_checked(&n));
        pieces.push(match parsed {
            Ok((value, _)) => Piece::Value(value),
            Err(_) => Piece::Unparsed(span.to_owned()),
        });
    }
}

/// Each span of `text` from an opening bracket to its match, in order, and whether it runs to
/// the end of the text without closing (the last one only).
fn bracketed_spans(text: &str) -> Vec<(&str, bool)> {
    let mut spans = Vec::new();
    let mut rest = text;
    while let Some(start) = rest.find(is_open) {
        let tail = &rest[start..];
        match span_end(tail) {
            Some(end) => {
                spans.push((&tail[..end], false));
                rest = &tail[end..];
            }
            None => {
                spans.push((tail, true));
                break;
            }
        }
    }
    spans
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
    }

    #[test]
    fn ambiguous_or_truncated_text_is_rejected() {
        for bad in [
            "no json here",
            r#"{"a": 1} and also {"b": 2}"#,
            r#"{"a": 12"#,
            r#"{"a": "unterminated"#,
            r#"{"a": 1,"#,
            r#"{"a": {"b": "c"}"#,
            "{True: 1}",
            "{\"a\": undefined}",
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
    fn python_literals_where_a_value_goes_are_read_as_json() {
        let r = repair_json("{'a': True, 'b': [False, None], 'c': 'True', \"d\": \"None\"}").unwrap();
        assert_eq!(r.value, json!({"a": true, "b": [false, null], "c": "True", "d": "None"}));
        assert!(r.fixes.contains(&Fix::PythonLiterals), "{:?}", r.fixes);
        // Strict JSON with the word in a string needs no fix.
        assert!(!repair_json(r#"{"a": "True"}"#).unwrap().fixes.contains(&Fix::PythonLiterals));
    }

    #[test]
    fn every_json_piece_of_a_text_is_listed() {
        let text =
            "Example: {\"nodes\": []}\n```json\n{'nodes': [1], 'ok': True}\n```\nand {broken: \"x\" y}";
        assert_eq!(
            json_pieces(text),
            vec![
                Piece::Value(json!({"nodes": [1], "ok": true})),
                Piece::Value(json!({"nodes": []})),
                Piece::Unparsed("{broken: \"x\" y}".into()),
            ]
        );
        assert_eq!(json_pieces("\"{\\\"a\\\": 1}\""), vec![Piece::Value(json!({"a": 1}))]);
        assert_eq!(json_pieces("no json"), vec![]);
        // An apostrophe in bracketed prose does not swallow the fenced value after it.
        let text = "For [the user's goal] here it is:\n```json\n{\"nodes\": [2]}\n```";
        assert_eq!(
            json_pieces(text),
            vec![
                Piece::Value(json!({"nodes": [2]})),
                Piece::Unparsed("[the user's goal] here it is:\n\n".into())
            ]
        );
    }

    #[test]
    fn quotes_inside_strings_are_kept() {
        assert_eq!(ok(r#"{"text": "他说“你好”", }"#), json!({"text": "他说“你好”"}));
        assert_eq!(ok(r#"{'q': 'say "hi"'}"#), json!({"q": "say \"hi\""}));
    }

    #[test]
    fn a_cut_off_answer_is_truncated_never_closed() {
        for cut in
            [r#"{"a": {"b": "c"}"#, r#"{"nodes": [{"id": "a"}, "#, r#"{"a": "x"#, "```json\n{\"a\": [1"]
        {
            assert!(
                matches!(repair_json(cut), Err(RepairError::Truncated(_))),
                "{cut:?}: {:?}",
                repair_json(cut)
            );
        }
        // A complete value inside a fence that never closed is not cut off.
        assert_eq!(ok("```json\n{\"a\": 1}\n"), json!({"a": 1}));
        // A complete value followed by a cut-off one: the cut part may have been the answer.
        let two = r#"{"a": 1} Correction: {"a": 2, "b": "#;
        assert!(matches!(repair_json(two), Err(RepairError::Truncated(_))), "{:?}", repair_json(two));
    }

    #[test]
    fn duplicate_keys_fold_when_equal_and_are_refused_when_not() {
        let same = repair_json(r#"{"op": "sum", "op": "sum", "n": 1}"#).unwrap();
        assert_eq!(same.value, json!({"op": "sum", "n": 1}));
        assert_eq!(same.fixes, vec![Fix::DuplicateKeysFolded]);
        assert_eq!(
            repair_json(r#"{"x": {"op": "sum", "op": "mean"}}"#),
            Err(RepairError::DuplicateKey("op".into()))
        );
        assert_eq!(repair_json("{op: 'sum', op: 'max',}"), Err(RepairError::DuplicateKey("op".into())));
    }

    #[test]
    fn the_one_wanted_value_is_found_amid_prose_and_reasoning() {
        let plan = |v: &Value| v.get("nodes").is_some();
        let text = "<think>I need {x} and maybe {\"nodes\": 0}?</think>Use {name} like {\"k\": 1}. Plan: {\"nodes\": []} (braces: {}).";
        let r = repair_json_where(text, plan).unwrap();
        assert_eq!(r.value, json!({"nodes": []}));
        assert!(
            r.fixes.contains(&Fix::ReasoningBlock) && r.fixes.contains(&Fix::SurroundingProse),
            "{:?}",
            r.fixes
        );
        let twice = r#"{"nodes": [1]} again: {"nodes": [1]}"#;
        assert_eq!(repair_json_where(twice, plan).unwrap().value, json!({"nodes": [1]}));
        let two = r#"{"nodes": [1]} or {"nodes": [2]}"#;
        assert!(matches!(repair_json_where(two, plan), Err(RepairError::Ambiguous(_))));
        assert_eq!(
            repair_json_where(r#"{"k": 1}"#, plan).unwrap().value,
            json!({"k": 1}),
            "a whole-text value is the caller's to judge"
        );
        assert_eq!(
            repair_json_where("just {words}", plan).unwrap_err(),
            RepairError::NoJson,
            "braces in prose are no attempt at JSON"
        );
        assert!(matches!(repair_json_where("{nodes: [x]}", plan), Err(RepairError::Unrepairable(_))));
        assert_eq!(
            repair_json_where("<think>{\"nodes\": []}", plan).unwrap_err(),
            RepairError::NoJson,
            "unfinished thinking holds no answer"
        );
    }

    #[test]
    fn a_double_encoded_value_is_decoded_only_when_the_string_is_not_wanted() {
        let encoded = serde_json::to_string(&json!({"nodes": []}).to_string()).unwrap();
        let r = repair_json_where(&encoded, |v| v.is_object()).unwrap();
        assert_eq!(r.value, json!({"nodes": []}));
        assert_eq!(r.fixes, vec![Fix::DoubleEncoded]);
        assert_eq!(repair_json(&encoded).unwrap().value, Value::String(json!({"nodes": []}).to_string()));
    }
}
