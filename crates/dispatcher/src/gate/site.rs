//! Which HTTP requests are this server's own (the first check of the gate, as a layer on every
//! route, the console included): the request is for this server (its `Host` is one the server
//! answers to, against DNS rebinding) and, when it changes state or opens a WebSocket, comes from
//! this server's own origin or an allowed one, with a body type a browser cannot send cross-site
//! without asking first. A web page the user visits cannot drive a local `hermes up`.

use std::net::{IpAddr, SocketAddr};

use axum::http::{HeaderMap, Method, StatusCode, header};

/// Which requests are this server's own: the names it answers to and the origins that may
/// change state through it (`dispatcher.http.allowed_hosts`, `dispatcher.http.cors_allow_origins`).
#[derive(Debug, Clone)]
pub(crate) struct Site {
    listen: SocketAddr,
    allowed_hosts: Vec<String>,
    allowed_origins: Vec<String>,
}

/// Why [`Site::check`] refused a request: its status and the reason, for the problem body.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Refusal {
    pub status: StatusCode,
    pub reason: String,
}

/// The body types a browser sends cross-site without a CORS preflight (the "simple" ones of
/// the Fetch standard): a state-changing request carrying one is never an API call.
const SIMPLE_BODY_TYPES: &[&str] =
    &["text/plain", "application/x-www-form-urlencoded", "multipart/form-data"];

impl Site {
    pub(crate) fn new(listen: SocketAddr, allowed_hosts: &[String], allowed_origins: &[String]) -> Site {
        let norm = |v: &String| v.trim().trim_end_matches('/').to_ascii_lowercase();
        Site {
            listen,
            allowed_hosts: allowed_hosts.iter().map(norm).filter(|h| !h.is_empty()).collect(),
            allowed_origins: allowed_origins.iter().map(norm).filter(|o| !o.is_empty()).collect(),
        }
    }

    /// Refuses a request not meant for this server: a foreign `Host` (`421`), a cross-site
    /// origin on a state-changing request or a WebSocket upgrade (`403`), a body type a form or
    /// a `no-cors` fetch can send, or a body without a type (`415`).
    pub(crate) fn check(
        &self,
        method: &Method,
        host: Option<&str>,
        headers: &HeaderMap,
    ) -> Result<(), Refusal> {
        let host = host.map(|h| h.trim().to_ascii_lowercase());
        if let Some(host) = &host
            && !self.answers_to(host)
        {
            return Err(Refusal {
                status: StatusCode::MISDIRECTED_REQUEST,
                reason: format!(
                    "this server does not answer to the host `{host}`: add its name to dispatcher.http.allowed_hosts (docs/http.md)"
                ),
            });
        }
        let upgrade = headers
            .get(header::UPGRADE)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
        let changes_state = !matches!(*method, Method::GET | Method::HEAD | Method::OPTIONS);
        if !changes_state && !upgrade {
            return Ok(());
        }
        self.check_origin(host.as_deref(), headers)?;
        if changes_state {
            check_body_type(headers)?;
        }
        Ok(())
    }

    /// Whether `host` (a `Host` header: a name or an address, with or without a port) names
    /// this server: an allowed name, its listen address (any address when it listens on all),
    /// or `localhost` when it listens on loopback.
    fn answers_to(&self, host: &str) -> bool {
        let name = host_name(host);
        if self.allowed_hosts.iter().any(|allowed| {
            allowed == "*"
                || allowed == name
                || (allowed.starts_with('.') && (name.ends_with(allowed.as_str()) || name == &allowed[1..]))
        }) {
            return true;
        }
        let listen = self.listen.ip();
        if let Ok(ip) = name.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() {
            return listen.is_unspecified() || ip == listen || (ip.is_loopback() && listen.is_loopback());
        }
        (name == "localhost" || name.ends_with(".localhost"))
            && (listen.is_loopback() || listen.is_unspecified())
    }

    fn check_origin(&self, host: Option<&str>, headers: &HeaderMap) -> Result<(), Refusal> {
        let forbidden = |reason: String| Refusal { status: StatusCode::FORBIDDEN, reason };
        let Some(origin) = headers.get(header::ORIGIN) else {
            // No Origin: not a browser's cross-origin request, unless its fetch metadata says so.
            return match headers.get("sec-fetch-site").and_then(|v| v.to_str().ok()) {
                Some(site)
                    if site.eq_ignore_ascii_case("cross-site") || site.eq_ignore_ascii_case("same-site") =>
                {
                    Err(forbidden(format!(
                        "a {site} browser request may not change state here: only this server's own pages and dispatcher.http.cors_allow_origins may (docs/http.md)"
                    )))
                }
                _ => Ok(()),
            };
        };
        let origin = origin.to_str().unwrap_or("").trim().trim_end_matches('/').to_ascii_lowercase();
        if self.allowed_origins.iter().any(|o| o == "*" || *o == origin) {
            return Ok(());
        }
        let same =
            host.is_some_and(|host| origin_authority(&origin).is_some_and(|a| a == strip_default_port(host)));
        if same {
            return Ok(());
        }
        Err(forbidden(format!(
            "a request from the origin `{origin}` may not change state here: only this server's own origin and dispatcher.http.cors_allow_origins may (docs/http.md)"
        )))
    }
}

/// A state-changing request's body must say it is JSON or YAML; the simple types a page can
/// send cross-site without a preflight, and a body with no type, are refused.
fn check_body_type(headers: &HeaderMap) -> Result<(), Refusal> {
    let media = media_type(headers);
    let unsupported = |reason: String| Refusal { status: StatusCode::UNSUPPORTED_MEDIA_TYPE, reason };
    match media.as_deref() {
        Some(media) if SIMPLE_BODY_TYPES.contains(&media) => Err(unsupported(format!(
            "content type `{media}` is not accepted: send application/json (application/a2a+json at /a2a, or application/yaml)"
        ))),
        Some(_) => Ok(()),
        None if has_body(headers) => {
            Err(unsupported("the request has a body but no Content-Type: send application/json".to_owned()))
        }
        None => Ok(()),
    }
}

/// The media type of a request's `Content-Type` (`application/json`, lowercased, parameters
/// dropped); `None` without one (or with one that is not text).
pub(crate) fn media_type(headers: &HeaderMap) -> Option<String> {
    let value = headers.get(header::CONTENT_TYPE)?.to_str().ok()?;
    Some(value.split(';').next().unwrap_or("").trim().to_ascii_lowercase())
}

fn has_body(headers: &HeaderMap) -> bool {
    let length = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).map(str::trim);
    headers.contains_key(header::TRANSFER_ENCODING) || length.is_some_and(|l| l != "0")
}

/// The name or address of a `Host` value, without its port.
fn host_name(host: &str) -> &str {
    let host = host.trim_end_matches('.');
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && !name.contains(':') => {
            name.trim_end_matches('.')
        }
        _ => host,
    }
}

/// `host[:port]` of an origin (`scheme://host[:port]`), its scheme's default port dropped.
fn origin_authority(origin: &str) -> Option<String> {
    let (scheme, authority) = origin.split_once("://")?;
    let default = match scheme {
        "http" | "ws" => ":80",
        "https" | "wss" => ":443",
        _ => return None,
    };
    Some(authority.strip_suffix(default).unwrap_or(authority).to_owned())
}

fn strip_default_port(host: &str) -> String {
    host.strip_suffix(":80").or_else(|| host.strip_suffix(":443")).unwrap_or(host).to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn site(listen: &str, hosts: &[&str], origins: &[&str]) -> Site {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        Site::new(listen.parse().unwrap(), &own(hosts), &own(origins))
    }

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, value.parse().unwrap());
        }
        map
    }

    #[test]
    fn a_loopback_server_answers_to_its_address_and_localhost_only() {
        let local = site("127.0.0.1:8080", &[], &[]);
        for host in ["127.0.0.1:8080", "localhost:8080", "LOCALHOST", "127.0.0.1", "app.localhost:8080"] {
            assert!(local.answers_to(&host.to_ascii_lowercase()), "{host}");
        }
        for host in ["evil.example:8080", "10.0.0.5:8080", "127.0.0.1.evil.example", "localhost.evil.example"]
        {
            assert!(!local.answers_to(host), "{host}");
        }
        let refused =
            local.check(&Method::GET, Some("attacker.example:8080"), &HeaderMap::new()).unwrap_err();
        assert_eq!(refused.status, StatusCode::MISDIRECTED_REQUEST);
        assert!(refused.reason.contains("dispatcher.http.allowed_hosts"), "{}", refused.reason);
    }

    #[test]
    fn configured_names_and_suffixes_are_answered_to() {
        let any_ip = site("0.0.0.0:8080", &["hermes.internal", ".svc.cluster.local"], &[]);
        assert!(any_ip.answers_to("hermes.internal:8080"));
        assert!(any_ip.answers_to("hermes-dispatcher.ns.svc.cluster.local"));
        assert!(any_ip.answers_to("10.1.2.3:8080"), "a pod IP, as probes send it");
        assert!(any_ip.answers_to("[::1]:8080"));
        assert!(!any_ip.answers_to("hermes.internal.evil.example"));
        assert!(site("0.0.0.0:8080", &["*"], &[]).answers_to("anything.example"));
    }

    #[test]
    fn cross_site_state_changes_and_simple_bodies_are_refused() {
        let local = site("127.0.0.1:8080", &[], &["http://localhost:5173"]);
        let host = Some("127.0.0.1:8080");
        let json = ("content-type", "application/json");
        let len = ("content-length", "12");
        // A foreign page: refused whatever its body type.
        let foreign =
            local.check(&Method::POST, host, &headers(&[("origin", "https://evil.example"), json, len]));
        assert_eq!(foreign.unwrap_err().status, StatusCode::FORBIDDEN);
        let null = local.check(&Method::POST, host, &headers(&[("origin", "null"), json, len]));
        assert_eq!(null.unwrap_err().status, StatusCode::FORBIDDEN);
        // Fetch metadata without an Origin.
        let metadata =
            local.check(&Method::POST, host, &headers(&[("sec-fetch-site", "cross-site"), json, len]));
        assert_eq!(metadata.unwrap_err().status, StatusCode::FORBIDDEN);
        // Its own origin, an allowed one, and a client that is no browser go on.
        local
            .check(&Method::POST, host, &headers(&[("origin", "http://127.0.0.1:8080"), json, len]))
            .unwrap();
        local
            .check(&Method::POST, host, &headers(&[("origin", "http://localhost:5173"), json, len]))
            .unwrap();
        local.check(&Method::POST, host, &headers(&[json, len])).unwrap();
        local.check(&Method::POST, host, &HeaderMap::new()).unwrap();
        // Simple body types, even from no origin at all, and a typeless body.
        for simple in SIMPLE_BODY_TYPES {
            let refused =
                local.check(&Method::POST, host, &headers(&[("content-type", simple), len])).unwrap_err();
            assert_eq!(refused.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{simple}");
        }
        let typeless = local.check(&Method::POST, host, &headers(&[len])).unwrap_err();
        assert_eq!(typeless.status, StatusCode::UNSUPPORTED_MEDIA_TYPE);
        // Reads stay open to any origin (CORS keeps their answers from foreign pages).
        local.check(&Method::GET, host, &headers(&[("origin", "https://evil.example")])).unwrap();
    }

    #[test]
    fn a_websocket_upgrade_checks_its_origin() {
        let local = site("127.0.0.1:8080", &[], &[]);
        let host = Some("localhost:8080");
        let upgrade = ("upgrade", "websocket");
        let refused =
            local.check(&Method::GET, host, &headers(&[upgrade, ("origin", "http://evil.example")]));
        assert_eq!(refused.unwrap_err().status, StatusCode::FORBIDDEN);
        local.check(&Method::GET, host, &headers(&[upgrade, ("origin", "http://localhost:8080")])).unwrap();
    }

    #[test]
    fn default_ports_are_the_same_origin() {
        let site = site("0.0.0.0:80", &["hermes.example"], &[]);
        let json = [("content-type", "application/json"), ("origin", "https://hermes.example")];
        site.check(&Method::POST, Some("hermes.example"), &headers(&json)).unwrap();
        site.check(&Method::POST, Some("hermes.example:443"), &headers(&json)).unwrap();
        assert!(site.check(&Method::POST, Some("hermes.example:8443"), &headers(&json)).is_err());
    }
}
