//! Finite bounds for JSON Schemas used in constrained decoding. A grammar from an unbounded
//! schema (a free-form object, a string or array without a maximum) lets a small model go on
//! forever, and the "always parses" guarantee only holds for output that ends within the token
//! budget. This caps every string, array and open object (lowering larger maxima, never below a
//! stated minimum) and turns free-form objects into flat maps of scalars. Numbers become bounded
//! integers: a JSON number's fraction has no length limit in any grammar, and a small model will
//! happily write digits forever; an integer is still a valid number for the original schema.
//! A tiny greedy model tends to fill whatever room it is given, so the caps are small.

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
        Self { max_string: 32, max_items: 3, max_properties: 3 }
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

/// The largest magnitude a number may have in constrained output.
const MAX_MAGNITUDE: i64 = 1_000_000_000;

fn scalar(bounds: Bounds) -> Value {
    json!({"anyOf": [
        {"type": "string", "maxLength": bounds.max_string},
        {"type": "integer", "minimum": -MAX_MAGNITUDE, "maximum": MAX_MAGNITUDE},
        {"type": "boolean"}
    ]})
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
    let mut cap = |key: &str, min_key: &str, bound: u64| {
        let min = map.get(min_key).and_then(Value::as_u64).unwrap_or(0);
        let current = map.get(key).and_then(Value::as_u64).unwrap_or(u64::MAX);
        out.insert(key.into(), json!(current.min(bound).max(min)));
    };
    if types.contains(&"string") && !constrained {
        cap("maxLength", "minLength", bounds.max_string);
    }
    if types.contains(&"array") {
        cap("maxItems", "minItems", bounds.max_items);
    }
    if types.contains(&"number") || types.contains(&"integer") {
        if types.contains(&"number") {
            let integer_types: Vec<Value> =
                types.iter().map(|t| json!(if *t == "number" { "integer" } else { *t })).collect();
            out.insert(
                "type".into(),
                if integer_types.len() == 1 { integer_types[0].clone() } else { Value::Array(integer_types) },
            );
        }
        let low = map.get("minimum").and_then(Value::as_f64).unwrap_or(f64::MIN).max(-MAX_MAGNITUDE as f64);
        let high = map.get("maximum").and_then(Value::as_f64).unwrap_or(f64::MAX).min(MAX_MAGNITUDE as f64);
        out.insert("minimum".into(), json!(low.ceil() as i64));
        out.insert("maximum".into(), json!(high.floor() as i64));
    }
    if types.contains(&"object") {
        let free = !map.contains_key("properties") && !map.contains_key("additionalProperties");
        if free || map.get("additionalProperties") == Some(&Value::Bool(true)) {
            out.insert("additionalProperties".into(), scalar(bounds));
        }
        let open = !matches!(out.get("additionalProperties"), Some(Value::Bool(false)));
        if open {
            let current = map.get("maxProperties").and_then(Value::as_u64).unwrap_or(u64::MAX);
            out.insert("maxProperties".into(), json!(current.min(bounds.max_properties)));
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
        let b = bound_schema(&schema, Bounds { max_string: 80, max_items: 8, max_properties: 8 });
        assert_eq!(b["properties"]["name"]["maxLength"], 80);
        assert!(b["properties"]["kind"].get("maxLength").is_none());
        assert_eq!(b["properties"]["tags"]["maxItems"], 8);
        assert_eq!(b["properties"]["tags"]["items"]["maxLength"], 80);
        assert_eq!(b["properties"]["inputs"]["maxProperties"], 8);
        assert!(b["properties"]["inputs"]["additionalProperties"]["anyOf"].is_array());
        assert_eq!(b["properties"]["vars"]["maxProperties"], 8);
        assert!(b.get("maxProperties").is_none(), "a closed object needs no maximum");
        assert_eq!(
            b["properties"]["vars"]["additionalProperties"],
            json!({"type": "integer", "minimum": -1_000_000_000, "maximum": 1_000_000_000})
        );
    }

    #[test]
    fn larger_maxima_are_lowered_but_never_below_the_minimum() {
        let schema = json!({"type": "array", "minItems": 6, "maxItems": 50, "items": {"type": "string", "maxLength": 10}});
        let b = bound_schema(&schema, Bounds { max_string: 40, max_items: 4, max_properties: 4 });
        assert_eq!(b["maxItems"], 6);
        assert_eq!(b["items"]["maxLength"], 10);
    }
}
