//! `text.template`: fills a Jinja-style template (the `minijinja` crate) from values, typically
//! `$ref`s to earlier nodes' outputs. Undefined variables are errors, never silently empty.

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::tool::{Tool, ToolContext, ToolError, parse_args, schema_of};

/// Upper bound on the rendered text.
const MAX_OUTPUT_BYTES: usize = 1024 * 1024;

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// A template such as `Top category: {{ top.key }} ({{ total | round(2) }})`.
    template: String,
    /// Values the template refers to by name.
    #[serde(default)]
    values: Map<String, Value>,
}

pub struct TextTemplate;

impl Tool for TextTemplate {
    fn name(&self) -> &'static str {
        "text.template"
    }

    fn description(&self) -> &'static str {
        "Renders a Jinja-style template with the given values; returns {text}. Use it to assemble reports from earlier results."
    }

    fn params_schema(&self) -> Value {
        schema_of::<Args>()
    }

    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args(args)?;
            render(&args.template, &args.values).map(|text| json!({ "text": text }))
        })
    }
}

fn render(template: &str, values: &Map<String, Value>) -> Result<String, ToolError> {
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_fuel(Some(1_000_000));
    let tmpl = env
        .template_from_str(template)
        .map_err(|e| ToolError::invalid_argument(format!("template does not parse: {e}")))?;
    let text = tmpl
        .render(values)
        .map_err(|e| ToolError::invalid_argument(format!("template does not render: {e}")))?;
    if text.len() > MAX_OUTPUT_BYTES {
        return Err(ToolError::failed(format!(
            "rendered text is {} bytes, over the limit of {MAX_OUTPUT_BYTES}",
            text.len()
        )));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_values_and_filters() {
        let values = json!({"name": "toys", "change": 12.3456, "rows": [{"key": "a"}, {"key": "b"}]});
        let text = render(
            "{{ name }}: {{ change | round(1) }}%{% for r in rows %} {{ r.key }}{% endfor %}",
            values.as_object().unwrap(),
        )
        .unwrap();
        assert_eq!(text, "toys: 12.3% a b");
    }

    #[test]
    fn undefined_values_are_errors() {
        assert!(render("{{ missing }}", &Map::new()).is_err());
        assert!(render("{% for %}", &Map::new()).is_err());
    }
}
