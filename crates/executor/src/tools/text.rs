//! `text.template`: fills a Jinja-style template (the `minijinja` crate) from values, typically
//! `$ref`s to earlier nodes' outputs. Undefined variables are errors, never silently empty.
//!
//! Bounds: the template is at most [`MAX_TEMPLATE_BYTES`], rendering has a fuel budget (template
//! instructions) and the output is cut off at [`MAX_OUTPUT_BYTES`] as it is written. No input bound
//! caps the memory of intermediate values (`"x" * 100000000`, doubled in a loop), so the render
//! runs in an isolated child process (see [`crate::isolate`]) with a memory limit and a deadline.

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Map, Value, json};

use crate::tool::{Tool, ToolContext, ToolError, parse_args, schema_of};

/// Upper bound on the rendered text.
pub const MAX_OUTPUT_BYTES: usize = 1024 * 1024;
/// Upper bound on the template's source.
pub const MAX_TEMPLATE_BYTES: usize = 64 * 1024;
/// Template instructions one render may run.
const FUEL: u64 = 1_000_000;
/// Memory one render may allocate, in MiB.
pub const RENDER_MEMORY_MB: u64 = 256;
/// Wall-clock bound on one render.
const RENDER_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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
    /// Pure: the output depends only on the arguments.
    fn cache_ttl(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_secs(3600))
    }
    fn name(&self) -> &'static str {
        "text.template"
    }

    fn description(&self) -> &'static str {
        "Renders a Jinja-style template with the given values; returns {text}. Use it to assemble reports from earlier results."
    }

    fn params_schema(&self) -> Value {
        schema_of::<Args>()
    }

    /// The isolated render has its own deadline; this bound adds the child's start-up.
    fn timeout(&self) -> std::time::Duration {
        RENDER_TIMEOUT + std::time::Duration::from_secs(2)
    }

    /// A render that failed once fails the same way again.
    fn retry_policy(&self) -> crate::tool::RetryPolicy {
        crate::tool::RetryPolicy { attempts: 1, ..Default::default() }
    }

    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let parsed: Args = parse_args(args)?;
            if parsed.template.len() > MAX_TEMPLATE_BYTES {
                return Err(ToolError::invalid_argument(format!(
                    "the template is {} bytes, over the limit of {MAX_TEMPLATE_BYTES}",
                    parsed.template.len()
                )));
            }
            let input = json!({"template": parsed.template, "values": parsed.values});
            let limits = crate::isolate::Limits { memory_mb: RENDER_MEMORY_MB, timeout: RENDER_TIMEOUT };
            crate::isolate::run("text.template", input, limits).await
        })
    }
}

/// The isolated job: `{template, values}` to `{text}`.
pub(crate) fn render_job(input: Value) -> Result<Value, ToolError> {
    let template = input.get("template").and_then(Value::as_str).unwrap_or_default();
    let empty = Map::new();
    let values = input.get("values").and_then(Value::as_object).unwrap_or(&empty);
    render(template, values).map(|text| json!({ "text": text }))
}

/// A writer that refuses to grow past a cap.
struct Capped {
    text: Vec<u8>,
    cap: usize,
    overflowed: bool,
}

impl std::io::Write for Capped {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.text.len() + buf.len() > self.cap {
            self.overflowed = true;
            return Err(std::io::Error::other(format!("the rendered text exceeds {} bytes", self.cap)));
        }
        self.text.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn render(template: &str, values: &Map<String, Value>) -> Result<String, ToolError> {
    if template.len() > MAX_TEMPLATE_BYTES {
        return Err(ToolError::invalid_argument(format!(
            "the template is {} bytes, over the limit of {MAX_TEMPLATE_BYTES}",
            template.len()
        )));
    }
    let mut env = minijinja::Environment::new();
    env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
    env.set_fuel(Some(FUEL));
    let tmpl = env
        .template_from_str(template)
        .map_err(|e| ToolError::invalid_argument(format!("template does not parse: {e}")))?;
    let mut out = Capped { text: Vec::new(), cap: MAX_OUTPUT_BYTES, overflowed: false };
    tmpl.render_captured_to(values, &mut out).map(drop).map_err(|e| {
        if out.overflowed {
            ToolError::invalid_argument(format!(
                "template does not render: the text would exceed the limit of {MAX_OUTPUT_BYTES} bytes"
            ))
        } else {
            ToolError::invalid_argument(format!("template does not render: {e}"))
        }
    })?;
    String::from_utf8(out.text).map_err(|_| ToolError::failed("the rendered text is not UTF-8"))
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
    fn output_and_template_sizes_are_capped() {
        let err = render("{% for i in range(100000) %}{{ 'y' * 100 }}{% endfor %}", &Map::new()).unwrap_err();
        assert!(err.message.contains("exceed the limit"), "{err}");
        let big = "x".repeat(MAX_TEMPLATE_BYTES + 1);
        assert!(render(&big, &Map::new()).unwrap_err().message.contains("over the limit"));
        let err = render(
            "{% for i in range(100000) %}{% for j in range(100) %}{% endfor %}{% endfor %}",
            &Map::new(),
        )
        .unwrap_err();
        assert!(err.message.contains("fuel"), "{err}");
    }

    #[test]
    fn undefined_values_are_errors() {
        assert!(render("{{ missing }}", &Map::new()).is_err());
        assert!(render("{% for %}", &Map::new()).is_err());
    }
}
