//! `$ref` inputs: a value `{"$ref": "node_id.path.to.value"}` in a node's inputs stands for that
//! part of an earlier node's output. This module finds refs in a JSON value and resolves them.

use serde_json::Value;

/// The key that marks a reference object.
pub const REF_KEY: &str = "$ref";

/// A parsed reference: the node it points at and the path into that node's output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RefTarget {
    pub node_id: String,
    pub path: Vec<String>,
}

impl RefTarget {
    /// Parses `node_id` or `node_id.a.b.0`.
    pub fn parse(reference: &str) -> Option<RefTarget> {
        let mut segments = reference.split('.');
        let node_id = segments.next().filter(|s| !s.is_empty())?.to_owned();
        let path: Vec<String> = segments.map(str::to_owned).collect();
        if path.iter().any(String::is_empty) {
            return None;
        }
        Some(RefTarget { node_id, path })
    }
}

/// The reference string when `value` is exactly `{"$ref": "<string>"}`.
pub fn as_ref(value: &Value) -> Option<&str> {
    match value {
        Value::Object(map) if map.len() == 1 => map.get(REF_KEY)?.as_str(),
        _ => None,
    }
}

/// Visits `value` and everything inside it, depth first, with the JSON pointer of each (`""` for
/// `value` itself); `visit` returns `false` to skip a value's children.
pub fn visit(value: &Value, visit: &mut dyn FnMut(&str, &Value) -> bool) {
    fn walk(value: &Value, pointer: &mut String, visit: &mut dyn FnMut(&str, &Value) -> bool) {
        if !visit(pointer, value) {
            return;
        }
        let len = pointer.len();
        match value {
            Value::Object(map) => {
                for (key, child) in map {
                    pointer.push('/');
                    pointer.push_str(&key.replace('~', "~0").replace('/', "~1"));
                    walk(child, pointer, visit);
                    pointer.truncate(len);
                }
            }
            Value::Array(items) => {
                for (index, child) in items.iter().enumerate() {
                    pointer.push('/');
                    pointer.push_str(&index.to_string());
                    walk(child, pointer, visit);
                    pointer.truncate(len);
                }
            }
            _ => {}
        }
    }
    walk(value, &mut String::new(), visit);
}

/// Every reference in `value`, with the JSON pointer where it sits.
pub fn collect_refs(value: &Value) -> Vec<(String, String)> {
    let mut out = Vec::new();
    visit(value, &mut |pointer, value| match as_ref(value) {
        Some(reference) => {
            out.push((pointer.to_owned(), reference.to_owned()));
            false
        }
        None => true,
    });
    out
}

/// Follows `path` into `value`: object keys by name, array elements by index.
pub fn lookup<'a>(value: &'a Value, path: &[String]) -> Option<&'a Value> {
    path.iter().try_fold(value, |current, segment| match current {
        Value::Object(map) => map.get(segment),
        Value::Array(items) => segment.parse::<usize>().ok().and_then(|i| items.get(i)),
        _ => None,
    })
}

/// Replaces each reference for which `replace` returns a value, leaving the others in place.
pub fn map_refs(value: &Value, replace: &dyn Fn(&RefTarget) -> Option<Value>) -> Value {
    if let Some(target) = as_ref(value).and_then(RefTarget::parse)
        && let Some(replacement) = replace(&target)
    {
        return replacement;
    }
    match value {
        Value::Object(map) => {
            Value::Object(map.iter().map(|(k, v)| (k.clone(), map_refs(v, replace))).collect())
        }
        Value::Array(items) => Value::Array(items.iter().map(|v| map_refs(v, replace)).collect()),
        other => other.clone(),
    }
}

/// Why a `$ref` does not resolve. Every case is the caller's input: `INVALID_ARGUMENT`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefError {
    #[error("malformed $ref `{reference}`")]
    Malformed { reference: String },
    #[error("$ref `{reference}`: node `{node}` has no output")]
    NoOutput { reference: String, node: String },
    #[error("$ref `{reference}`: path not found in the output of `{node}`")]
    PathNotFound { reference: String, node: String },
}

impl RefError {
    pub fn code(&self) -> crate::ErrorCode {
        crate::ErrorCode::InvalidArgument
    }

    pub fn retryable(&self) -> bool {
        self.code().retryable()
    }
}

/// Replaces every reference in `value` using `output_of(node_id)`. Fails with the first
/// reference that cannot be resolved.
pub fn resolve(value: &Value, output_of: &dyn Fn(&str) -> Option<Value>) -> Result<Value, RefError> {
    if let Some(reference) = as_ref(value) {
        let target = RefTarget::parse(reference)
            .ok_or_else(|| RefError::Malformed { reference: reference.to_owned() })?;
        let output = output_of(&target.node_id).ok_or_else(|| RefError::NoOutput {
            reference: reference.to_owned(),
            node: target.node_id.clone(),
        })?;
        return lookup(&output, &target.path).cloned().ok_or_else(|| RefError::PathNotFound {
            reference: reference.to_owned(),
            node: target.node_id.clone(),
        });
    }
    Ok(match value {
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| Ok((k.clone(), resolve(v, output_of)?)))
                .collect::<Result<_, RefError>>()?,
        ),
        Value::Array(items) => {
            Value::Array(items.iter().map(|v| resolve(v, output_of)).collect::<Result<_, _>>()?)
        }
        other => other.clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn finds_refs_with_their_pointers() {
        let v = json!({"a": {"$ref": "n1.total"}, "vars": {"x": {"$ref": "n2"}}, "list": [{"$ref": "n3.0"}]});
        let mut refs = collect_refs(&v);
        refs.sort();
        assert_eq!(
            refs,
            vec![
                ("/a".to_owned(), "n1.total".to_owned()),
                ("/list/0".to_owned(), "n3.0".to_owned()),
                ("/vars/x".to_owned(), "n2".to_owned()),
            ]
        );
    }

    #[test]
    fn resolves_paths_into_outputs() {
        let outputs = json!({"n1": {"total": 42, "groups": [{"key": "toys"}]}});
        let lookup_output = |id: &str| outputs.get(id).cloned();
        let v =
            json!({"a": {"$ref": "n1.total"}, "b": {"$ref": "n1.groups.0.key"}, "c": [1, {"$ref": "n1"}]});
        let resolved = resolve(&v, &lookup_output).unwrap();
        assert_eq!(
            resolved,
            json!({"a": 42, "b": "toys", "c": [1, {"total": 42, "groups": [{"key": "toys"}]}]})
        );
        let err = resolve(&json!({"$ref": "n1.missing"}), &lookup_output).unwrap_err();
        assert!(matches!(err, RefError::PathNotFound { .. }), "{err}");
        assert!(err.to_string().contains("path not found"), "{err}");
    }

    #[test]
    fn an_object_with_other_keys_is_not_a_ref() {
        assert_eq!(as_ref(&json!({"$ref": "a", "x": 1})), None);
        assert_eq!(as_ref(&json!({"$ref": 1})), None);
        assert_eq!(RefTarget::parse("a..b"), None);
        assert_eq!(RefTarget::parse(""), None);
    }
}
