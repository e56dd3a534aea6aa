//! `math.evaluate`: arithmetic over named numeric variables, with the `evalexpr` crate.

use std::collections::BTreeMap;

use evalexpr::{ContextWithMutableVariables, HashMapContext, Value as ExprValue};
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::tool::{Tool, ToolContext, ToolError, parse_args, schema_of};

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// The expression, e.g. `(may - april) / april * 100`. Supports + - * / % ^, comparisons
    /// and functions such as `math::abs`, `math::sqrt`, `round`, `min`, `max`.
    expression: String,
    /// Numeric variables the expression may use.
    #[serde(default)]
    variables: BTreeMap<String, f64>,
}

pub struct MathEvaluate;

impl Tool for MathEvaluate {
    fn name(&self) -> &'static str {
        "math.evaluate"
    }

    fn description(&self) -> &'static str {
        "Evaluates an arithmetic expression over named numeric variables and returns {value}."
    }

    fn params_schema(&self) -> Value {
        schema_of::<Args>()
    }

    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args(args)?;
            evaluate(&args.expression, &args.variables).map(|value| json!({ "value": value }))
        })
    }
}

fn evaluate(expression: &str, variables: &BTreeMap<String, f64>) -> Result<f64, ToolError> {
    let mut context = HashMapContext::<evalexpr::DefaultNumericTypes>::new();
    for (name, value) in variables {
        context
            .set_value(name.clone(), ExprValue::Float(*value))
            .map_err(|e| ToolError::invalid_argument(format!("variable `{name}`: {e}")))?;
    }
    let result = evalexpr::eval_with_context(expression, &context)
        .map_err(|e| ToolError::invalid_argument(format!("cannot evaluate `{expression}`: {e}")))?;
    let value = match result {
        ExprValue::Float(f) => f,
        ExprValue::Int(i) => i as f64,
        other => {
            return Err(ToolError::invalid_argument(format!(
                "`{expression}` is not numeric: it evaluates to {other}"
            )));
        }
    };
    if value.is_finite() {
        Ok(value)
    } else {
        Err(ToolError::failed(format!("`{expression}` evaluates to {value}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluates_with_variables() {
        let vars = BTreeMap::from([("a".to_owned(), 200.0), ("b".to_owned(), 250.0)]);
        assert_eq!(evaluate("(b - a) / a * 100", &vars).unwrap(), 25.0);
        assert_eq!(evaluate("2 + 3 * 4", &BTreeMap::new()).unwrap(), 14.0);
    }

    #[test]
    fn rejects_non_numeric_and_unknown_variables() {
        assert!(evaluate("x + 1", &BTreeMap::new()).is_err());
        assert!(evaluate("\"s\"", &BTreeMap::new()).is_err());
        assert_eq!(
            evaluate("1 / 0.0", &BTreeMap::new()).unwrap_err().code,
            hermes_core::ErrorCode::ToolError
        );
    }
}
