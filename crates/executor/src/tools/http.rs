//! `http.fetch`: GET a URL whose host is on the agent's allowlist, with a size and a time limit.
//! With an empty allowlist every fetch is denied.
//!
//! The allowlist names hosts (`api.example.com`, `*.example.com` for its subdomains) or
//! addresses (`10.1.2.3`, `10.0.0.0/8`, `::1`), each optionally with a port (`host:8080`, or
//! `host:*` for any). An entry without a port allows only the default ports, 80 and 443.
//!
//! Addresses are checked after resolution, against the addresses actually connected to (the
//! client connects only to what the check let through, so a name cannot resolve twice):
//! loopback, private, link-local, CGNAT, multicast, reserved and cloud-metadata ranges, in IPv4
//! and IPv6 with IPv4-mapped, -compatible, NAT64 and 6to4 forms, are refused unless an address
//! entry of the allowlist covers them. Every redirect hop is checked again, host, port and
//! address; at most 5 are followed.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::tool::{Tool, ToolContext, ToolError, parse_args, schema_of};
use hermes_core::ErrorCode;
use hermes_core::egress::{AllowlistError, Entry, Policy};

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

/// Checks a URL against the allowlist: scheme, host, port, and a literal address's range.
fn check_url(policy: &Policy, url: &reqwest::Url) -> Result<(), ToolError> {
    if !matches!(url.scheme(), "http" | "https") {
        return Err(ToolError::invalid_argument(format!("`{url}`: only http and https are allowed")));
    }
    let Some(host) = url.host() else {
        return Err(ToolError::invalid_argument(format!("`{url}` has no host")));
    };
    let port = url.port_or_known_default().unwrap_or(0);
    let denied = |message: String| ToolError { code: ErrorCode::Denied, message };
    if !policy.entries.iter().any(|e| e.matches_host(&host)) {
        return Err(denied(format!("host `{host}` is not on this agent's allowlist")));
    }
    if !policy.entries.iter().any(|e| e.matches_host(&host) && e.ports.allows(port)) {
        return Err(denied(format!(
            "port {port} of `{host}` is not on this agent's allowlist (an entry without a port allows 80 and 443)"
        )));
    }
    policy.literal_ok(url).map_err(|e| denied(e.to_string()))
}

/// The tool, with the hosts it may reach.
pub struct HttpFetch {
    policy: Arc<Policy>,
    /// An allowlist entry that did not parse; every fetch fails with it.
    invalid: Option<AllowlistError>,
    client: reqwest::Client,
}

impl HttpFetch {
    pub fn new(allow: Vec<String>) -> Self {
        let mut entries = Vec::new();
        let mut invalid = None;
        for entry in &allow {
            match Entry::parse(entry) {
                Ok(entry) => entries.push(entry),
                Err(e) => invalid = Some(e),
            }
        }
        let policy = Arc::new(Policy { entries });
        let redirects = policy.clone();
        let client = Policy::client(&policy, FETCH_TIMEOUT)
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 5 {
                    return attempt.error("too many redirects");
                }
                match check_url(&redirects, attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(e) => {
                        let url = attempt.url().to_string();
                        attempt.error(format!("redirect to {url} is not on the allowlist: {}", e.message))
                    }
                }
            }))
            .build()
            .unwrap_or_default();
        Self { policy, invalid, client }
    }

    fn check(&self, url: &str) -> Result<reqwest::Url, ToolError> {
        if let Some(invalid) = &self.invalid {
            return Err(ToolError { code: ErrorCode::FailedPrecondition, message: invalid.to_string() });
        }
        let parsed = reqwest::Url::parse(url)
            .map_err(|e| ToolError::invalid_argument(format!("`{url}` is not a URL: {e}")))?;
        check_url(&self.policy, &parsed)?;
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
    /// Each host has its own breaker: one that is down does not close the tool for the others.
    fn breaker_target(&self, args: &Value) -> Option<String> {
        let url = reqwest::Url::parse(args.get("url")?.as_str()?).ok()?;
        Some(format!("{}:{}", url.host_str()?, url.port_or_known_default()?))
    }
    fn reaches_network(&self) -> bool {
        true
    }
    fn run<'a>(&'a self, args: Value, _ctx: &'a ToolContext) -> BoxFuture<'a, Result<Value, ToolError>> {
        Box::pin(async move {
            let args: Args = parse_args(args)?;
            let url = self.check(&args.url)?;
            let limit = args.max_bytes.unwrap_or(DEFAULT_MAX_BYTES).min(DEFAULT_MAX_BYTES);
            let response = self.client.get(url).send().await.map_err(|e| {
                // reqwest puts the reason (a refused redirect or address, say) in the source chain.
                let mut message = format!("fetch failed: {e}");
                let mut source = std::error::Error::source(&e);
                while let Some(cause) = source {
                    message.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                // A refusal is policy; a timeout or a host that does not answer is the remote's
                // fault (and counts toward its breaker); anything else is about the request.
                let code = if message.contains("refused address") || message.contains("not on the allowlist")
                {
                    ErrorCode::Denied
                } else if e.is_timeout() {
                    ErrorCode::Timeout
                } else if e.is_connect() {
                    ErrorCode::Unavailable
                } else {
                    ErrorCode::ToolError
                };
                ToolError { code, message }
            })?;
            let status = response.status().as_u16();
            if status >= 500 {
                // A sick remote: its breaker counts it, and the node may be retried.
                return Err(ToolError {
                    code: ErrorCode::Unavailable,
                    message: format!("{} answered {status}", response.url()),
                });
            }
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
    use super::*;
    use hermes_core::egress::{Ports, refused_range};
    use std::net::IpAddr;

    fn policy(entries: &[&str]) -> Policy {
        Policy { entries: entries.iter().map(|e| Entry::parse(e).unwrap()).collect() }
    }

    fn check(policy: &Policy, url: &str) -> Result<(), ToolError> {
        check_url(policy, &reqwest::Url::parse(url).unwrap())
    }

    #[test]
    fn allowlist_matches_hosts_subdomains_and_ports() {
        let p = policy(&["api.example.com", "*.internal.test", "svc.test:8080", "any.test:*"]);
        assert!(check(&p, "https://api.example.com/x").is_ok());
        assert!(check(&p, "http://API.example.com/x").is_ok());
        assert!(check(&p, "https://a.b.internal.test/").is_ok());
        assert!(check(&p, "https://internal.test/").is_err());
        assert!(check(&p, "https://evil-api.example.com/").is_err());
        assert!(check(&p, "https://api.example.com.evil.net/").is_err());
        assert!(check(&p, "https://api.example.com:8443/").unwrap_err().message.contains("port 8443"));
        assert!(check(&p, "http://svc.test:8080/").is_ok());
        assert!(check(&p, "http://svc.test/").is_err());
        assert!(check(&p, "http://any.test:1234/").is_ok());
        assert!(check(&policy(&[]), "https://api.example.com/").is_err());
    }

    #[test]
    fn private_and_special_addresses_are_refused_in_every_form() {
        let refused = [
            "127.0.0.1",
            "127.1.2.3",
            "0.0.0.0",
            "10.0.0.1",
            "172.16.5.4",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd00:ec2::254",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "ff02::1",
        ];
        for ip in refused {
            let ip: IpAddr = ip.parse().unwrap();
            assert!(refused_range(ip).is_some(), "{ip} should be refused");
        }
        for ip in ["8.8.8.8", "1.1.1.1", "2606:4700::1111", "172.32.0.1", "100.128.0.1"] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(refused_range(ip), None, "{ip}");
        }
    }

    #[test]
    fn ip_literal_urls_are_checked_in_their_normalised_forms() {
        // The URL parser normalises decimal, hex, octal and short forms to 127.0.0.1.
        let p = policy(&["127.0.0.1:*"]);
        let open = policy(&["*.test"]);
        for url in [
            "http://2130706433/",
            "http://0x7f.0.0.1/",
            "http://0177.0.0.1/",
            "http://127.1/",
            "http://[::ffff:7f00:1]/",
        ] {
            assert!(check(&open, url).is_err(), "{url}");
            let _ = check(&p, url);
        }
        assert!(check(&p, "http://127.0.0.1:9999/").is_ok(), "an explicit address entry allows it");
        let named = policy(&["localhost.test:*"]);
        assert!(
            named.address_ok("127.0.0.1".parse().unwrap()).is_err(),
            "a name entry does not allow loopback"
        );
        let net = policy(&["10.0.0.0/8"]);
        assert!(net.address_ok("10.2.3.4".parse().unwrap()).is_ok());
        assert!(net.address_ok("11.0.0.1".parse().unwrap()).is_ok());
        assert!(net.address_ok("192.168.0.1".parse().unwrap()).is_err());
    }

    #[test]
    fn bad_entries_are_reported() {
        assert!(Entry::parse("host:0").is_err());
        assert!(Entry::parse("host:99999").is_err());
        assert!(Entry::parse("10.0.0.0/40").is_err());
        assert!(Entry::parse("[::1").is_err());
        assert_eq!(Entry::parse("[::1]:8080").unwrap().ports, Ports::One(8080));
    }
}
