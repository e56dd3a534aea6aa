//! Parameter-name aliases: models often send `valueColumn` or `value-column` for `value_column`,
//! or a synonym a tool declares. A key is renamed only when it is not a parameter itself and maps
//! to exactly one parameter that the arguments do not already have; anything else is left for
//! schema validation to report.

use std::collections::HashMap;

use serde_json::{Map, Value};

/// Folds case, `-`, `_` and spaces: `valueColumn`, `value-column`, `Value Column` → `valuecolumn`.
fn fold(name: &str) -> String {
    name.chars().filter(|c| !matches!(c, '_' | '-' | ' ')).flat_map(char::to_lowercase).collect()
}

/// Renames keys of `args` onto the properties of `schema` (a JSON Schema object) using declared
/// `aliases` (alias → parameter) and case/separator folding. Returns the renames made.
pub fn apply_aliases(
    args: &mut Map<String, Value>,
    schema: &Value,
    aliases: &HashMap<String, String>,
) -> Vec<(String, String)> {
    let Some(properties) = schema.get("properties").and_then(Value::as_object) else {
        return Vec::new();
    };
    let mut by_fold: HashMap<String, Vec<&String>> = HashMap::new();
    for name in properties.keys() {
        by_fold.entry(fold(name)).or_default().push(name);
    }
    let keys: Vec<String> = args.keys().cloned().collect();
    let mut renames = Vec::new();
    for key in keys {
        if properties.contains_key(&key) {
            continue;
        }
        let target = match aliases.get(&key) {
            Some(t) if properties.contains_key(t) => Some(t.clone()),
            _ => match by_fold.get(&fold(&key)).map(Vec::as_slice) {
                Some([only]) => Some((*only).clone()),
                _ => None,
            },
        };
        if let Some(target) = target
            && !args.contains_key(&target)
            && let Some(value) = args.remove(&key)
        {
            args.insert(target.clone(), value);
            renames.push((key, target));
        }
    }
    renames
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renames_only_unambiguous_near_misses() {
        let schema = json!({"properties": {"value_column": {}, "group_by": {}, "path": {}}});
        let aliases = HashMap::from([("file".to_owned(), "path".to_owned())]);
        let mut args = json!({"valueColumn": "amount", "Group-By": "category", "file": "a.csv", "extra": 1})
            .as_object()
            .cloned()
            .unwrap();
        let renames = apply_aliases(&mut args, &schema, &aliases);
        assert_eq!(renames.len(), 3);
        assert_eq!(
            Value::Object(args),
            json!({"value_column": "amount", "group_by": "category", "path": "a.csv", "extra": 1})
        );
    }

    #[test]
    fn never_overwrites_a_parameter_given_by_its_name() {
        let schema = json!({"properties": {"path": {}}});
        let mut args = json!({"path": "a", "Path": "b"}).as_object().cloned().unwrap();
        assert!(apply_aliases(&mut args, &schema, &HashMap::new()).is_empty());
        assert_eq!(args["path"], "a");
    }
}
