//! `table.aggregate`: reads a CSV file from the agent's workspace and computes sum, count or mean,
//! optionally filtered by column equality and grouped by a column, with the top k groups.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::tool::{Tool, ToolContext, ToolError, parse_args, schema_of};

/// Upper bound on the CSV file read.
const MAX_FILE_BYTES: u64 = 64 * 1024 * 1024;

#[derive(Debug, Clone, Copy, Deserialize, JsonSchema, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum Op {
    Sum,
    Count,
    Mean,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// CSV file path relative to the agent's workspace, with a header row.
    path: String,
    op: Op,
    /// The numeric column to sum or average; not needed for `count`.
    #[serde(default)]
    value_column: Option<String>,
    /// Group rows by this column.
    #[serde(default)]
    group_by: Option<String>,
    /// Keep only rows whose columns equal these values.
    #[serde(default)]
    filter: BTreeMap<String, String>,
    /// Return only the k largest groups.
    #[serde(default)]
    #[schemars(range(min = 1))]
    top_k: Option<usize>,
}

pub struct TableAggregate;

impl Tool for TableAggregate {
    /// Pure: the output depends only on the arguments.
    fn cache_ttl(&self) -> Option<std::time::Duration> {
        Some(std::time::Duration::from_secs(3600))
    }
    fn name(&self) -> &'static str {
        "table.aggregate"
    }

    fn description(&self) -> &'static str {
        "Aggregates a CSV file in the workspace: sum, count or mean of a column, with optional equality filters, group_by and top_k. Returns {rows, total, groups:[{key, value}]} with groups sorted by value, largest first."
    }

    fn params_schema(&self) -> Value {
        schema_of::<Args>()
    }

    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args(args)?;
            let path = super::fs::confine(&ctx.workspace, &args.path)?;
            // CSV parsing is CPU-bound; keep it off the async workers.
            crate::isolate::cpu(move || aggregate(&path, &args)).await?
        })
    }
}

fn aggregate(path: &Path, args: &Args) -> Result<Value, ToolError> {
    // A regular file within the limit, checked before a byte is read (no FIFO can block here).
    let (file, _) = super::fs::open_regular(path, &args.path, MAX_FILE_BYTES)?;
    let mut reader = csv::Reader::from_reader(std::io::Read::take(file, MAX_FILE_BYTES));
    let headers = reader
        .headers()
        .map_err(|e| ToolError::invalid_argument(format!("{}: no header row: {e}", args.path)))?
        .clone();
    let column = |name: &str| {
        headers.iter().position(|h| h == name).ok_or_else(|| {
            ToolError::invalid_argument(format!(
                "{} has no column `{name}`; columns are: {}",
                args.path,
                headers.iter().collect::<Vec<_>>().join(", ")
            ))
        })
    };
    let value_index = match (args.op, &args.value_column) {
        (Op::Count, _) => None,
        (_, Some(name)) => Some(column(name)?),
        (_, None) => {
            return Err(ToolError::invalid_argument("value_column is required for sum and mean"));
        }
    };
    let group_index = args.group_by.as_deref().map(column).transpose()?;
    let filters: Vec<(usize, &str)> = args
        .filter
        .iter()
        .map(|(name, value)| Ok((column(name)?, value.as_str())))
        .collect::<Result<_, ToolError>>()?;

    let mut groups: HashMap<String, (f64, u64)> = HashMap::new();
    let (mut total, mut rows) = (0.0_f64, 0_u64);
    for (line, record) in reader.records().enumerate() {
        let record = record.map_err(|e| ToolError::invalid_argument(format!("{}: {e}", args.path)))?;
        if !filters.iter().all(|(i, v)| record.get(*i) == Some(*v)) {
            continue;
        }
        let value = match value_index {
            None => 1.0,
            Some(i) => {
                let raw = record.get(i).unwrap_or("").trim();
                raw.parse::<f64>().map_err(|_| {
                    ToolError::invalid_argument(format!(
                        "{} row {}: `{raw}` in column `{}` is not a number",
                        args.path,
                        line + 2,
                        headers.get(i).unwrap_or("")
                    ))
                })?
            }
        };
        rows += 1;
        total += value;
        if let Some(g) = group_index {
            let entry = groups.entry(record.get(g).unwrap_or("").to_owned()).or_default();
            entry.0 += value;
            entry.1 += 1;
        }
    }

    let finish = |sum: f64, count: u64| match args.op {
        Op::Sum => sum,
        Op::Count => count as f64,
        Op::Mean if count == 0 => 0.0,
        Op::Mean => sum / count as f64,
    };
    let mut grouped: Vec<(String, f64)> =
        groups.into_iter().map(|(k, (sum, count))| (k, finish(sum, count))).collect();
    grouped.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    if let Some(k) = args.top_k {
        grouped.truncate(k);
    }
    Ok(json!({
        "rows": rows,
        "total": finish(total, rows),
        "groups": grouped.into_iter().map(|(key, value)| json!({"key": key, "value": value})).collect::<Vec<_>>(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    const CSV: &str =
        "month,category,amount\n2026-04,toys,10\n2026-04,books,5.5\n2026-05,toys,7\n2026-04,toys,2\n";

    fn workspace() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("sales.csv"), CSV).unwrap();
        dir
    }

    fn run(dir: &Path, args: Value) -> Result<Value, ToolError> {
        let args: Args = serde_json::from_value(args).unwrap();
        aggregate(&super::super::fs::confine(dir, &args.path)?, &args)
    }

    #[test]
    fn sums_filtered_groups_largest_first() {
        let dir = workspace();
        let out = run(
            dir.path(),
            json!({"path": "sales.csv", "op": "sum", "value_column": "amount", "group_by": "category", "filter": {"month": "2026-04"}}),
        )
        .unwrap();
        assert_eq!(out["rows"], 3);
        assert_eq!(out["total"], 17.5);
        assert_eq!(out["groups"], json!([{"key": "toys", "value": 12.0}, {"key": "books", "value": 5.5}]));
    }

    #[test]
    fn count_mean_and_top_k() {
        let dir = workspace();
        let out =
            run(dir.path(), json!({"path": "sales.csv", "op": "count", "group_by": "month", "top_k": 1}))
                .unwrap();
        assert_eq!(out["total"], 4.0);
        assert_eq!(out["groups"], json!([{"key": "2026-04", "value": 3.0}]));
        let out =
            run(dir.path(), json!({"path": "sales.csv", "op": "mean", "value_column": "amount"})).unwrap();
        assert_eq!(out["total"], 24.5 / 4.0);
    }

    #[test]
    fn unknown_columns_are_named() {
        let dir = workspace();
        let err =
            run(dir.path(), json!({"path": "sales.csv", "op": "sum", "value_column": "price"})).unwrap_err();
        assert!(err.message.contains("no column `price`"), "{}", err.message);
    }
}
