//! Tools mounted from MCP servers over stdio (the `rmcp` client). Each server in an agent's
//! config is started as a child process when the agent starts; each of its tools becomes a
//! Hermes tool named `<server>.<tool>` with the server's input schema, so it goes through the
//! same schema validation, timeout, retries, circuit breaker, ledger and approval policy as a
//! built-in tool. A server that dies is started again on the next call.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use hermes_core::ErrorCode;
use rmcp::ServiceExt;
use rmcp::model::{CallToolRequestParams, CallToolResult};
use rmcp::service::{RoleClient, RunningService, ServiceError};
use rmcp::transport::TokioChildProcess;
use serde_json::{Value, json};
use tracing::{info, warn};

use crate::config::McpServerSpec;
use crate::tool::{Tool, ToolContext, ToolError};

type Client = RunningService<RoleClient, ()>;

/// One server process and its client, started again after it dies.
struct Connection {
    spec: McpServerSpec,
    client: tokio::sync::Mutex<Option<Client>>,
}

impl Connection {
    /// Starts the server; a server that cannot start is `UNAVAILABLE` (its breaker counts it).
    async fn connect(spec: &McpServerSpec) -> Result<Client, ToolError> {
        let unavailable = |message: String| ToolError { code: ErrorCode::Unavailable, message };
        let mut command = tokio::process::Command::new(&spec.command);
        command.args(&spec.args).envs(&spec.env).kill_on_drop(true);
        let transport = TokioChildProcess::builder(command)
            .stderr(std::process::Stdio::inherit())
            .spawn()
            .map(|(transport, _)| transport)
            .map_err(|e| {
                unavailable(format!("cannot start MCP server `{}` ({}): {e}", spec.name, spec.command))
            })?;
        let client = tokio::time::timeout(Duration::from_secs(30), ().serve(transport))
            .await
            .map_err(|_| {
                unavailable(format!("MCP server `{}` did not finish its handshake within 30 s", spec.name))
            })?
            .map_err(|e| unavailable(format!("MCP server `{}` failed its handshake: {e}", spec.name)))?;
        Ok(client)
    }

    async fn call(&self, tool: &str, arguments: Value) -> Result<CallToolResult, ToolError> {
        let mut guard = self.client.lock().await;
        if guard.as_ref().is_none_or(|c| c.is_closed()) {
            info!(server = %self.spec.name, "starting MCP server");
            let client = Self::connect(&self.spec).await?;
            *guard = Some(client);
        }
        let peer =
            guard.as_ref().map(|c| c.peer().clone()).ok_or_else(|| ToolError::failed("no MCP client"))?;
        drop(guard);
        let mut params = CallToolRequestParams::new(Cow::Owned(tool.to_owned()));
        params.arguments = arguments.as_object().cloned();
        peer.call_tool(params).await.map_err(|e| {
            let code = match e {
                ServiceError::TransportClosed | ServiceError::TransportSend(_) => ErrorCode::Unavailable,
                ServiceError::Timeout { .. } => ErrorCode::Timeout,
                ServiceError::McpError(ref m) if m.code.0 == -32602 => ErrorCode::InvalidArgument,
                _ => ErrorCode::ToolError,
            };
            ToolError { code, message: format!("MCP server `{}`: {e}", self.spec.name) }
        })
    }
}

/// One mounted tool.
struct McpTool {
    connection: Arc<Connection>,
    /// The Hermes name, `<server>.<tool>`.
    name: String,
    /// The name the server knows.
    remote: String,
    description: String,
    schema: Value,
    timeout: Duration,
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn params_schema(&self) -> Value {
        self.schema.clone()
    }

    fn timeout(&self) -> Duration {
        self.timeout
    }

    fn side_effects(&self) -> bool {
        self.connection.spec.side_effects
    }

    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let result = self.connection.call(&self.remote, args).await?;
            let text: Vec<&str> =
                result.content.iter().filter_map(|c| c.as_text()).map(|t| t.text.as_str()).collect();
            if result.is_error == Some(true) {
                return Err(ToolError::failed(format!("{} failed: {}", self.name, text.join("\n"))));
            }
            // Key values at the top level: the structured result as it is, else a JSON object
            // the text holds, else the text.
            Ok(match (result.structured_content, text.as_slice()) {
                (Some(Value::Object(map)), _) => Value::Object(map),
                (Some(other), _) => json!({"value": other}),
                (None, [one]) => match serde_json::from_str::<Value>(one) {
                    Ok(Value::Object(map)) => Value::Object(map),
                    _ => json!({"text": one}),
                },
                (None, many) => json!({"text": many.join("\n")}),
            })
        })
    }
}

/// A tool name as a task-type segment: lower-case `[a-z0-9-]`.
fn segment(name: &str) -> String {
    let s: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_lowercase() } else { '-' }).collect();
    let s = s.trim_start_matches('-').to_owned();
    if s.is_empty() { "tool".into() } else { s }
}

/// Starts the server, lists its tools and returns them ready to register. Fails with a clear
/// message when the server cannot start or a tool named in `tools` does not exist.
pub async fn mount(spec: &McpServerSpec) -> Result<Vec<Arc<dyn Tool>>, crate::Error> {
    use crate::Error;
    hermes_core::topology::validate_task_type(&spec.name)
        .map_err(|_| Error::Config(format!("MCP server name `{}` must be [a-z0-9-]", spec.name)))?;
    let client = Connection::connect(spec).await.map_err(|e| Error::Config(e.message))?;
    let listed = client
        .list_all_tools()
        .await
        .map_err(|e| Error::Config(format!("MCP server `{}` cannot list its tools: {e}", spec.name)))?;
    if let Some(wanted) = &spec.tools
        && let Some(missing) = wanted.iter().find(|w| !listed.iter().any(|t| t.name == **w))
    {
        return Err(Error::Config(format!("MCP server `{}` has no tool `{missing}`", spec.name)));
    }
    let connection =
        Arc::new(Connection { spec: spec.clone(), client: tokio::sync::Mutex::new(Some(client)) });
    let timeout = Duration::from_secs(spec.timeout_secs.unwrap_or(10).max(1));
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    for tool in listed {
        if spec.tools.as_ref().is_some_and(|w| !w.iter().any(|n| *n == tool.name)) {
            continue;
        }
        let name = format!("{}.{}", spec.name, segment(&tool.name));
        if tools.iter().any(|t| t.name() == name) {
            warn!(%name, "two MCP tools map to one name; keeping the first");
            continue;
        }
        let description = tool
            .description
            .as_deref()
            .map(str::to_owned)
            .unwrap_or_else(|| format!("`{}` from the MCP server `{}`", tool.name, spec.name));
        tools.push(Arc::new(McpTool {
            connection: connection.clone(),
            name,
            remote: tool.name.to_string(),
            description,
            schema: Value::Object((*tool.input_schema).clone()),
            timeout,
        }));
    }
    info!(server = %spec.name, tools = tools.len(), "MCP server mounted");
    Ok(tools)
}

#[cfg(test)]
mod tests {
    #[test]
    fn tool_names_become_task_type_segments() {
        assert_eq!(super::segment("read_file"), "read-file");
        assert_eq!(super::segment("GetWeather"), "getweather");
        assert_eq!(super::segment("__x"), "x");
        assert_eq!(super::segment("!!"), "tool");
    }
}
