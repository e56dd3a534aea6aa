//! Input schemas of task types: compiled once, checked before a plan is accepted (with `$ref`
//! values tolerated, since they are resolved later) and again by the agent on resolved inputs.

use serde_json::Value;

use crate::json_ref;

/// A compiled JSON Schema for a task type's inputs.
pub struct InputSchema {
    raw: Value,
    validator: jsonschema::Validator,
}

impl std::fmt::Debug for InputSchema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("InputSchema").field("raw", &self.raw).finish()
    }
}

/// One way an input failed its schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaViolation {
    /// JSON pointer into the inputs, empty for the whole object.
    pub pointer: String,
    pub message: String,
}

impl std::fmt::Display for SchemaViolation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.pointer.is_empty() {
            write!(f, "{}", self.message)
        } else {
            write!(f, "{}: {}", self.pointer, self.message)
        }
    }
}

impl InputSchema {
    /// Compiles a schema; a schema that does not compile is `INVALID_ARGUMENT` on `schema`.
    pub fn compile(raw: Value) -> crate::Result<Self> {
        let validator = jsonschema::validator_for(&raw)
            .map_err(|e| crate::Error::InvalidArgument { field: "schema".into(), reason: e.to_string() })?;
        Ok(Self { raw, validator })
    }

    pub fn raw(&self) -> &Value {
        &self.raw
    }

    /// Checks fully resolved inputs.
    pub fn check(&self, instance: &Value) -> Vec<SchemaViolation> {
        self.violations(instance, false)
    }

    /// Checks inputs that may still hold `$ref` objects: a violation at or inside a reference is
    /// ignored, since the referenced value is only known at run time.
    pub fn check_with_refs(&self, instance: &Value) -> Vec<SchemaViolation> {
        self.violations(instance, true)
    }

    fn violations(&self, instance: &Value, tolerate_refs: bool) -> Vec<SchemaViolation> {
        let ref_pointers: Vec<String> = if tolerate_refs {
            json_ref::collect_refs(instance).into_iter().map(|(p, _)| p).collect()
        } else {
            Vec::new()
        };
        self.validator
            .iter_errors(instance)
            .filter_map(|error| {
                let pointer = error.instance_path().as_str().to_owned();
                let inside_ref =
                    ref_pointers.iter().any(|r| pointer == *r || pointer.starts_with(&format!("{r}/")));
                (!inside_ref).then(|| SchemaViolation { pointer, message: error.to_string() })
            })
            .collect()
    }
}

/// `schema` with every `$ref` replaced by what it points to and `$schema`/`$defs` dropped, so it
/// can be embedded inside another schema (a `$ref` like `#/$defs/Op` only resolves at the root).
/// Returns the schema unchanged when it cannot be dereferenced.
pub fn inline_refs(schema: &Value) -> Value {
    let mut value = jsonschema::dereference(schema).unwrap_or_else(|_| schema.clone());
    if let Value::Object(map) = &mut value {
        map.remove("$schema");
        map.remove("$defs");
        map.remove("definitions");
    }
    value
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn schema() -> InputSchema {
        InputSchema::compile(json!({
            "type": "object",
            "properties": {"expression": {"type": "string"}, "variables": {"type": "object", "additionalProperties": {"type": "number"}}},
            "required": ["expression"],
            "additionalProperties": false
        }))
        .unwrap()
    }

    #[test]
    fn inlined_refs_stand_alone() {
        let schema = json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"op": {"$ref": "#/$defs/Op"}},
            "$defs": {"Op": {"type": "string", "enum": ["sum", "count"]}}
        });
        let inlined = inline_refs(&schema);
        assert_eq!(inlined["properties"]["op"]["enum"], json!(["sum", "count"]));
        assert!(inlined.get("$defs").is_none() && inlined.get("$schema").is_none());
    }

    #[test]
    fn reports_the_failing_field() {
        let v = schema().check(&json!({"expression": 5}));
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].pointer, "/expression");
        assert!(schema().check(&json!({})).iter().any(|v| v.message.contains("expression")));
    }

    #[test]
    fn refs_are_tolerated_only_where_they_stand() {
        let s = schema();
        let with_ref = json!({"expression": "a+1", "variables": {"a": {"$ref": "n1.total"}}});
        assert!(s.check_with_refs(&with_ref).is_empty());
        assert!(!s.check(&with_ref).is_empty());
        let bad = json!({"expression": "a+1", "variables": {"a": {"$ref": "n1.total"}, "b": "x"}});
        assert_eq!(s.check_with_refs(&bad).len(), 1);
    }
}
