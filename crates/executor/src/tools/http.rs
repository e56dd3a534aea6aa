//! `http.fetch`: GET a URL whose host is on the agent's allowlist, with a size and a time limit.
//! Redirects are followed only to allowed hosts. With an empty allowlist every fetch is denied.

use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::tool::{Tool, ToolContext, ToolError, parse_args, schema_of};

/// Largest body returned.
const DEFAULT_MAX_BYTES: usize = 1024 * 1024;
/// Bound on one fetch.
const FETCH_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
struct Args {
    /// An http or https URL on an allowed host.
    url: String,
    /// Most bytes of body to accept (at most 1048576).
    #[serde(default)]
    #[schemars(range(min = 1, max = 1048576))]
    max_bytes: Option<usize>,
}

/// The tool, with the hosts it may reach.
pub struct HttpFetch {
    allow: Vec<String>,
    client: reqwest::Client,
}

/// Whether `host` is allowed: an exact entry, or `*.example.com` for its subdomains.
fn allowed(allow: &[String], host: &str) -> bool {
    let host = host.to_ascii_lowercase();
    allow.iter().any(|entry| {
        let entry = entry.to_ascii_lowercase();
        match entry.strip_prefix("*.") {
            Some(domain) => host.ends_with(&format!(".{domain}")),
            None => host == entry,
        }
    })
}

impl HttpFetch {
    pub fn new(allow: Vec<String>) -> Self {
        let hosts = allow.clone();
        let client = reqwest::Client::builder()
            .timeout(FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                let ok = attempt.url().host_str().is_some_and(|h| allowed(&hosts, h));
                if !ok {
                    let url = attempt.url().to_string();
                    attempt.error(format!("redirect to {url} is not on the allowlist"))
                } else if attempt.previous().len() >= 5 {
                    attempt.error("too many redirects")
                } else {
                    attempt.follow()
                }
            }))
            .build()
            .unwrap_or_default();
        Self { allow, client }
    }

    fn check(&self, url: &str) -> Result<reqwest::Url, ToolError> {
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| ToolError::invalid_argument(format!("`{url}` is not a URL: {e}")))?;
        if !matches!(parsed.scheme(), "http" | "https") {
            return Err(ToolError::invalid_argument(format!("`{url}`: only http and https are allowed")));
        }
        let host = parsed.host_str().unwrap_or_default();
        if !allowed(&self.allow, host) {
            return Err(ToolError {
                code: hermes_core::ErrorCode::Denied,
                message: format!("host `{host}` is not on this agent's allowlist"),
            });
        }
        Ok(parsed)
    }
}

impl Tool for HttpFetch {
    fn name(&self) -> &'static str {
        "http.fetch"
    }
    fn description(&self) -> &'static str {
        "GETs a URL on an allowed host; returns {status, content_type, body} (body as text, at most 1 MiB)."
    }
    fn params_schema(&self) -> Value {
        schema_of::<Args>()
    }
    fn timeout(&self) -> Duration {
        FETCH_TIMEOUT + Duration::from_secs(1)
    }
    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args(args)?;
            let url = self.check(&args.url)?;
            let limit = args.max_bytes.unwrap_or(DEFAULT_MAX_BYTES).min(DEFAULT_MAX_BYTES);
            let response = self.client.get(url).send().await.map_err(|e| {
                let code = if e.is_timeout() {
                    hermes_core::ErrorCode::Timeout
                } else {
                    hermes_core::ErrorCode::ToolError
                };
                // reqwest puts the reason (a refused redirect, say) in the source chain.
                let mut message = format!("fetch failed: {e}");
                let mut source = std::error::Error::source(&e);
                while let Some(cause) = source {
                    message.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                ToolError { code, message }
            })?;
            let status = response.status().as_u16();
            let content_type = response
                .headers()
                .get(reqwest::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .unwrap_or_default()
                .to_owned();
            let mut body = Vec::new();
            let mut stream = response.bytes_stream();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(|e| ToolError::failed(format!("reading the body failed: {e}")))?;
                if body.len() + chunk.len() > limit {
                    return Err(ToolError::failed(format!("the body is larger than {limit} bytes")));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(
                json!({"status": status, "content_type": content_type, "body": String::from_utf8_lossy(&body)}),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::allowed;

    #[test]
    fn allowlist_matches_exact_hosts_and_subdomain_wildcards() {
        let allow = vec!["api.example.com".to_owned(), "*.internal.test".to_owned()];
        assert!(allowed(&allow, "api.example.com"));
        assert!(allowed(&allow, "API.example.com"));
        assert!(allowed(&allow, "a.b.internal.test"));
        assert!(!allowed(&allow, "internal.test"));
        assert!(!allowed(&allow, "evil-api.example.com"));
        assert!(!allowed(&allow, "api.example.com.evil.net"));
        assert!(!allowed(&[], "anything"));
    }
}
