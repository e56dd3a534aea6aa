//! Redaction of secrets in JSON values before they leave the process in events, approvals or
//! logs: values under keys that name a secret, and strings that look like bearer credentials.

use serde_json::Value;

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[REDACTED]";

/// Key fragments that mark a secret (compared case-insensitively, ignoring `-` and `_`).
const SECRET_KEYS: [&str; 9] = [
    "apikey",
    "token",
    "password",
    "passwd",
    "secret",
    "authorization",
    "credential",
    "privatekey",
    "cookie",
];

fn is_secret_key(key: &str) -> bool {
    let folded: String =
        key.chars().filter(|c| !matches!(c, '-' | '_' | ' ')).flat_map(char::to_lowercase).collect();
    SECRET_KEYS.iter().any(|s| folded.contains(s))
}

fn looks_like_credential(text: &str) -> bool {
    let lower = text.trim_start().to_ascii_lowercase();
    lower.starts_with("bearer ") || lower.starts_with("basic ") || lower.starts_with("sk-")
}

/// `value` with every secret replaced by [`REDACTED`].
pub fn redact(value: &Value) -> Value {
    match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| {
                    let v = if is_secret_key(k) && !v.is_null() {
                        Value::String(REDACTED.into())
                    } else {
                        redact(v)
                    };
                    (k.clone(), v)
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(redact).collect()),
        Value::String(s) if looks_like_credential(s) => Value::String(REDACTED.into()),
        other => other.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn secrets_are_replaced_everywhere_and_the_rest_is_kept() {
        let v = json!({
            "url": "https://api.example.com",
            "api_key": "k-123",
            "headers": {"Authorization": "Bearer abc", "X-Trace": "t1"},
            "nested": [{"password": "hunter2"}, "Bearer xyz", "plain"],
            "accessToken": "tok",
        });
        let r = redact(&v);
        assert_eq!(r["url"], "https://api.example.com");
        assert_eq!(r["api_key"], REDACTED);
        assert_eq!(r["headers"]["Authorization"], REDACTED);
        assert_eq!(r["headers"]["X-Trace"], "t1");
        assert_eq!(r["nested"][0]["password"], REDACTED);
        assert_eq!(r["nested"][1], REDACTED);
        assert_eq!(r["nested"][2], "plain");
        assert_eq!(r["accessToken"], REDACTED);
        assert!(!r.to_string().contains("hunter2"));
    }
}
