//! `http.fetch` reaches allowed hosts only, follows redirects only to allowed hosts, and caps
//! the body, against a real local HTTP server.

use axum::Router;
use axum::response::Redirect;
use axum::routing::get;
use hermes_executor::{ToolContext, ToolRegistry};
use serde_json::json;

async fn server() -> String {
    let app = Router::new()
        .route("/hello", get(|| async { "hello from the test server" }))
        .route("/big", get(|| async { "x".repeat(10_000) }))
        .route("/away", get(|| async { Redirect::temporary("http://localhost:9/elsewhere") }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}")
}

fn tools(allow: &[&str]) -> ToolRegistry {
    let mut registry = ToolRegistry::default();
    for tool in hermes_executor::tools::builtin_tools_with(allow.iter().map(|h| h.to_string()).collect()) {
        registry.register(tool).unwrap();
    }
    registry
}

#[tokio::test]
async fn fetches_only_allowed_hosts() {
    let base = server().await;
    let ctx = ToolContext { workspace: std::env::temp_dir(), task: None };
    let allowed = tools(&["127.0.0.1"]);
    let out = allowed.call("http.fetch", json!({"url": format!("{base}/hello")}), &ctx).await.unwrap();
    assert_eq!(out["status"], 200);
    assert_eq!(out["body"], "hello from the test server");

    let port = base.rsplit(':').next().unwrap();
    for url in [format!("http://localhost:{port}/hello"), "https://example.com/".to_owned()] {
        let err = allowed.call("http.fetch", json!({"url": url}), &ctx).await.unwrap_err();
        assert_eq!(err.code.as_str(), "DENIED", "{url}: {}", err.message);
        assert!(err.message.contains("not on this agent's allowlist"), "{}", err.message);
    }
    let err = tools(&[]).call("http.fetch", json!({"url": format!("{base}/hello")}), &ctx).await.unwrap_err();
    assert_eq!(err.code.as_str(), "DENIED");
    let err = allowed.call("http.fetch", json!({"url": "file:///etc/passwd"}), &ctx).await.unwrap_err();
    assert_eq!(err.code.as_str(), "INVALID_ARGUMENT");
}

#[tokio::test]
async fn redirects_off_the_allowlist_and_oversized_bodies_fail() {
    let base = server().await;
    let ctx = ToolContext { workspace: std::env::temp_dir(), task: None };
    let allowed = tools(&["127.0.0.1"]);
    let err = allowed.call("http.fetch", json!({"url": format!("{base}/away")}), &ctx).await.unwrap_err();
    assert!(err.message.contains("not on the allowlist"), "{}", err.message);
    let err = allowed
        .call("http.fetch", json!({"url": format!("{base}/big"), "max_bytes": 1000}), &ctx)
        .await
        .unwrap_err();
    assert!(err.message.contains("larger than 1000 bytes"), "{}", err.message);
}
