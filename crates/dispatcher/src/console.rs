//! The web console (docs/console.md): a page, a script and a style sheet, compiled into the
//! binary and served at `/` beside the HTTP API. It holds no data and has no routes of its own
//! into the service: the script reads and acts only through the public API (`/v1/...`) and its
//! Server-Sent Events, with the caller's token, so it can do nothing a `curl` could not.

use axum::Router;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;

/// `[dispatcher.http.console]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ConsoleConfig {
    /// Serve the console at `/`.
    pub enabled: bool,
    /// A link to a goal's trace, with `{trace_id}` in it (Jaeger:
    /// `http://jaeger:16686/trace/{trace_id}`); empty: no link.
    pub trace_url: String,
}

impl Default for ConsoleConfig {
    fn default() -> Self {
        ConsoleConfig { enabled: true, trace_url: String::new() }
    }
}

const INDEX: &str = include_str!("../console/index.html");
const SCRIPT: &str = include_str!("../console/app.js");
const STYLE: &str = include_str!("../console/app.css");

/// The console's routes, or none when it is off.
pub(crate) fn router<S: Clone + Send + Sync + 'static>(config: &ConsoleConfig, auth: bool) -> Router<S> {
    if !config.enabled {
        return Router::new();
    }
    let settings = json!({ "traceUrl": config.trace_url, "auth": auth }).to_string();
    Router::new()
        .route("/", get(|| async { asset("text/html; charset=utf-8", INDEX) }))
        .route("/console/app.js", get(|| async { asset("text/javascript; charset=utf-8", SCRIPT) }))
        .route("/console/app.css", get(|| async { asset("text/css; charset=utf-8", STYLE) }))
        .route("/console/settings.json", get(move || async move { asset("application/json", settings) }))
}

fn asset(content_type: &'static str, body: impl Into<axum::body::Body>) -> Response {
    let mut response = body.into().into_response();
    let headers = response.headers_mut();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    // Assets change with the binary: revalidate each time (they are small and local).
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    // Nothing loads from anywhere but this server; inline script is not allowed.
    headers.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'",
        ),
    );
    headers.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}
