//! The tool abstraction and the per-agent tool registry. A tool declares a JSON Schema for its
//! parameters (derived from a Rust type with `schemars`); the registry validates arguments against
//! it before the tool runs and bounds every run with the tool's timeout.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hermes_core::ErrorCode;
use hermes_core::schema::InputSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// Default bound on one tool run.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(10);

/// A typed tool failure.
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code}: {message}")]
pub struct ToolError {
    pub code: ErrorCode,
    pub message: String,
}

impl ToolError {
    pub fn invalid_argument(message: impl Into<String>) -> Self {
        Self { code: ErrorCode::InvalidArgument, message: message.into() }
    }

    pub fn failed(message: impl Into<String>) -> Self {
        Self { code: ErrorCode::ToolError, message: message.into() }
    }

    pub fn to_proto(&self) -> hermes_proto::Error {
        hermes_core::error::wire_error(self.code, self.message.clone())
    }
}

/// What a tool may touch.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The agent's workspace dir; file tools are confined to it.
    pub workspace: PathBuf,
}

/// A deterministic capability an agent offers as a task type.
pub trait Tool: Send + Sync + 'static {
    /// Name with a domain prefix, e.g. `table.aggregate`. It is the task type.
    fn name(&self) -> &'static str;
    /// What the tool does, written for a model choosing among tools.
    fn description(&self) -> &'static str;
    /// JSON Schema of the parameters.
    fn params_schema(&self) -> Value;
    fn timeout(&self) -> Duration {
        DEFAULT_TOOL_TIMEOUT
    }
    fn side_effects(&self) -> bool {
        false
    }
    /// Runs with arguments already validated against [`Tool::params_schema`].
    fn run<'a>(&'a self, args: Value, ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>>;
}

/// Deserializes validated arguments into the tool's parameter type.
pub fn parse_args<T: DeserializeOwned>(args: Value) -> Result<T, ToolError> {
    serde_json::from_value(args).map_err(|e| ToolError::invalid_argument(e.to_string()))
}

/// The JSON Schema of a parameter type.
pub fn schema_of<T: schemars::JsonSchema>() -> Value {
    serde_json::to_value(schemars::schema_for!(T)).unwrap_or(Value::Null)
}

struct RegisteredTool {
    tool: Arc<dyn Tool>,
    schema: InputSchema,
}

/// The tools one agent serves, by name.
#[derive(Default, Clone)]
pub struct ToolRegistry {
    tools: BTreeMap<String, Arc<RegisteredTool>>,
}

impl ToolRegistry {
    /// Adds a tool; fails when its name is not a valid task type or its schema does not compile.
    pub fn register(&mut self, tool: Arc<dyn Tool>) -> Result<(), String> {
        hermes_core::topology::validate_task_type(tool.name()).map_err(|e| e.to_string())?;
        let schema = InputSchema::compile(tool.params_schema())
            .map_err(|e| format!("tool {}: schema does not compile: {e}", tool.name()))?;
        self.tools.insert(tool.name().to_owned(), Arc::new(RegisteredTool { tool, schema }));
        Ok(())
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tools.keys().map(String::as_str)
    }

    pub fn contains(&self, name: &str) -> bool {
        self.tools.contains_key(name)
    }

    /// The wire description of every tool, for heartbeats and the catalogue.
    pub fn specs(&self) -> Vec<hermes_proto::ToolSpec> {
        self.tools
            .values()
            .map(|t| hermes_proto::ToolSpec {
                name: t.tool.name().to_owned(),
                description: t.tool.description().to_owned(),
                params_schema_json: t.schema.raw().to_string(),
                side_effects: t.tool.side_effects(),
                require_confirm: false,
            })
            .collect()
    }

    /// Validates `args` and runs the tool under its timeout.
    pub async fn call(&self, name: &str, args: Value, ctx: &ToolContext) -> Result<Value, ToolError> {
        let entry = self
            .tools
            .get(name)
            .ok_or_else(|| ToolError::invalid_argument(format!("this agent has no tool `{name}`")))?;
        let violations = entry.schema.check(&args);
        if !violations.is_empty() {
            let list: Vec<String> = violations.iter().map(ToString::to_string).collect();
            return Err(ToolError::invalid_argument(format!(
                "arguments for `{name}` fail its schema: {}",
                list.join("; ")
            )));
        }
        let timeout = entry.tool.timeout();
        match tokio::time::timeout(timeout, entry.tool.run(args, ctx)).await {
            Ok(result) => result,
            Err(_) => Err(ToolError {
                code: ErrorCode::Timeout,
                message: format!("tool `{name}` did not finish within {} ms", timeout.as_millis()),
            }),
        }
    }
}
