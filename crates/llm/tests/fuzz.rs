//! Bounded property-based fuzzing of the model-output hardening:
//!
//! * `repair_json` never panics: arbitrary text (every `char`), JSON-ish token soup with
//!   comments, fences, full-width punctuation and separators, truncated JSON, and brackets nested
//!   a few thousand deep;
//! * `repair_json` of strict JSON (what serde_json writes, compact or pretty, padded with
//!   whitespace) is exactly what serde_json reads, with no fix applied;
//! * `parse_react` (which repairs its `Action Input`) never panics either.
//!
//! Each property runs `HERMES_FUZZ_CASES` cases (default 256, what `make test` runs; `make fuzz`
//! runs 20000). Failures are not persisted to a file: proptest prints the shrunk input, and a
//! crash it finds must be added as a plain regression `#[test]` next to the code it broke.

use hermes_llm::react::parse_react;
use hermes_llm::repair::repair_json;
use hermes_test_util::fuzz::{any_text, config, token_text};
use proptest::prelude::*;
use serde_json::{Map, Value};

/// What the repairer reacts to, and what it must refuse.
const JSON_TOKENS: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ":",
    ",",
    "\"",
    "'",
    "\\",
    "\\\"",
    "\\u00e9",
    "\\ud83d",
    "\\u",
    "a",
    "key",
    "_k$",
    "true",
    "false",
    "null",
    "True",
    "None",
    "NaN",
    "Infinity",
    "0",
    "1",
    "12",
    "-",
    "1,234",
    ",234",
    ".5",
    "e",
    "E+",
    "1e999",
    "-0",
    " ",
    "\n",
    "\t",
    "\r",
    "//",
    "/*",
    "*/",
    "```",
    "```json\n",
    "｛",
    "｝",
    "［",
    "］",
    "，",
    "：",
    "“",
    "”",
    "\u{feff}",
    "Here is the JSON: ",
    "Hope it helps.",
    "é",
    "🦀",
];

/// The ReAct labels, their separators and some text to put after them.
const REACT_TOKENS: &[&str] = &[
    "Thought:",
    "Action:",
    "Action Input:",
    "Final Answer:",
    "thought：",
    "ACTION：",
    "final answer:",
    "\n",
    "\r\n",
    " ",
    "  ",
    "`",
    "table.aggregate",
    "{\"a\": 1}",
    "{a: 'x',}",
    "```json\n",
    "```",
    "{",
    "}",
    "é",
    // Letters whose lowercase form is longer or shorter in UTF-8 than they are.
    "İ",
    "Ⱥ",
    "Ⱦ",
    "K",
    "Ω",
    "Å",
    "ẞ",
];

/// Brackets (and quotes) nested up to a few thousand deep, closed or not.
fn deep_nesting() -> BoxedStrategy<String> {
    const OPENERS: &[&str] = &["[", "{", "{\"a\":", "{a:", "［", "｛", "[{", "\"", "'", "```\n["];
    (
        prop::sample::select(OPENERS),
        1usize..4000,
        any::<bool>(),
        prop_oneof![Just(""), Just("1"), Just("\"x\"")],
    )
        .prop_map(|(open, depth, closed, inner)| {
            let mut text = open.repeat(depth);
            text.push_str(inner);
            if closed {
                let close = if open.ends_with('[') || open == "［" { "]" } else { "}" };
                text.push_str(&close.repeat(depth));
            }
            text
        })
        .boxed()
}

/// JSON values of bounded depth and size, any text in keys and strings.
fn json_value() -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        (-1.0e300f64..1.0e300f64).prop_map(Value::from),
        any_text(12).prop_map(Value::String),
        token_text(JSON_TOKENS, 6).prop_map(Value::String),
    ];
    leaf.prop_recursive(5, 64, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
            prop::collection::vec((prop_oneof![any_text(6), token_text(JSON_TOKENS, 3)], inner), 0..6)
                .prop_map(|entries| Value::Object(entries.into_iter().collect::<Map<String, Value>>())),
        ]
    })
    .boxed()
}

/// Strict JSON text: compact or pretty.
fn json_text() -> BoxedStrategy<String> {
    (json_value(), any::<bool>())
        .prop_map(|(value, pretty)| {
            let text =
                if pretty { serde_json::to_string_pretty(&value) } else { serde_json::to_string(&value) };
            text.expect("a Value always serializes")
        })
        .boxed()
}

/// `text` cut after `at` of its chars.
fn truncated(text: &str, at: prop::sample::Index) -> String {
    let count = text.chars().count();
    text.chars().take(at.index(count + 1)).collect()
}

const PADDING: &[&str] = &["", " ", "\n", "\t \r\n"];

proptest! {
    #![proptest_config(config())]

    #[test]
    fn repair_never_panics_on_any_text(
        text in prop_oneof![any_text(200), token_text(JSON_TOKENS, 64), deep_nesting()],
    ) {
        if let Ok(repaired) = repair_json(&text) {
            prop_assert!(serde_json::to_string(&repaired.value).is_ok());
        }
    }

    #[test]
    fn repair_never_panics_on_truncated_or_wrapped_json(
        text in json_text(),
        at in any::<prop::sample::Index>(),
        before in token_text(JSON_TOKENS, 4),
        after in token_text(JSON_TOKENS, 4),
    ) {
        let cut = truncated(&text, at);
        let _ = repair_json(&cut);
        let _ = repair_json(&format!("{before}{cut}"));
        let _ = repair_json(&format!("{before}{text}{after}"));
        let _ = repair_json(&format!("```json\n{cut}"));
        let _ = repair_json(&format!("```json\n{text}\n```{after}"));
    }

    #[test]
    fn strict_json_is_returned_as_serde_json_reads_it(
        text in json_text(),
        pad in prop::sample::select(PADDING),
    ) {
        let expected: Value = serde_json::from_str(&text).expect("serde_json reads what it wrote");
        let repaired = repair_json(&format!("{pad}{text}{pad}"))
            .map_err(|e| TestCaseError::fail(format!("strict JSON was rejected: {e}")))?;
        prop_assert_eq!(&repaired.value, &expected);
        prop_assert!(repaired.fixes.is_empty(), "strict JSON needed fixes: {:?}", repaired.fixes);
    }

    #[test]
    fn react_parsing_never_panics(
        text in prop_oneof![token_text(REACT_TOKENS, 24), any_text(120)],
        input in prop_oneof![json_text(), token_text(JSON_TOKENS, 16)],
    ) {
        let _ = parse_react(&text);
        let _ = parse_react(&format!("{text}\nAction: t.x\nAction Input: {input}"));
    }
}
