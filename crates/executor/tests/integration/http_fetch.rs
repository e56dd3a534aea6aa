//! `http.fetch` reaches allowed hosts only, follows redirects only to allowed hosts and ports,
//! checks addresses after resolution, and caps the body, against a real local HTTP server.

use axum::Router;
use axum::response::Redirect;
use axum::routing::get;
use hermes_executor::{ToolContext, ToolRegistry};
use serde_json::json;

async fn server() -> String {
    let app = Router::new()
        .route("/hello", get(|| async { "hello from the test server" }))
        .route("/big", get(|| async { "x".repeat(10_000) }))
        .route("/away", get(|| async { Redirect::temporary("http://localhost:9/elsewhere") }))
        .route("/other-port", get(|| async { Redirect::temporary("http://127.0.0.1:9/elsewhere") }))
        .route("/fail", get(|| async { (axum::http::StatusCode::BAD_GATEWAY, "upstream down") }));
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
    let allowed = tools(&["127.0.0.1:*"]);
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
    let allowed = tools(&["127.0.0.1:*"]);
    let err = allowed.call("http.fetch", json!({"url": format!("{base}/away")}), &ctx).await.unwrap_err();
    assert!(err.message.contains("not on the allowlist"), "{}", err.message);
    let err = allowed
        .call("http.fetch", json!({"url": format!("{base}/big"), "max_bytes": 1000}), &ctx)
        .await
        .unwrap_err();
    assert!(err.message.contains("larger than 1000 bytes"), "{}", err.message);
}

/// A name on the allowlist that resolves to loopback is refused after resolution; an explicit
/// address entry is what allows loopback. A redirect to another port of an allowed host is refused.
#[tokio::test]
async fn names_resolving_to_private_addresses_and_redirects_to_other_ports_are_refused() {
    let base = server().await;
    let port: u16 = base.rsplit(':').next().unwrap().parse().unwrap();
    let ctx = ToolContext { workspace: std::env::temp_dir(), task: None };
    let by_name = tools(&["localhost:*"]);
    let err = by_name
        .call("http.fetch", json!({"url": format!("http://localhost:{port}/hello")}), &ctx)
        .await
        .unwrap_err();
    assert_eq!(err.code.as_str(), "DENIED", "{}", err.message);
    assert!(err.message.contains("loopback"), "{}", err.message);

    let one_port = format!("127.0.0.1:{port}");
    let exact = tools(&[one_port.as_str()]);
    let out = exact.call("http.fetch", json!({"url": format!("{base}/hello")}), &ctx).await.unwrap();
    assert_eq!(out["status"], 200);
    let err = exact.call("http.fetch", json!({"url": format!("{base}/other-port")}), &ctx).await.unwrap_err();
    assert_eq!(err.code.as_str(), "DENIED", "{}", err.message);
    assert!(err.message.contains("port 9"), "{}", err.message);
    let err = exact.call("http.fetch", json!({"url": "http://127.0.0.1:9/"}), &ctx).await.unwrap_err();
    assert_eq!(err.code.as_str(), "DENIED");

    // A 5xx is the remote's fault: UNAVAILABLE, retried, counted by that host's breaker.
    let err = exact.call("http.fetch", json!({"url": format!("{base}/fail")}), &ctx).await.unwrap_err();
    assert_eq!(err.code.as_str(), "UNAVAILABLE", "{}", err.message);
}
