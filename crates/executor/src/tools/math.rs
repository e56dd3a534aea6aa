//! `math.evaluate`: arithmetic over named numeric variables, with the `evalexpr` crate.
//!
//! evalexpr parses and evaluates recursively, so an expression is bounded before it reaches it:
//! at most [`MAX_EXPRESSION_BYTES`] long, [`MAX_NESTING`] parentheses deep, [`MAX_TERMS`] operators
//! and [`MAX_VARIABLES`] variables. Within those bounds the recursion fits the 64 MiB stack of the
//! work thread that evaluates anything longer than [`INLINE_BYTES`] (shorter ones are evaluated in
//! place: they are too small to hurt, and common).

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

/// Longest expression accepted.
pub const MAX_EXPRESSION_BYTES: usize = 8 * 1024;
/// Deepest parenthesis nesting accepted.
pub const MAX_NESTING: usize = 64;
/// Most operators and separators (`+ - * / % ^ , ; = < > ! & |`) in one expression.
pub const MAX_TERMS: usize = 2048;
/// Most variables one call may pass.
pub const MAX_VARIABLES: usize = 1024;
/// Expressions up to this long are evaluated on the calling task.
const INLINE_BYTES: usize = 256;

/// Refuses an expression that could exhaust the evaluator's stack or time, before it is parsed.
fn check_bounds(expression: &str, variables: usize) -> Result<(), ToolError> {
    let too = |what: String| Err(ToolError::invalid_argument(format!("the expression is too {what}")));
    if expression.len() > MAX_EXPRESSION_BYTES {
        return too(format!("long: {} bytes, over the limit of {MAX_EXPRESSION_BYTES}", expression.len()));
    }
    if variables > MAX_VARIABLES {
        return Err(ToolError::invalid_argument(format!(
            "{variables} variables, over the limit of {MAX_VARIABLES}"
        )));
    }
    let (mut depth, mut deepest, mut terms) = (0usize, 0usize, 0usize);
    for c in expression.chars() {
        match c {
            '(' => {
                depth += 1;
                deepest = deepest.max(depth);
            }
            ')' => depth = depth.saturating_sub(1),
            '+' | '-' | '*' | '/' | '%' | '^' | ',' | ';' | '=' | '<' | '>' | '!' | '&' | '|' => terms += 1,
            _ => {}
        }
    }
    if deepest > MAX_NESTING {
        return too(format!(
            "deeply nested: {deepest} levels of parentheses, over the limit of {MAX_NESTING}"
        ));
    }
    if terms > MAX_TERMS {
        return too(format!("complex: {terms} operators, over the limit of {MAX_TERMS}"));
    }
    Ok(())
}

impl Tool for MathEvaluate {
    /// Pure: the output depends only on the arguments.
    fn cache_ttl(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_secs(3600))
    }
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
            check_bounds(&args.expression, args.variables.len())?;
            let value = if args.expression.len() <= INLINE_BYTES {
                evaluate(&args.expression, &args.variables)
            } else {
                crate::isolate::cpu(move || evaluate(&args.expression, &args.variables)).await?
            };
            value.map(|value| json!({ "value": value }))
        })
    }
}

/// Evaluates, turning a panic inside evalexpr (some builtins panic on odd arguments, such as a
/// shift by 64 or a substring inside a character) into an `INVALID_ARGUMENT`.
fn evaluate(expression: &str, variables: &BTreeMap<String, f64>) -> Result<f64, ToolError> {
    std::panic::catch_unwind(|| evaluate_unguarded(expression, variables)).unwrap_or_else(|_| {
        Err(ToolError::invalid_argument(format!(
            "cannot evaluate `{}`: the evaluator failed on its arguments",
            hermes_core::topology::truncate_for_message(expression)
        )))
    })
}

fn evaluate_unguarded(expression: &str, variables: &BTreeMap<String, f64>) -> Result<f64, ToolError> {
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

    /// The worst inputs within the bounds evaluate (or fail typed) on a work thread's stack.
    #[test]
    fn bounded_inputs_fit_the_work_stack() {
        let chained = vec!["1"; MAX_TERMS + 2].join("+");
        assert!(check_bounds(&chained, 0).unwrap_err().message.contains("operators"));
        let chained = vec!["1"; MAX_TERMS + 1].join("+");
        check_bounds(&chained, 0).unwrap();
        let nested = format!("{}1{}", "(".repeat(MAX_NESTING), ")".repeat(MAX_NESTING));
        check_bounds(&nested, 0).unwrap();
        let deeper = format!("{}1{}", "(".repeat(MAX_NESTING + 1), ")".repeat(MAX_NESTING + 1));
        assert!(check_bounds(&deeper, 0).unwrap_err().message.contains("nested"));
        let unary = format!("{}1", "-".repeat(MAX_TERMS));
        let long = "1".repeat(MAX_EXPRESSION_BYTES + 1);
        assert!(check_bounds(&long, 0).unwrap_err().message.contains("long"));
        let sum = chained.clone();
        let worst = [chained, nested, unary, format!("{}1", "(-".repeat(MAX_NESTING))];
        let handle = std::thread::Builder::new()
            .stack_size(crate::isolate::WORK_STACK_BYTES)
            .spawn(move || {
                for expression in worst {
                    let _ = evaluate(&expression, &BTreeMap::new());
                }
                evaluate(&sum, &BTreeMap::new()).unwrap()
            })
            .unwrap();
        assert_eq!(handle.join().unwrap(), (MAX_TERMS + 1) as f64);
    }

    #[test]
    fn evaluator_panics_are_invalid_arguments() {
        for expression in ["shl(1, 64)", "str::substring(\"é\", 0, 1)"] {
            if let Err(e) = evaluate(expression, &BTreeMap::new()) {
                assert_eq!(e.code, hermes_core::ErrorCode::InvalidArgument, "{expression}: {e}");
            }
        }
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
