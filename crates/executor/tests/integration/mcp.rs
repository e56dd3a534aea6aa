//! Tools mounted from a real MCP server process (a small Python script speaking MCP over stdio),
//! called directly and through the `agent.run` loop with the scripted model.

use std::sync::Arc;
use std::time::Duration;

use hermes_executor::agent_loop::AgentModel;
use hermes_executor::config::McpServerSpec;
use hermes_executor::{AgentConfig, ToolContext, build_registry};
use hermes_llm::{OpenAiChat, OpenAiConfig};
use hermes_test_util::scripted::{ScriptedLlm, ScriptedResponse};
use serde_json::json;

const MODEL: &str = "agent-model";

fn server(notes: &std::path::Path) -> McpServerSpec {
    McpServerSpec {
        name: "notes".into(),
        command: "python3".into(),
        args: vec![concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/mcp_server.py").into()],
        env: [("NOTES_FILE".to_owned(), notes.display().to_string())].into(),
        tools: None,
        timeout_secs: Some(5),
        side_effects: true,
    }
}

#[tokio::test]
async fn mcp_tools_are_mounted_validated_and_called_through_the_loop() {
    let workspace = tempfile::tempdir().unwrap();
    let notes = workspace.path().join("notes.txt");
    let llm = ScriptedLlm::start().await;
    let mut model = OpenAiConfig::new(llm.base_url(), MODEL);
    model.backoff = Duration::from_millis(10);
    let mut config = AgentConfig::new("mcp-agent", workspace.path());
    config.tools = vec!["notes.add".into(), "notes.append-note".into(), "notes.fail".into()];
    config.mcp = vec![server(&notes)];
    config.llm = Some(AgentModel(Arc::new(OpenAiChat::new(model).unwrap())));
    let registry = build_registry(&config, None).await.unwrap();
    let ctx = ToolContext { workspace: workspace.path().to_path_buf(), task: None };

    // The server's schema is the tool's schema: bad arguments never reach the server.
    let spec = registry.specs().into_iter().find(|s| s.name == "notes.add").unwrap();
    assert!(spec.params_schema_json.contains("\"required\":[\"a\",\"b\"]"), "{}", spec.params_schema_json);
    assert!(spec.side_effects);
    let err = registry.call("notes.add", json!({"a": "two", "b": 3}), &ctx).await.unwrap_err();
    assert_eq!(err.code.as_str(), "INVALID_ARGUMENT");
    assert_eq!(registry.call("notes.add", json!({"a": 2, "b": 3}), &ctx).await.unwrap(), json!({"sum": 5}));
    let err = registry.call("notes.fail", json!({}), &ctx).await.unwrap_err();
    assert!(err.code.as_str() == "TOOL_ERROR" && err.message.contains("the fail tool failed"), "{err}");

    // Through the loop: the model calls the MCP tools by their function names.
    llm.push(MODEL, ScriptedResponse::tool_call("notes__add", r#"{"a": 40, "b": 2}"#));
    llm.push(MODEL, ScriptedResponse::tool_call("notes__append-note", r#"{"text": "the answer is 42"}"#));
    llm.push(MODEL, ScriptedResponse::content("42, noted."));
    let out =
        registry.call("agent.run", json!({"instruction": "add 40 and 2, note it"}), &ctx).await.unwrap();
    assert_eq!(out["answer"], "42, noted.");
    assert_eq!(out["steps"][0]["output"]["sum"], 42);
    assert_eq!(std::fs::read_to_string(&notes).unwrap(), "the answer is 42\n");
    let offered = llm.requests_for(MODEL)[0]["tools"].to_string();
    assert!(offered.contains("notes__add") && offered.contains("Adds two numbers."), "{offered}");
}

#[tokio::test]
async fn a_missing_server_or_tool_stops_the_agent_with_a_clear_error() {
    let workspace = tempfile::tempdir().unwrap();
    let mut config = AgentConfig::new("mcp-agent", workspace.path());
    let mut spec = server(&workspace.path().join("n"));
    spec.tools = Some(vec!["subtract".into()]);
    config.mcp = vec![spec];
    let err = build_registry(&config, None).await.err().unwrap();
    assert!(err.to_string().contains("has no tool `subtract`"), "{err}");
    let mut spec = server(&workspace.path().join("n"));
    spec.command = "/nonexistent/mcp-server".into();
    config.mcp = vec![spec];
    let err = build_registry(&config, None).await.err().unwrap();
    assert!(err.to_string().contains("cannot start MCP server `notes`"), "{err}");
}
