//! Redaction of secrets before anything leaves the process in events, approvals, logs or
//! exported spans: values under keys that name a secret (`api_key`, `token`, `password`,
//! `authorization`, ...), bearer credentials and `sk-` keys, and `key=value` / `key: value`
//! pairs inside free text whose key names a secret.
//!
//! The goal's own data is kept whole where it is stored (the goal state, artifacts): it is what
//! the user asked for. It is redacted where it is copied out for observation, and where a
//! principal without the `secrets` role reads it ([`goal_state`], [`artifact`]). A wire message
//! is always redacted whole, every string it holds, by [`message`].

use std::borrow::Cow;

use hermes_proto::Event;
use serde_json::Value;

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Key fragments that mark a secret (compared case-insensitively, ignoring `-`, `_` and spaces).
const SECRET_KEYS: [&str; 10] = [
    "apikey",
    "token",
    "password",
    "passwd",
    "secret",
    "authorization",
    "credential",
    "privatekey",
    "cookie",
    "bearer",
];

/// Whether a key or field name names a secret. Counts of tokens (`input_tokens`,
/// `max_tokens`) are not secrets.
pub fn is_secret_key(key: &str) -> bool {
    // This runs for every field of every redacted message, so a short ASCII key (nearly all of
    // them) is folded on the stack; only another one allocates.
    let mut buf = [0u8; 64];
    if key.is_ascii() && key.len() <= buf.len() {
        let mut len = 0;
        for b in key.bytes().filter(|b| !matches!(b, b'-' | b'_' | b' ' | b'.')) {
            buf[len] = b.to_ascii_lowercase();
            len += 1;
        }
        return names_secret(std::str::from_utf8(&buf[..len]).unwrap_or_default());
    }
    let folded: String =
        key.chars().filter(|c| !matches!(c, '-' | '_' | ' ' | '.')).flat_map(char::to_lowercase).collect();
    names_secret(&folded)
}

/// [`is_secret_key`] of a key already folded (lower case, no separators).
fn names_secret(folded: &str) -> bool {
    !folded.ends_with("tokens") && SECRET_KEYS.iter().any(|s| folded.contains(s))
}

/// Where `needle` (ASCII, lower case) next occurs in `text` at or after byte `from`, ignoring
/// ASCII case. An ASCII match lies on character boundaries.
fn find_ignoring_case(text: &str, from: usize, needle: &str) -> Option<usize> {
    let (text, needle) = (text.as_bytes(), needle.as_bytes());
    text.get(from..)?
        .windows(needle.len())
        .position(|window| window.eq_ignore_ascii_case(needle))
        .map(|at| from + at)
}

fn is_word_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')
}

/// Characters a credential is made of, once its start is found.
fn is_credential_char(c: char) -> bool {
    !(c.is_whitespace() || matches!(c, '"' | '\'' | ',' | ';' | '}' | ']' | ')' | '&' | '<' | '>' | '`'))
}

/// Where the secret following a `key[:=]` at `after_key` starts, when the key is followed by an
/// assignment (optionally quoted, as in JSON text: `"api_key": "..."`).
fn assignment_value_start(text: &str, after_key: usize) -> Option<usize> {
    let rest = &text[after_key..];
    let mut chars = rest.char_indices().peekable();
    // A closing quote of a quoted key.
    if let Some((_, '"' | '\'')) = chars.peek() {
        chars.next();
    }
    while let Some((_, c)) = chars.peek() {
        if *c == ' ' || *c == '\t' {
            chars.next();
        } else {
            break;
        }
    }
    match chars.next() {
        Some((_, ':' | '=')) => {}
        _ => return None,
    }
    while let Some((_, c)) = chars.peek() {
        if matches!(c, ' ' | '\t' | '"' | '\'') {
            chars.next();
        } else {
            break;
        }
    }
    chars.peek().map(|(i, _)| after_key + i)
}

/// The end of the credential that starts at `start`: one token, or two when the first is an
/// authentication scheme (`Bearer abc`).
fn credential_end(text: &str, start: usize) -> usize {
    let token_end = |from: usize| {
        text[from..]
            .char_indices()
            .find(|(_, c)| !is_credential_char(*c))
            .map(|(i, _)| from + i)
            .unwrap_or(text.len())
    };
    let end = token_end(start);
    let scheme = text[start..end].to_ascii_lowercase();
    if matches!(scheme.as_str(), "bearer" | "basic" | "token") && text[end..].starts_with(' ') {
        let next = end + 1;
        if next < text.len() && text[next..].starts_with(is_credential_char) {
            return token_end(next);
        }
    }
    end
}

/// Where a value that starts at `start` ends, reading through the wrappers of a `Debug` output
/// (`Some("...")`, `Password("...")`, `Some(Password("..."))`) to the credential inside, so that
/// `password: Some("hunter2")` loses the password and not only the word `Some`.
fn debug_value_end(text: &str, start: usize) -> usize {
    let end = credential_end(text, start);
    // `(` is a credential character, so the wrappers come first: `Some(Password(`.
    let word = &text[start..end];
    let wrapped = word.ends_with('(')
        && word.split('(').filter(|w| !w.is_empty()).all(|w| w.starts_with(|c: char| c.is_ascii_uppercase()));
    if !wrapped {
        return end;
    }
    let inner = end + text[end..].chars().take_while(|c| matches!(c, '"' | '\'')).count();
    credential_end(text, inner).max(end)
}

/// `text` with the secrets it contains replaced by [`REDACTED`]; borrowed when there are none.
pub fn redact_text(text: &str) -> Cow<'_, str> {
    let mut spans: Vec<(usize, usize)> = Vec::new();
    // `Bearer <credential>` anywhere.
    let mut from = 0;
    while let Some(found) = find_ignoring_case(text, from, "bearer ") {
        let start = found + "bearer ".len();
        let end = credential_end(text, start);
        if end > start && !text[start..].starts_with(REDACTED) {
            spans.push((start, end));
        }
        from = start;
    }
    // `sk-...` keys as whole words.
    let mut from = 0;
    while let Some(found) = find_ignoring_case(text, from, "sk-") {
        let start = found;
        let boundary = text[..start].chars().next_back().is_none_or(|c| !is_word_char(c));
        let end = credential_end(text, start);
        if boundary && end - start >= 8 {
            spans.push((start, end));
        }
        from = start + 3;
    }
    // `secret_key = value` and `"password": "value"`.
    let mut word_start = None;
    for (i, c) in text.char_indices().chain(std::iter::once((text.len(), ' '))) {
        match (word_start, is_word_char(c) && i < text.len()) {
            (None, true) => word_start = Some(i),
            (Some(start), false) => {
                word_start = None;
                // The assignment first: it is the cheaper test, and most words have none.
                if let Some(value) = assignment_value_start(text, i)
                    && is_secret_key(&text[start..i])
                {
                    let end = debug_value_end(text, value);
                    if end > value && !text[value..].starts_with(REDACTED) {
                        spans.push((value, end));
                    }
                }
            }
            _ => {}
        }
    }
    if spans.is_empty() {
        return Cow::Borrowed(text);
    }
    spans.sort_unstable();
    let mut out = String::with_capacity(text.len());
    let mut at = 0;
    for (start, end) in spans {
        if end <= at {
            continue;
        }
        let start = start.max(at);
        out.push_str(&text[at..start]);
        out.push_str(REDACTED);
        at = end;
    }
    out.push_str(&text[at..]);
    Cow::Owned(out)
}

/// `value` with every secret replaced by [`REDACTED`].
pub fn redact(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = match v {
                        Value::Null | Value::Bool(_) | Value::Number(_) => v.clone(),
                        _ if is_secret_key(k) => Value::String(REDACTED.into()),
                        _ => redact(v),
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        Value::String(s) => match redact_text(s) {
            Cow::Borrowed(_) => value.clone(),
            Cow::Owned(redacted) => Value::String(redacted),
        },
        other => other.clone(),
    }
}

/// Whether [`redact`] would change anything in `value`.
fn needs_redaction(value: &Value) -> bool {
    match value {
        Value::Object(map) => map.iter().any(|(k, v)| match v {
            Value::Null | Value::Bool(_) | Value::Number(_) => false,
            _ => is_secret_key(k) || needs_redaction(v),
        }),
        Value::Array(items) => items.iter().any(needs_redaction),
        Value::String(s) => matches!(redact_text(s), Cow::Owned(_)),
        Value::Null | Value::Bool(_) | Value::Number(_) => false,
    }
}

/// JSON text with its secrets redacted; text that is not JSON is redacted as free text.
pub fn redact_json_text(text: &str) -> String {
    redact_inputs(text, &[])
}

/// A node's inputs (JSON text) with its secrets redacted: the values of the top-level keys in
/// `marked` (the node's `secret_inputs`), and everything [`redact`] finds.
pub fn redact_inputs(text: &str, marked: &[String]) -> String {
    match serde_json::from_str::<Value>(text) {
        // Nothing to redact: the text as it came, without building a copy to print.
        Ok(value) if !needs_redaction(&value) && marked.iter().all(|key| value.get(key).is_none()) => {
            text.to_owned()
        }
        Ok(value) => redact_marked(&value, marked).to_string(),
        Err(_) => redact_text(text).into_owned(),
    }
}

/// [`redact`], and the values of `value`'s top-level keys in `marked` replaced too.
fn redact_marked(value: &Value, marked: &[String]) -> Value {
    let mut redacted = redact(value);
    if let Value::Object(map) = &mut redacted {
        for key in marked {
            if let Some(v) = map.get_mut(key) {
                *v = Value::String(REDACTED.to_owned());
            }
        }
    }
    redacted
}

/// The visitor that applies the rules to a message's strings: a string field whose name names a
/// secret is replaced whole; a `*_json` field is redacted as JSON, its message's
/// `secret_inputs` too; a map value is replaced whole when its key names a secret; every other
/// string (ids, texts, labels, keys of maps) is redacted as free text.
struct Rules;

fn redact_in_place(value: &mut String) {
    if let Cow::Owned(redacted) = redact_text(value) {
        *value = redacted;
    }
}

impl hermes_proto::StringVisitor for Rules {
    fn field(&mut self, field: &str, value: &mut String) {
        if value.is_empty() {
            return;
        }
        if is_secret_key(field) {
            *value = REDACTED.to_owned();
        } else {
            redact_in_place(value);
        }
    }

    fn json(&mut self, _field: &str, value: &mut String, marked: &[String]) {
        if !value.is_empty() {
            *value = redact_inputs(value, marked);
        }
    }

    fn element(&mut self, _field: &str, value: &mut String) {
        redact_in_place(value);
    }

    fn entry(&mut self, _field: &str, key: &mut String, value: &mut String) {
        if is_secret_key(key) && !value.is_empty() {
            *value = REDACTED.to_owned();
        } else {
            redact_in_place(value);
        }
        redact_in_place(key);
    }
}

/// A copy of `message` with the secrets of every string it holds redacted: the one function
/// behind every redacted copy of a wire message (events, goal views, dead letters). It walks
/// the whole message through its generated [`hermes_proto::VisitStrings`], so a field a client
/// can set (labels, session ids, idempotency keys, texts, metadata) cannot escape by being left
/// off a list.
pub fn message<M: hermes_proto::VisitStrings + Clone>(message: &M) -> M {
    let mut copy = message.clone();
    in_place(&mut copy);
    copy
}

/// [`message`] without the copy: the secrets of every string `message` holds redacted where they
/// are, for a message that is being published and not kept.
pub fn in_place<M: hermes_proto::VisitStrings>(message: &mut M) {
    message.visit_strings(&mut Rules);
}

/// A goal's state as a principal without the right to see secrets may read it ([`message`]:
/// plan inputs marked `secret_inputs` and by the rules, outputs, errors, text, labels).
pub fn goal_state(state: &hermes_proto::GoalState) -> hermes_proto::GoalState {
    message(state)
}

/// A goal's artifact as a principal without the right to see secrets may read it, as
/// [`goal_state`] shows the outputs it stands in for: JSON with its secrets redacted, and the
/// values of its top-level keys in `marked` (the goal's `secret_inputs`: the dispatcher stores a
/// node's large inputs whole as an artifact); other text redacted as free text. Bytes that are
/// not UTF-8 are returned as they are, as are artifacts in which nothing is redacted.
pub fn artifact(bytes: Vec<u8>, marked: &[String]) -> Vec<u8> {
    let Ok(text) = std::str::from_utf8(&bytes) else {
        return bytes;
    };
    let redacted = match serde_json::from_str::<Value>(text) {
        Ok(value) => {
            let redacted = redact_marked(&value, marked);
            if redacted == value {
                return bytes;
            }
            redacted.to_string()
        }
        Err(_) => match redact_text(text) {
            Cow::Borrowed(_) => return bytes,
            Cow::Owned(redacted) => redacted,
        },
    };
    redacted.into_bytes()
}

/// A task as a dead letter shows it ([`message`]: its inputs, its `secret_inputs` too, and its
/// result token).
pub fn task(task: &hermes_proto::TaskMessage) -> hermes_proto::TaskMessage {
    message(task)
}

/// A copy of `event` fit to publish ([`message`]: every string it holds). Events are for
/// watching a goal, and are redacted for everyone; the goal's data itself stays whole in its
/// state.
pub fn event(event: &Event) -> Event {
    message(event)
}

/// A plan request as a dead letter shows it ([`message`]).
pub fn plan_request(request: &hermes_proto::PlanRequest) -> hermes_proto::PlanRequest {
    message(request)
}

/// A task result as a dead letter shows it ([`message`]: its output, error and token).
pub fn task_result(result: &hermes_proto::TaskResult) -> hermes_proto::TaskResult {
    message(result)
}

/// A plan result as a dead letter shows it ([`message`]).
pub fn plan_result(result: &hermes_proto::PlanResult) -> hermes_proto::PlanResult {
    message(result)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hermes_proto::event::Kind;
    use serde_json::json;

    #[test]
    fn secrets_are_replaced_everywhere_and_the_rest_is_kept() {
        let v = json!({
            "url": "https://api.example.com",
            "api_key": "k-123",
            "headers": {"Authorization": "Bearer abc", "X-Trace": "t1"},
            "nested": [{"password": "hunter2"}, "Bearer xyz", "plain"],
            "accessToken": "tok",
            "max_tokens": 100,
            "input_tokens": "12",
        });
        let r = redact(&v);
        assert_eq!(r["url"], "https://api.example.com");
        assert_eq!(r["api_key"], REDACTED);
        assert_eq!(r["headers"]["Authorization"], REDACTED);
        assert_eq!(r["headers"]["X-Trace"], "t1");
        assert_eq!(r["nested"][0]["password"], REDACTED);
        assert_eq!(r["nested"][1], format!("Bearer {REDACTED}"));
        assert_eq!(r["nested"][2], "plain");
        assert_eq!(r["accessToken"], REDACTED);
        assert_eq!(r["max_tokens"], 100);
        assert_eq!(r["input_tokens"], "12");
        assert!(!r.to_string().contains("hunter2"));
    }

    /// A dependency's `Debug` output of a URL or config, as its debug logs write it: the value
    /// inside `Some(...)` wrappers goes, not only the wrapper's name.
    #[test]
    fn debug_output_loses_the_value_inside_its_wrappers() {
        for (text, secret) in [
            (
                r#"Url { username: "hermes", password: Some("hunter2x"), host: Some(Domain("h")) }"#,
                "hunter2x",
            ),
            (r#"ServerAddr { password: Some(Password("hunter2x")), port: 4222 }"#, "hunter2x"),
            (r#"Options { token: Some(Token(hunter2x)), name: "n" }"#, "hunter2x"),
            ("password: hunter2x", "hunter2x"),
        ] {
            let redacted = redact_text(text);
            assert!(!redacted.contains(secret) && redacted.contains(REDACTED), "{text} -> {redacted}");
        }
        // The fields after a wrapped value are kept.
        let kept = redact_text(r#"Url { password: Some("hunter2x"), host: Some(Domain("h")) }"#);
        assert!(kept.contains(r#"host: Some(Domain("h"))"#), "{kept}");
    }

    #[test]
    fn artifacts_are_redacted_as_json_or_text_and_left_whole_when_clean() {
        let marked = vec!["body".to_owned()];
        let json = br#"{"body": "plain words", "api_key": "k-1", "n": 3}"#.to_vec();
        let redacted: Value = serde_json::from_slice(&artifact(json, &marked)).unwrap();
        assert_eq!(redacted, json!({"body": REDACTED, "api_key": REDACTED, "n": 3}));
        let text = b"line one\npassword: hunter2\n".to_vec();
        let redacted = String::from_utf8(artifact(text, &[])).unwrap();
        assert!(!redacted.contains("hunter2") && redacted.contains(REDACTED), "{redacted}");
        // Nothing to redact: the very bytes, formatting kept.
        let clean = b"{ \"text\" :  \"nothing here\" }".to_vec();
        assert_eq!(artifact(clean.clone(), &[]), clean);
        let binary = vec![0xff, 0xfe, b'p', b'a', b's', b's'];
        assert_eq!(artifact(binary.clone(), &marked), binary);
    }

    #[test]
    fn clean_inputs_come_back_as_they_were_written() {
        // Nothing to redact: the same text, spacing and key order kept.
        let clean = r#"{ "b": 1,  "a": ["x", {"n": "ok"}] }"#;
        assert_eq!(redact_inputs(clean, &[]), clean);
        // A secret anywhere, under an escaped key, or marked: redacted as before.
        assert_eq!(redact_inputs(r#"{"a": {"password": "p"}}"#, &[]), r#"{"a":{"password":"[REDACTED]"}}"#);
        assert_eq!(redact_inputs(r#"{"pass\u0077ord": "p"}"#, &[]), r#"{"password":"[REDACTED]"}"#);
        assert_eq!(redact_inputs(r#"{"q": "Bearer\u0020abcdefgh"}"#, &[]), r#"{"q":"Bearer [REDACTED]"}"#);
        assert_eq!(redact_inputs(r#"{"q": "x"}"#, &["q".to_owned()]), r#"{"q":"[REDACTED]"}"#);
    }

    #[test]
    fn keys_are_folded_alike_however_they_are_written() {
        for key in ["API_KEY", "x-Api-Key", "session.token", "Authorization", "pass word"] {
            assert!(is_secret_key(key), "{key}");
        }
        for key in ["input_tokens", "max_tokens", "node_id", "", "-_ ."] {
            assert!(!is_secret_key(key), "{key}");
        }
        // Keys past the stack buffer, and keys with other than ASCII, take the allocating road.
        assert!(is_secret_key(&format!("{}_token", "x".repeat(100))));
        assert!(!is_secret_key(&"x".repeat(100)));
        assert!(is_secret_key("clé_API-Key"));
        assert!(is_secret_key("PASSWORD_ÜBER"));
        assert!(!is_secret_key("größe"));
    }

    #[test]
    fn secrets_inside_free_text_are_found() {
        let cases = [
            ("config: api_key=s3cr3t-value and more", "s3cr3t-value"),
            ("password: hunter2", "hunter2"),
            (r#"{"client_secret": "abc123"}"#, "abc123"),
            ("curl -H 'Authorization: Bearer eyJhbGciOi.xyz' https://x", "eyJhbGciOi.xyz"),
            ("the key is sk-live-0123456789abcdef, use it", "sk-live-0123456789abcdef"),
            ("TOKEN = 'tkn_999'", "tkn_999"),
        ];
        for (text, secret) in cases {
            let redacted = redact_text(text);
            assert!(!redacted.contains(secret), "{text} -> {redacted}");
            assert!(redacted.contains(REDACTED), "{text} -> {redacted}");
        }
        for plain in ["used 120 tokens in total", "a basic plan", "risk-free", "max_tokens: 512", ""] {
            assert_eq!(redact_text(plain), plain);
        }
        // Redacting twice changes nothing.
        let once = redact_text("api_key=abc, Authorization: Bearer xyz").into_owned();
        assert_eq!(redact_text(&once), once);
    }

    #[test]
    fn events_are_redacted_where_they_carry_data() {
        let event = Event {
            seq: 0,
            session_id: String::new(),
            goal_id: "g".into(),
            at_unix_ms: 1,
            kind: Some(Kind::TaskSucceeded(hermes_proto::TaskSucceeded {
                output_json: r#"{"text": "login with password=opensesame", "token": "t-1"}"#.into(),
                ..Default::default()
            })),
            ..Default::default()
        };
        let text = format!("{:?}", super::event(&event));
        assert!(!text.contains("opensesame") && !text.contains("t-1"), "{text}");
    }

    #[test]
    fn every_string_of_a_message_is_redacted_labels_and_ids_too() {
        let key = "sk-live-0123456789abcdef";
        let accepted = Event {
            goal_id: "g".into(),
            session_id: key.into(),
            kind: Some(Kind::GoalAccepted(hermes_proto::GoalAccepted {
                session_id: key.into(),
                idempotency_key: format!("retry {key}"),
                text: format!("use password={key}"),
                labels: [
                    ("api_key".to_owned(), "plain-looking".to_owned()),
                    ("team".to_owned(), key.to_owned()),
                    (key.to_owned(), "x".to_owned()),
                ]
                .into(),
                plan_nodes: 1,
            })),
            ..Default::default()
        };
        let redacted = super::event(&accepted);
        let text = format!("{redacted:?}");
        assert!(!text.contains(key) && !text.contains("plain-looking"), "{text}");
        let Some(Kind::GoalAccepted(a)) = &redacted.kind else { panic!("{text}") };
        assert_eq!(a.labels.get("api_key").map(String::as_str), Some(REDACTED));
        assert_eq!(a.labels.get("team").map(String::as_str), Some(REDACTED));
        assert_eq!(redacted.goal_id, "g");
        // Plan inputs: by the rules and by the node's `secret_inputs`.
        let plan = hermes_proto::TaskPlan {
            nodes: vec![hermes_proto::TaskNode {
                id: "n".into(),
                task_type: "http.fetch".into(),
                inputs_json: r#"{"url": "https://x", "body": "plain"}"#.into(),
                secret_inputs: vec!["body".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let state = hermes_proto::GoalState { plan: Some(plan), ..Default::default() };
        let view = goal_state(&state);
        let node = &view.plan.as_ref().unwrap().nodes[0];
        assert!(!node.inputs_json.contains("plain") && node.inputs_json.contains("https://x"), "{node:?}");
        assert_eq!(node.secret_inputs, vec!["body".to_owned()], "the names of the marked keys are kept");
        // Nothing secret: the message is unchanged.
        let clean = Event { goal_id: "g-1".into(), session_id: "s-1".into(), ..Default::default() };
        assert_eq!(super::event(&clean), clean);
    }
}
