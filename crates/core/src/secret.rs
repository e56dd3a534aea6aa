//! Values that carry a credential and so must never be printed: a URL or DSN whose user info
//! holds a user and password (or a token), or whose query names a secret (`?token=...`). A
//! [`SecretUrl`] formats (`Display`, `Debug`) and serializes redacted, so a log line, an error,
//! a metric label or a printed config can hold one without leaking it; only [`SecretUrl::expose`]
//! gives the credential back, for the code that connects with it.
//!
//! Every URL setting that can carry a credential (the NATS URL of every service, the CLI and
//! `hermes up`) is one of these.

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A URL (or a comma-separated list of them, as a NATS cluster is given) that may carry a
/// credential. Formats and serializes as [`redact_url`] shows it.
#[derive(Clone, Default, PartialEq, Eq, Hash)]
pub struct SecretUrl(String);

impl SecretUrl {
    pub fn new(url: impl Into<String>) -> SecretUrl {
        SecretUrl(url.into())
    }

    /// The URL with its credential, to connect with. Never format it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL as it may be shown: with no user info, and secret query values redacted.
    pub fn redacted(&self) -> String {
        redact_url(&self.0)
    }

    pub fn is_empty(&self) -> bool {
        self.0.trim().is_empty()
    }

    /// `text` (another library's error, say) with every credential this URL holds, and the
    /// URL itself, replaced by what may be shown.
    pub fn scrub(&self, text: &str) -> String {
        let mut text = text.to_owned();
        for url in self.0.split(',').map(str::trim).filter(|u| !u.is_empty()) {
            text = text.replace(url, &redact_url(url));
            for secret in credentials(url) {
                text = text.replace(secret, crate::redact::REDACTED);
            }
        }
        crate::redact::redact_text(&text).into_owned()
    }
}

impl From<String> for SecretUrl {
    fn from(url: String) -> SecretUrl {
        SecretUrl(url)
    }
}

impl From<&str> for SecretUrl {
    fn from(url: &str) -> SecretUrl {
        SecretUrl(url.to_owned())
    }
}

impl From<&String> for SecretUrl {
    fn from(url: &String) -> SecretUrl {
        SecretUrl(url.clone())
    }
}

impl From<&SecretUrl> for SecretUrl {
    fn from(url: &SecretUrl) -> SecretUrl {
        url.clone()
    }
}

impl fmt::Display for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl fmt::Debug for SecretUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("SecretUrl").field(&self.redacted()).finish()
    }
}

impl Serialize for SecretUrl {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.redacted())
    }
}

impl<'de> Deserialize<'de> for SecretUrl {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<SecretUrl, D::Error> {
        String::deserialize(deserializer).map(SecretUrl)
    }
}

impl std::str::FromStr for SecretUrl {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<SecretUrl, Self::Err> {
        Ok(SecretUrl(s.to_owned()))
    }
}

/// One URL cut where its user info is: `scheme://`, the user info if any, and the rest. The
/// user info ends at the last `@` before the query: a password may hold `@` or `/` unescaped,
/// and showing too little of a path is better than showing a password. `None`: not a URL.
fn split_userinfo(url: &str) -> Option<(&str, Option<&str>, &str)> {
    let scheme_end = url.find("://")? + 3;
    let (scheme, rest) = url.split_at(scheme_end);
    let query_start = rest.find(['?', '#']).unwrap_or(rest.len());
    Some(match rest[..query_start].rfind('@') {
        Some(at) => (scheme, Some(&rest[..at]), &rest[at + 1..]),
        None => (scheme, None, rest),
    })
}

/// `url` with its `user:password@` (or `token@`) taken out and nothing else changed, for a
/// client library that is given the credentials some other way and must never hold them where
/// it might log them. Text that is not a URL is returned as is.
pub fn without_userinfo(url: &str) -> String {
    match split_userinfo(url) {
        Some((scheme, Some(_), rest)) => format!("{scheme}{rest}"),
        _ => url.to_owned(),
    }
}

/// The credentials in one URL: its user info's password (or lone token) and its secret query
/// values.
fn credentials(url: &str) -> Vec<&str> {
    let mut found = Vec::new();
    let Some((_, userinfo, rest)) = split_userinfo(url) else { return found };
    if let Some(userinfo) = userinfo {
        match userinfo.split_once(':') {
            Some((_, password)) => found.push(password),
            None => found.push(userinfo),
        }
    }
    if let Some((_, query)) = rest.split_once('?') {
        for pair in query.split(['&', '#']) {
            if let Some((key, value)) = pair.split_once('=')
                && crate::redact::is_secret_key(key)
            {
                found.push(value);
            }
        }
    }
    found.retain(|s| s.len() >= 3);
    found
}

/// `url` (one URL, or a comma-separated list) as it may be shown: any `user:password@` (or
/// `token@`) taken out, and the values of query parameters whose names name a secret
/// (`?token=`, `&password=`) redacted. Text that is not a URL is redacted as free text
/// ([`crate::redact::redact_text`]), so a malformed URL cannot carry its password out either.
pub fn redact_url(url: &str) -> String {
    if url.contains(',') {
        return url.split(',').map(|u| redact_url(u.trim())).collect::<Vec<_>>().join(",");
    }
    let Some((scheme, _, after_userinfo)) = split_userinfo(url) else {
        return crate::redact::redact_text(url).into_owned();
    };
    let host_end = after_userinfo.find(['/', '?', '#']).unwrap_or(after_userinfo.len());
    let (host, tail) = after_userinfo.split_at(host_end);
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let (query, fragment) = match query.split_once('#') {
                Some((q, f)) => (q, Some(f)),
                None => (query, None),
            };
            let query: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, value)) if crate::redact::is_secret_key(key) && !value.is_empty() => {
                        format!("{key}={}", crate::redact::REDACTED)
                    }
                    _ => pair.to_owned(),
                })
                .collect();
            let fragment = fragment.map(|f| format!("#{f}")).unwrap_or_default();
            format!("{path}?{}{fragment}", query.join("&"))
        }
        None => tail.to_owned(),
    };
    format!("{scheme}{host}{tail}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_userinfo_keeps_the_address_only() {
        assert_eq!(without_userinfo("nats://hermes:p@ss/w@127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(without_userinfo("tls://tok3n@nats.example:4222"), "tls://nats.example:4222");
        assert_eq!(without_userinfo("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        assert_eq!(without_userinfo("127.0.0.1:4222"), "127.0.0.1:4222");
    }

    #[test]
    fn credentials_never_print() {
        let url = SecretUrl::new("nats://hermes:s3cr3t-pw@127.0.0.1:4222");
        for shown in [
            url.to_string(),
            format!("{url:?}"),
            serde_json::to_string(&url).unwrap(),
            toml::to_string(&std::collections::BTreeMap::from([("url", url.clone())])).unwrap(),
        ] {
            assert!(!shown.contains("s3cr3t-pw") && !shown.contains("hermes@"), "{shown}");
            assert!(shown.contains("127.0.0.1:4222"), "{shown}");
        }
        assert_eq!(url.expose(), "nats://hermes:s3cr3t-pw@127.0.0.1:4222");
        let parsed: SecretUrl = serde_json::from_str("\"nats://u:p@h:1\"").unwrap();
        assert_eq!(parsed.expose(), "nats://u:p@h:1");
    }

    #[test]
    fn every_shape_of_credential_is_taken_out() {
        let cases = [
            ("nats://hermes:pw1@127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("nats://tok3n@127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("tls://u:p@a:1, tls://u:p@b:2", "tls://a:1,tls://b:2"),
            ("nats://u:p@ss/w@rd@h:4222", "nats://h:4222"),
            ("https://h/v1?api_key=k-1&model=m", "https://h/v1?api_key=[REDACTED]&model=m"),
            ("postgres://h/db?password=x#frag", "postgres://h/db?password=[REDACTED]#frag"),
            ("nats://127.0.0.1:4222", "nats://127.0.0.1:4222"),
            ("not a url password=pw2", "not a url password=[REDACTED]"),
        ];
        for (url, shown) in cases {
            assert_eq!(redact_url(url), shown, "{url}");
        }
        let url = SecretUrl::new("nats://hermes:pw-x1@h:1,nats://t0ken@h:2");
        let scrubbed = url.scrub("failed nats://hermes:pw-x1@h:1: auth pw-x1 t0ken");
        assert!(!scrubbed.contains("pw-x1") && !scrubbed.contains("t0ken"), "{scrubbed}");
    }
}
