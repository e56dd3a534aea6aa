//! Finite bounds for JSON Schemas used in constrained decoding. A grammar from an unbounded
//! schema (a free-form object, a string or array without a maximum) lets a small model go on
//! forever, and the "always parses" guarantee only holds for output that ends. This adds maxima
//! where none are given and turns free-form objects into flat maps of scalars.

use serde_json::{Map, Value, json};

/// Limits applied where a schema sets none.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub max_string: u64,
    pub max_items: u64,
    pub max_properties: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Self { max_string: 80, max_items: 8, max_properties: 8 }
    }
}

/// Returns `schema` with bounds added everywhere it lacks them.
pub fn bound_schema(schema: &Value, bounds: Bounds) -> Value {
    match schema {
        Value::Object(map) => Value::Object(bound_object(map, bounds)),
        Value::Bool(true) => scalar(bounds),
        other => other.clone(),
    }
}

fn scalar(bounds: Bounds) -> Value {
    json!({"anyOf": [{"type": "string", "maxLength": bounds.max_string}, {"type": "number"}, {"type": "boolean"}]})
}

fn bound_object(map: &Map<String, Value>, bounds: Bounds) -> Map<String, Value> {
    let mut out = Map::new();
    for (key, value) in map {
        let bounded = match key.as_str() {
            "properties" | "$defs" | "definitions" => match value {
                Value::Object(props) => {
                    Value::Object(props.iter().map(|(k, v)| (k.clone(), bound_schema(v, bounds))).collect())
                }
                other => other.clone(),
            },
            "items" | "additionalProperties" | "not" => bound_schema(value, bounds),
            "anyOf" | "oneOf" | "allOf" | "prefixItems" => match value {
                Value::Array(list) => Value::Array(list.iter().map(|v| bound_schema(v, bounds)).collect()),
                other => other.clone(),
            },
            _ => value.clone(),
        };
        out.insert(key.clone(), bounded);
    }
    let types: Vec<&str> = match map.get("type") {
        Some(Value::String(t)) => vec![t.as_str()],
        Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
        _ => Vec::new(),
    };
    let constrained = map.contains_key("enum") || map.contains_key("const") || map.contains_key("pattern");
    if types.contains(&"string") && !constrained && !map.contains_key("maxLength") {
        out.insert("maxLength".into(), json!(bounds.max_string));
    }
    if types.contains(&"array") && !map.contains_key("maxItems") {
        out.insert("maxItems".into(), json!(bounds.max_items));
    }
    if types.contains(&"object") {
        let free = !map.contains_key("properties") && !map.contains_key("additionalProperties");
        if free || map.get("additionalProperties") == Some(&Value::Bool(true)) {
            out.insert("additionalProperties".into(), scalar(bounds));
        }
        let open = !matches!(out.get("additionalProperties"), Some(Value::Bool(false)));
        if open && !map.contains_key("maxProperties") {
            out.insert("maxProperties".into(), json!(bounds.max_properties));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adds_maxima_and_flattens_free_objects() {
        let schema = json!({"type": "object", "properties": {
            "name": {"type": "string"},
            "kind": {"type": "string", "enum": ["a", "b"]},
            "tags": {"type": "array", "items": {"type": "string"}},
            "inputs": {"type": "object"},
            "vars": {"type": "object", "additionalProperties": {"type": "number"}}
        }, "additionalProperties": false});
        let b = bound_schema(&schema, Bounds::default());
        assert_eq!(b["properties"]["name"]["maxLength"], 80);
        assert!(b["properties"]["kind"].get("maxLength").is_none());
        assert_eq!(b["properties"]["tags"]["maxItems"], 8);
        assert_eq!(b["properties"]["tags"]["items"]["maxLength"], 80);
        assert_eq!(b["properties"]["inputs"]["maxProperties"], 8);
        assert!(b["properties"]["inputs"]["additionalProperties"]["anyOf"].is_array());
        assert_eq!(b["properties"]["vars"]["maxProperties"], 8);
        assert!(b.get("maxProperties").is_none(), "a closed object needs no maximum");
    }
}
