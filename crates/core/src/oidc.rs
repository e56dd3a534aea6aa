//! OIDC access tokens on the API doors: JWTs an identity provider signed, verified against the
//! keys it publishes (its JWKS), beside the static API tokens of [`crate::access`].
//!
//! An issuer is an `[[oidc]]` entry of the API tokens file:
//!
//! ```toml
//! [[oidc]]
//! issuer = "https://login.example.com/realms/acme"  # the tokens' `iss`, exactly
//! audience = "hermes"                              # must be in the tokens' `aud`
//! # jwks_url = "https://.../certs"                 # default: the issuer's discovery document
//! tenant_claim = "hermes_tenant"                   # or `tenant = "team-a"` for every token
//! roles_claim = "realm_access.roles"               # default `roles`
//! [oidc.role_map]                                  # claim value -> Hermes roles
//! "hermes-operators" = ["operator", "approver"]
//! ```
//!
//! What is checked, in order: the token's shape (three base64url parts, at most
//! [`MAX_TOKEN_BYTES`]); its `iss` names a configured issuer; its header's `alg` is one the issuer
//! accepts (`RS256`, `RS384`, `RS512`, `PS256`, `PS384`, `PS512`, `ES256`, `ES384`, `EdDSA`;
//! never `none` nor a shared-secret `HS*`) and its `crit` is empty; the signature verifies
//! with the issuer's key of the header's `kid` (of the key type the algorithm needs); then the
//! claims: `exp` present and not past, `nbf` and `iat` not in the future, each with the issuer's
//! clock skew; `aud` holds the audience. The caller is then `<issuer>#<name_claim>` (default `sub`),
//! in the tenant of `tenant` or of `tenant_claim` (a tenant word; one of `tenants` when that
//! list is given), with the roles of `roles` plus those its `roles_claim` values map to.
//!
//! Keys ([`Keys`]) are fetched when first needed, kept, and fetched again in the background once
//! older than [`KEYS_REFRESH`]; a token whose `kid` is not among them has them fetched again at
//! once (no more often than every [`KEYS_MIN_REFETCH`] per issuer, so tokens with made-up key
//! ids cannot drive requests to the provider), which is how a provider's new signing key is
//! taken. A failed fetch keeps the keys before it. The keys' URL must be `https`, or `http` on a
//! loopback address.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use serde::Deserialize;

use crate::Error;
use crate::access::{Principal, Role};

/// The longest token looked at; a longer one is refused unread.
pub const MAX_TOKEN_BYTES: usize = 16 * 1024;
/// How old an issuer's keys may get before they are fetched again (in the background, the keys
/// in hand still used meanwhile).
pub const KEYS_REFRESH: Duration = Duration::from_secs(300);
/// The least time between two fetches of an issuer's keys for tokens naming unknown keys.
pub const KEYS_MIN_REFETCH: Duration = Duration::from_secs(10);
/// How long a fetch of a discovery document or a key set may take.
const FETCH_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest discovery document or key set read.
const MAX_DOCUMENT_BYTES: usize = 1024 * 1024;

/// A signature algorithm a token may be signed with. Shared-secret (`HS*`) and `none` tokens
/// are never accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum Algorithm {
    RS256,
    RS384,
    RS512,
    PS256,
    PS384,
    PS512,
    ES256,
    ES384,
    EdDSA,
}

impl Algorithm {
    const ALL: [Algorithm; 9] = [
        Algorithm::RS256,
        Algorithm::RS384,
        Algorithm::RS512,
        Algorithm::PS256,
        Algorithm::PS384,
        Algorithm::PS512,
        Algorithm::ES256,
        Algorithm::ES384,
        Algorithm::EdDSA,
    ];

    fn named(name: &str) -> Option<Algorithm> {
        Algorithm::ALL.into_iter().find(|a| a.name() == name)
    }

    fn name(self) -> &'static str {
        match self {
            Algorithm::RS256 => "RS256",
            Algorithm::RS384 => "RS384",
            Algorithm::RS512 => "RS512",
            Algorithm::PS256 => "PS256",
            Algorithm::PS384 => "PS384",
            Algorithm::PS512 => "PS512",
            Algorithm::ES256 => "ES256",
            Algorithm::ES384 => "ES384",
            Algorithm::EdDSA => "EdDSA",
        }
    }

    /// Verifies `signature` over `message` with `key`, which must be of this algorithm's type.
    fn verify(self, key: &Jwk, message: &[u8], signature: &[u8]) -> bool {
        use ring::signature as sig;
        match (self, &key.material) {
            (Algorithm::RS256 | Algorithm::RS384 | Algorithm::RS512, KeyMaterial::Rsa { n, e })
            | (Algorithm::PS256 | Algorithm::PS384 | Algorithm::PS512, KeyMaterial::Rsa { n, e }) => {
                let params: &sig::RsaParameters = match self {
                    Algorithm::RS256 => &sig::RSA_PKCS1_2048_8192_SHA256,
                    Algorithm::RS384 => &sig::RSA_PKCS1_2048_8192_SHA384,
                    Algorithm::RS512 => &sig::RSA_PKCS1_2048_8192_SHA512,
                    Algorithm::PS256 => &sig::RSA_PSS_2048_8192_SHA256,
                    Algorithm::PS384 => &sig::RSA_PSS_2048_8192_SHA384,
                    _ => &sig::RSA_PSS_2048_8192_SHA512,
                };
                sig::RsaPublicKeyComponents { n, e }.verify(params, message, signature).is_ok()
            }
            (Algorithm::ES256, KeyMaterial::Ec { curve: Curve::P256, point }) => {
                sig::UnparsedPublicKey::new(&sig::ECDSA_P256_SHA256_FIXED, point)
                    .verify(message, signature)
                    .is_ok()
            }
            (Algorithm::ES384, KeyMaterial::Ec { curve: Curve::P384, point }) => {
                sig::UnparsedPublicKey::new(&sig::ECDSA_P384_SHA384_FIXED, point)
                    .verify(message, signature)
                    .is_ok()
            }
            (Algorithm::EdDSA, KeyMaterial::Ed25519(public)) => {
                sig::UnparsedPublicKey::new(&sig::ED25519, public).verify(message, signature).is_ok()
            }
            _ => false,
        }
    }

    /// Whether `key` is of the type this algorithm signs with.
    fn fits(self, key: &Jwk) -> bool {
        matches!(
            (self, &key.material),
            (
                Algorithm::RS256
                    | Algorithm::RS384
                    | Algorithm::RS512
                    | Algorithm::PS256
                    | Algorithm::PS384
                    | Algorithm::PS512,
                KeyMaterial::Rsa { .. }
            ) | (Algorithm::ES256, KeyMaterial::Ec { curve: Curve::P256, .. })
                | (Algorithm::ES384, KeyMaterial::Ec { curve: Curve::P384, .. })
                | (Algorithm::EdDSA, KeyMaterial::Ed25519(_))
        ) && key.alg.as_deref().is_none_or(|alg| alg == self.name())
    }
}

/// One `[[oidc]]` entry of the API tokens file: an identity provider whose tokens are callers.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Issuer {
    /// The tokens' `iss`, compared exactly.
    pub issuer: String,
    /// A value the tokens' `aud` must hold.
    pub audience: String,
    /// Where the keys are; absent, the `jwks_uri` of `<issuer>/.well-known/openid-configuration`.
    #[serde(default)]
    pub jwks_url: Option<String>,
    /// The algorithms accepted; all of [`Algorithm`] when absent. Another name (`HS256`,
    /// `none`) does not parse.
    #[serde(default)]
    pub algorithms: Option<Vec<Algorithm>>,
    /// How far clocks may disagree, in seconds, for `exp`, `nbf` and `iat` (default 60).
    #[serde(default = "default_skew")]
    pub clock_skew_s: u64,
    /// The least time, in seconds, between two fetches of the keys for tokens naming a key not
    /// among them (default 10, [`KEYS_MIN_REFETCH`]).
    #[serde(default = "default_min_refetch")]
    pub min_refetch_s: u64,
    /// The claim naming the caller (default `sub`): its name in the audit trail and the logs.
    #[serde(default = "default_name_claim")]
    pub name_claim: String,
    /// The tenant of every token of this issuer; or see `tenant_claim`.
    #[serde(default)]
    pub tenant: Option<String>,
    /// The claim (a dotted path into the claims) holding the caller's tenant.
    #[serde(default)]
    pub tenant_claim: Option<String>,
    /// With `tenant_claim`: the only tenants a token may name; any tenant word when empty.
    #[serde(default)]
    pub tenants: Vec<String>,
    /// The claim (a dotted path) holding the caller's roles: a list of strings, or one string
    /// of words separated by spaces (as `scope`). Default `roles`.
    #[serde(default = "default_roles_claim")]
    pub roles_claim: String,
    /// Roles every token of this issuer has.
    #[serde(default)]
    pub roles: Vec<Role>,
    /// What each value of the roles claim grants. Without a map, a value that names a Hermes
    /// role (`viewer`, `submitter`, ...) grants it and others grant nothing; with one, only the
    /// map's values grant roles.
    #[serde(default)]
    pub role_map: BTreeMap<String, Vec<Role>>,
    /// CA certificates (a PEM file) trusted for fetching the keys, besides the system's: a
    /// provider with a private CA, as a Kubernetes API server.
    #[serde(default)]
    pub ca_file: Option<String>,
    /// A file whose content is sent as a bearer token with each fetch of the keys (read again at
    /// each fetch: a Kubernetes service-account token is renewed in place).
    #[serde(default)]
    pub bearer_token_file: Option<String>,
}

fn default_skew() -> u64 {
    60
}

fn default_min_refetch() -> u64 {
    KEYS_MIN_REFETCH.as_secs()
}

fn default_name_claim() -> String {
    "sub".into()
}

fn default_roles_claim() -> String {
    "roles".into()
}

impl Issuer {
    /// An issuer whose tokens are checked for their signature, times and audience only, read
    /// with [`Keys::verify_claims`] (no caller, tenant or roles come of them): `jwks_url` empty
    /// for discovery, `ca_file` and `bearer_token_file` empty for none. `what` names it in errors.
    pub fn for_claims(
        what: &str,
        issuer: &str,
        audience: &str,
        jwks_url: &str,
        ca_file: &str,
        bearer_token_file: &str,
    ) -> anyhow::Result<Issuer> {
        let some = |s: &str| (!s.trim().is_empty()).then(|| s.trim().to_owned());
        anyhow::ensure!(!issuer.trim().is_empty(), "{what}: the issuer is empty");
        anyhow::ensure!(!audience.trim().is_empty(), "{what}: the audience is empty");
        let jwks_url = some(jwks_url);
        let fetched = jwks_url.clone().unwrap_or_else(|| discovery_url(issuer.trim()));
        check_fetch_url(&fetched).map_err(|e| anyhow::anyhow!("{what}: the keys' URL {e}"))?;
        let ca_file = some(ca_file);
        if let Some(file) = &ca_file {
            client_trusting(file).map_err(|e| anyhow::anyhow!("{what}: {e}"))?;
        }
        Ok(Issuer {
            issuer: issuer.trim().to_owned(),
            audience: audience.trim().to_owned(),
            jwks_url,
            algorithms: None,
            clock_skew_s: default_skew(),
            min_refetch_s: default_min_refetch(),
            name_claim: default_name_claim(),
            tenant: None,
            tenant_claim: None,
            tenants: Vec::new(),
            roles_claim: default_roles_claim(),
            roles: Vec::new(),
            role_map: BTreeMap::new(),
            ca_file,
            bearer_token_file: some(bearer_token_file),
        })
    }

    /// Checks the entry, naming it in errors.
    pub fn check(&self) -> anyhow::Result<()> {
        let name = &self.issuer;
        anyhow::ensure!(!name.trim().is_empty(), "an [[oidc]] entry has no issuer");
        anyhow::ensure!(!self.audience.trim().is_empty(), "[[oidc]] `{name}`: audience is empty");
        match &self.jwks_url {
            Some(url) => {
                check_fetch_url(url).map_err(|e| anyhow::anyhow!("[[oidc]] `{name}`: jwks_url {e}"))?
            }
            None => check_fetch_url(&discovery_url(name))
                .map_err(|e| anyhow::anyhow!("[[oidc]] `{name}`: the issuer, without jwks_url, {e}"))?,
        }
        anyhow::ensure!(
            self.algorithms.as_ref().is_none_or(|a| !a.is_empty()),
            "[[oidc]] `{name}`: algorithms is empty"
        );
        anyhow::ensure!(self.clock_skew_s <= 600, "[[oidc]] `{name}`: clock_skew_s is over 600");
        if let Some(file) = &self.ca_file {
            client_trusting(file).map_err(|e| anyhow::anyhow!("[[oidc]] `{name}`: {e}"))?;
        }
        anyhow::ensure!(
            (1..=3600).contains(&self.min_refetch_s),
            "[[oidc]] `{name}`: min_refetch_s must be 1 to 3600"
        );
        match (&self.tenant, &self.tenant_claim) {
            (Some(tenant), None) => {
                crate::ids::check_id("tenant", tenant, 64, crate::ids::IdShape::Word)?;
                anyhow::ensure!(
                    self.tenants.is_empty(),
                    "[[oidc]] `{name}`: `tenants` goes with tenant_claim"
                );
            }
            (None, Some(claim)) => {
                anyhow::ensure!(!claim.trim().is_empty(), "[[oidc]] `{name}`: tenant_claim is empty");
                for tenant in &self.tenants {
                    crate::ids::check_id("tenant", tenant, 64, crate::ids::IdShape::Word)?;
                }
            }
            _ => anyhow::bail!("[[oidc]] `{name}`: give one of `tenant` and `tenant_claim`"),
        }
        Ok(())
    }

    fn min_refetch(&self) -> Duration {
        Duration::from_secs(self.min_refetch_s)
    }

    /// Whether tokens signed with `alg` are accepted.
    fn accepts(&self, alg: Algorithm) -> bool {
        self.algorithms.as_ref().is_none_or(|accepted| accepted.contains(&alg))
    }

    /// Tenants this issuer's tokens may be in: `Some` of its fixed tenant or allow-list, `None`
    /// when a claim may name any tenant.
    pub fn known_tenants(&self) -> Option<Vec<String>> {
        match (&self.tenant, self.tenants.is_empty()) {
            (Some(tenant), _) => Some(vec![tenant.clone()]),
            (None, false) => Some(self.tenants.clone()),
            (None, true) => None,
        }
    }

    /// The caller of verified `claims`.
    fn principal(&self, claims: &serde_json::Value) -> Result<Principal, Error> {
        let refused = |reason: String| Error::Unauthenticated(reason);
        let name = match claim(claims, &self.name_claim) {
            // Named with its issuer: two providers' equal subjects are two callers (their watch
            // limits, their audit records), and neither is a static token of that name.
            Some(serde_json::Value::String(s)) if !s.is_empty() => {
                format!("{}#{}", self.issuer, s.chars().take(200).collect::<String>())
            }
            _ => {
                return Err(refused(format!(
                    "the token has no `{}` claim naming the caller",
                    self.name_claim
                )));
            }
        };
        let tenant = match (&self.tenant, &self.tenant_claim) {
            (Some(tenant), _) => tenant.clone(),
            (None, Some(path)) => {
                let Some(serde_json::Value::String(tenant)) = claim(claims, path) else {
                    return Err(refused(format!("the token has no `{path}` claim naming a tenant")));
                };
                if crate::ids::check_id("tenant", tenant, 64, crate::ids::IdShape::Word).is_err()
                    || !(self.tenants.is_empty() || self.tenants.contains(tenant))
                {
                    return Err(refused(format!(
                        "the token's tenant `{}` is not one this issuer may name",
                        tenant.chars().take(64).collect::<String>()
                    )));
                }
                tenant.clone()
            }
            (None, None) => return Err(refused("the issuer has no tenant configured".into())),
        };
        let mut roles = self.roles.clone();
        let values: Vec<&str> = match claim(claims, &self.roles_claim) {
            Some(serde_json::Value::Array(items)) => items.iter().filter_map(|v| v.as_str()).collect(),
            Some(serde_json::Value::String(words)) => words.split_whitespace().collect(),
            _ => Vec::new(),
        };
        for value in values {
            let granted: Vec<Role> = if self.role_map.is_empty() {
                Role::named(value).into_iter().collect()
            } else {
                self.role_map.get(value).cloned().unwrap_or_default()
            };
            for role in granted {
                if !roles.contains(&role) {
                    roles.push(role);
                }
            }
        }
        Ok(Principal::new(name, Some(tenant), roles))
    }
}

/// A dotted path into the claims (`realm_access.roles`).
fn claim<'a>(claims: &'a serde_json::Value, path: &str) -> Option<&'a serde_json::Value> {
    path.split('.').try_fold(claims, |value, part| value.get(part))
}

fn discovery_url(issuer: &str) -> String {
    format!("{}/.well-known/openid-configuration", issuer.trim_end_matches('/'))
}

/// A URL keys may be fetched from: `https`, or `http` to a loopback address.
fn check_fetch_url(url: &str) -> Result<(), String> {
    let parsed = url::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
    let loopback = match parsed.host() {
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        Some(url::Host::Domain(d)) => d == "localhost",
        None => false,
    };
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if loopback => Ok(()),
        _ => Err(format!("`{url}` must be https (http only to a loopback address)")),
    }
}

/// Whether a bearer credential has a JWT's shape (three base64url parts, a JSON header first).
pub fn looks_like_jwt(token: &str) -> bool {
    token.starts_with("eyJ") && token.bytes().filter(|b| *b == b'.').count() == 2
}

#[derive(Debug, Clone)]
enum Curve {
    P256,
    P384,
}

#[derive(Debug, Clone)]
enum KeyMaterial {
    Rsa {
        n: Vec<u8>,
        e: Vec<u8>,
    },
    /// The uncompressed point (`04 || x || y`).
    Ec {
        curve: Curve,
        point: Vec<u8>,
    },
    Ed25519(Vec<u8>),
}

/// A verification key of a key set.
#[derive(Debug, Clone)]
struct Jwk {
    kid: Option<String>,
    alg: Option<String>,
    material: KeyMaterial,
}

#[derive(Deserialize)]
struct RawJwk {
    kty: String,
    #[serde(default)]
    kid: Option<String>,
    #[serde(default)]
    alg: Option<String>,
    #[serde(default, rename = "use")]
    usage: Option<String>,
    #[serde(default)]
    n: Option<String>,
    #[serde(default)]
    e: Option<String>,
    #[serde(default)]
    crv: Option<String>,
    #[serde(default)]
    x: Option<String>,
    #[serde(default)]
    y: Option<String>,
}

fn b64(part: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(part.trim_end_matches('=')).ok()
}

impl RawJwk {
    /// The key, or `None` for a key that is not for signatures or not of a type verified here
    /// (skipped: a set may hold encryption keys and others).
    fn key(self) -> Option<Jwk> {
        if self.usage.as_deref().is_some_and(|u| u != "sig") {
            return None;
        }
        let material = match (self.kty.as_str(), self.crv.as_deref()) {
            ("RSA", _) => KeyMaterial::Rsa { n: b64(self.n.as_deref()?)?, e: b64(self.e.as_deref()?)? },
            ("EC", Some(crv @ ("P-256" | "P-384"))) => {
                let (x, y) = (b64(self.x.as_deref()?)?, b64(self.y.as_deref()?)?);
                let (curve, size) = if crv == "P-256" { (Curve::P256, 32) } else { (Curve::P384, 48) };
                if x.len() != size || y.len() != size {
                    return None;
                }
                let mut point = vec![4u8];
                point.extend_from_slice(&x);
                point.extend_from_slice(&y);
                KeyMaterial::Ec { curve, point }
            }
            ("OKP", Some("Ed25519")) => KeyMaterial::Ed25519(b64(self.x.as_deref()?)?),
            _ => return None,
        };
        Some(Jwk { kid: self.kid, alg: self.alg, material })
    }
}

/// The keys of a JWKS document: those verified here, the others skipped.
fn parse_key_set(body: &[u8]) -> anyhow::Result<Vec<Jwk>> {
    #[derive(Deserialize)]
    struct Set {
        keys: Vec<serde_json::Value>,
    }
    let set: Set = serde_json::from_slice(body).map_err(|e| anyhow::anyhow!("not a JWKS document: {e}"))?;
    Ok(set
        .keys
        .into_iter()
        .filter_map(|k| serde_json::from_value::<RawJwk>(k).ok())
        .filter_map(RawJwk::key)
        .collect())
}

/// One issuer's keys as last fetched.
#[derive(Default)]
struct IssuerKeys {
    keys: std::sync::RwLock<Option<(Arc<Vec<Jwk>>, Instant)>>,
    /// When a fetch was last tried, for [`KEYS_MIN_REFETCH`].
    tried: std::sync::Mutex<Option<Instant>>,
    /// One fetch at a time.
    fetching: tokio::sync::Mutex<()>,
}

impl IssuerKeys {
    /// Whether a fetch was tried less than `ago` ago.
    fn tried_within(&self, ago: Duration) -> bool {
        self.tried.lock().unwrap_or_else(|p| p.into_inner()).is_some_and(|t| t.elapsed() < ago)
    }
}

/// An issuer and the keys' URL it was configured with.
type IssuerKey = (String, Option<String>);

/// The issuers' keys, kept across reloads of the tokens file (by issuer and keys' URL), and the
/// verification of tokens against them.
pub struct Keys {
    client: reqwest::Client,
    by_issuer: std::sync::Mutex<HashMap<IssuerKey, Arc<IssuerKeys>>>,
}

/// How keys are fetched: bounded in time, and never redirected elsewhere.
fn fetching_client() -> reqwest::ClientBuilder {
    reqwest::Client::builder().timeout(FETCH_TIMEOUT).redirect(reqwest::redirect::Policy::none())
}

impl Default for Keys {
    fn default() -> Self {
        let client = fetching_client().build().unwrap_or_default();
        Keys { client, by_issuer: Default::default() }
    }
}

impl std::fmt::Debug for Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Keys").finish_non_exhaustive()
    }
}

/// A token taken apart, its signature not yet checked.
struct Parts<'a> {
    signed: &'a str,
    signature: Vec<u8>,
    alg: String,
    kid: Option<String>,
    claims: serde_json::Value,
}

fn split(token: &str) -> Result<Parts<'_>, Error> {
    let malformed = || Error::Unauthenticated("the token is not a well-formed JWT".into());
    if token.len() > MAX_TOKEN_BYTES {
        return Err(Error::Unauthenticated(format!("the token is over {MAX_TOKEN_BYTES} bytes")));
    }
    let (signed, signature) = token.rsplit_once('.').ok_or_else(malformed)?;
    let (header, payload) = signed.split_once('.').ok_or_else(malformed)?;
    #[derive(Deserialize)]
    struct Header {
        alg: String,
        #[serde(default)]
        kid: Option<String>,
        #[serde(default)]
        crit: Option<serde_json::Value>,
    }
    let header: Header =
        serde_json::from_slice(&b64(header).ok_or_else(malformed)?).map_err(|_| malformed())?;
    if header.crit.is_some() {
        return Err(Error::Unauthenticated("the token names critical header extensions (`crit`)".into()));
    }
    let claims: serde_json::Value =
        serde_json::from_slice(&b64(payload).ok_or_else(malformed)?).map_err(|_| malformed())?;
    if !claims.is_object() {
        return Err(malformed());
    }
    Ok(Parts {
        signed,
        signature: b64(signature).ok_or_else(malformed)?,
        alg: header.alg,
        kid: header.kid,
        claims,
    })
}

impl Keys {
    /// The caller of a JWT signed by one of `issuers`, or `UNAUTHENTICATED` saying why not.
    pub async fn verify(&self, issuers: &[Arc<Issuer>], token: &str) -> Result<Principal, Error> {
        self.verify_at(issuers, token, crate::now_unix_ms() / 1000).await
    }

    async fn verify_at(&self, issuers: &[Arc<Issuer>], token: &str, now: u64) -> Result<Principal, Error> {
        let (issuer, claims) = self.verify_claims_at(issuers, token, now).await?;
        issuer.principal(&claims)
    }

    /// The issuer and the claims of a JWT signed by one of `issuers`, its signature, times and
    /// audience checked; `UNAUTHENTICATED` saying why not. For callers that read other claims
    /// than a caller's (an agent's identity: `hermes_registry::identities`).
    pub async fn verify_claims(
        &self,
        issuers: &[Arc<Issuer>],
        token: &str,
    ) -> Result<(Arc<Issuer>, serde_json::Value), Error> {
        self.verify_claims_at(issuers, token, crate::now_unix_ms() / 1000).await
    }

    async fn verify_claims_at(
        &self,
        issuers: &[Arc<Issuer>],
        token: &str,
        now: u64,
    ) -> Result<(Arc<Issuer>, serde_json::Value), Error> {
        let refused = |reason: String| Error::Unauthenticated(reason);
        let parts = split(token)?;
        let iss = parts.claims.get("iss").and_then(|v| v.as_str()).unwrap_or_default();
        let issuer = issuers.iter().find(|i| i.issuer == iss).ok_or_else(|| {
            refused(format!(
                "the token's issuer `{}` is not trusted",
                iss.chars().take(200).collect::<String>()
            ))
        })?;
        let alg = Algorithm::named(&parts.alg).filter(|a| issuer.accepts(*a)).ok_or_else(|| {
            refused(format!(
                "the token's algorithm `{}` is not accepted",
                parts.alg.chars().take(20).collect::<String>()
            ))
        })?;
        let keys = self.keys_for(issuer, parts.kid.as_deref(), alg).await?;
        let message = parts.signed.as_bytes();
        let verified = keys
            .iter()
            .filter(|k| alg.fits(k) && (parts.kid.is_none() || k.kid == parts.kid))
            .any(|k| alg.verify(k, message, &parts.signature));
        if !verified {
            return Err(refused("the token's signature does not verify".into()));
        }
        check_claims(issuer, &parts.claims, now)?;
        Ok((issuer.clone(), parts.claims))
    }

    fn entry(&self, issuer: &Issuer) -> Arc<IssuerKeys> {
        let mut map = self.by_issuer.lock().unwrap_or_else(|p| p.into_inner());
        map.entry((issuer.issuer.clone(), issuer.jwks_url.clone())).or_default().clone()
    }

    /// The issuer's keys, with one for `kid` (of `alg`'s type when no `kid`) fetched again when
    /// missing, as [`KEYS_MIN_REFETCH`] allows.
    async fn keys_for(
        &self,
        issuer: &Issuer,
        kid: Option<&str>,
        alg: Algorithm,
    ) -> Result<Arc<Vec<Jwk>>, Error> {
        let entry = self.entry(issuer);
        let has =
            |keys: &[Jwk]| keys.iter().any(|k| alg.fits(k) && (kid.is_none() || k.kid.as_deref() == kid));
        let held = entry.keys.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((keys, at)) = &held
            && has(keys)
        {
            if at.elapsed() > KEYS_REFRESH {
                self.refresh_in_background(issuer, entry.clone());
            }
            return Ok(keys.clone());
        }
        // Not there: fetch them again, unless that was just tried.
        let _one = entry.fetching.lock().await;
        let held = entry.keys.read().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some((keys, _)) = &held
            && has(keys)
        {
            return Ok(keys.clone());
        }
        let recently = entry.tried_within(issuer.min_refetch());
        if !recently && let Err(e) = fetch(&self.client, issuer, &entry).await {
            tracing::warn!(issuer = %issuer.issuer, error = %format!("{e:#}"), event = "oidc_keys_fetch_failed", "cannot fetch an OIDC issuer's keys");
            if held.is_none() {
                return Err(Error::Unavailable(format!(
                    "the keys of issuer `{}` cannot be fetched now",
                    issuer.issuer
                )));
            }
        }
        let keys = entry.keys.read().unwrap_or_else(|p| p.into_inner()).clone();
        match keys {
            Some((keys, _)) if has(&keys) => Ok(keys),
            // No keys yet (the provider unreachable so far): not the caller's fault.
            None => Err(Error::Unavailable(format!(
                "the keys of issuer `{}` cannot be fetched now",
                issuer.issuer
            ))),
            _ => Err(Error::Unauthenticated(match kid {
                Some(kid) => format!(
                    "the token's signing key `{}` is not one of the issuer's keys",
                    kid.chars().take(100).collect::<String>()
                ),
                None => "the issuer has no key for the token's algorithm".into(),
            })),
        }
    }

    fn refresh_in_background(&self, issuer: &Issuer, entry: Arc<IssuerKeys>) {
        if entry.tried_within(issuer.min_refetch()) || entry.fetching.try_lock().is_err() {
            return;
        }
        let (client, issuer) = (self.client.clone(), issuer.clone());
        tokio::spawn(async move {
            let _one = entry.fetching.lock().await;
            // Requests may have spawned several of these meanwhile: one fetch is enough.
            if entry.tried_within(issuer.min_refetch()) {
                return;
            }
            if let Err(e) = fetch(&client, &issuer, &entry).await {
                tracing::warn!(issuer = %issuer.issuer, error = %format!("{e:#}"), event = "oidc_keys_fetch_failed", "cannot fetch an OIDC issuer's keys; the keys before stay in use");
            }
        });
    }
}

/// Fetches the issuer's keys (through its discovery document without `jwks_url`) into
/// `entry`; a failure keeps the keys before.
async fn fetch(client: &reqwest::Client, issuer: &Issuer, entry: &IssuerKeys) -> anyhow::Result<()> {
    *entry.tried.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
    let own;
    let client = match &issuer.ca_file {
        Some(file) => {
            own = client_trusting(file)?;
            &own
        }
        None => client,
    };
    let bearer = match &issuer.bearer_token_file {
        Some(file) => Some(
            std::fs::read_to_string(file)
                .map_err(|e| anyhow::anyhow!("cannot read bearer_token_file {file}: {e}"))?
                .trim()
                .to_owned(),
        ),
        None => None,
    };
    let get = |url: String| {
        let bearer = bearer.clone();
        async move { get(client, &url, bearer.as_deref()).await }
    };
    let url = match &issuer.jwks_url {
        Some(url) => url.clone(),
        None => {
            #[derive(Deserialize)]
            struct Discovery {
                jwks_uri: String,
            }
            let body = get(discovery_url(&issuer.issuer)).await?;
            let discovery: Discovery = serde_json::from_slice(&body)
                .map_err(|e| anyhow::anyhow!("the discovery document has no jwks_uri: {e}"))?;
            check_fetch_url(&discovery.jwks_uri).map_err(|e| anyhow::anyhow!("its jwks_uri {e}"))?;
            discovery.jwks_uri
        }
    };
    let keys = parse_key_set(&get(url).await?)?;
    tracing::info!(issuer = %issuer.issuer, keys = keys.len(), event = "oidc_keys_fetched", "OIDC issuer's keys fetched");
    *entry.keys.write().unwrap_or_else(|p| p.into_inner()) = Some((Arc::new(keys), Instant::now()));
    Ok(())
}

/// A client for fetching keys that trusts the CA certificates of `file` besides the system's.
fn client_trusting(file: &str) -> anyhow::Result<reqwest::Client> {
    let pem = std::fs::read(file).map_err(|e| anyhow::anyhow!("cannot read ca_file {file}: {e}"))?;
    let certificates = reqwest::Certificate::from_pem_bundle(&pem)
        .map_err(|e| anyhow::anyhow!("ca_file {file} is not PEM certificates: {e}"))?;
    anyhow::ensure!(!certificates.is_empty(), "ca_file {file} holds no certificate");
    let builder = certificates
        .into_iter()
        .fold(fetching_client(), |builder, certificate| builder.add_root_certificate(certificate));
    builder.build().map_err(|e| anyhow::anyhow!("a client trusting {file}: {e}"))
}

async fn get(client: &reqwest::Client, url: &str, bearer: Option<&str>) -> anyhow::Result<Vec<u8>> {
    let mut request = client.get(url);
    if let Some(token) = bearer {
        request = request.bearer_auth(token);
    }
    let mut response = request.send().await.map_err(|e| anyhow::anyhow!("GET {url}: {e}"))?;
    anyhow::ensure!(response.status().is_success(), "GET {url}: {}", response.status());
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| anyhow::anyhow!("GET {url}: {e}"))? {
        body.extend_from_slice(&chunk);
        anyhow::ensure!(body.len() <= MAX_DOCUMENT_BYTES, "GET {url}: over {MAX_DOCUMENT_BYTES} bytes");
    }
    Ok(body)
}

/// The claims' times and audience, `now` in Unix seconds.
fn check_claims(issuer: &Issuer, claims: &serde_json::Value, now: u64) -> Result<(), Error> {
    let refused = |reason: &str| Err(Error::Unauthenticated(reason.into()));
    let skew = issuer.clock_skew_s;
    let time = |name: &str| claims.get(name).and_then(|v| v.as_f64()).map(|t| t.max(0.0) as u64);
    match time("exp") {
        None => return refused("the token has no expiry (`exp`)"),
        Some(exp) if now > exp.saturating_add(skew) => return refused("the token has expired"),
        Some(_) => {}
    }
    if time("nbf").is_some_and(|nbf| nbf > now.saturating_add(skew)) {
        return refused("the token is not valid yet (`nbf`)");
    }
    if time("iat").is_some_and(|iat| iat > now.saturating_add(skew)) {
        return refused("the token was issued in the future (`iat`)");
    }
    let audience = issuer.audience.as_str();
    let holds = match claims.get("aud") {
        Some(serde_json::Value::String(aud)) => aud == audience,
        Some(serde_json::Value::Array(auds)) => auds.iter().any(|a| a.as_str() == Some(audience)),
        _ => false,
    };
    if !holds {
        return refused("the token is not for this audience (`aud`)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ring::signature::KeyPair as _;

    fn issuer() -> Issuer {
        toml::from_str(
            "issuer = \"https://idp.example\"\naudience = \"hermes\"\njwks_url = \"https://idp.example/keys\"\ntenant_claim = \"org\"\n",
        )
        .unwrap()
    }

    fn enc(bytes: &[u8]) -> String {
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
    }

    /// An Ed25519 key, its JWK and a signer.
    struct Signer {
        pair: ring::signature::Ed25519KeyPair,
        kid: String,
    }

    impl Signer {
        fn new(kid: &str) -> Signer {
            let pkcs8 =
                ring::signature::Ed25519KeyPair::generate_pkcs8(&ring::rand::SystemRandom::new()).unwrap();
            Signer {
                pair: ring::signature::Ed25519KeyPair::from_pkcs8(pkcs8.as_ref()).unwrap(),
                kid: kid.into(),
            }
        }

        fn jwk(&self) -> Jwk {
            Jwk {
                kid: Some(self.kid.clone()),
                alg: None,
                material: KeyMaterial::Ed25519(self.pair.public_key().as_ref().to_vec()),
            }
        }

        fn sign(&self, header: serde_json::Value, claims: serde_json::Value) -> String {
            let signed =
                format!("{}.{}", enc(header.to_string().as_bytes()), enc(claims.to_string().as_bytes()));
            let signature = self.pair.sign(signed.as_bytes());
            format!("{signed}.{}", enc(signature.as_ref()))
        }

        fn token(&self, claims: serde_json::Value) -> String {
            self.sign(serde_json::json!({"alg": "EdDSA", "kid": self.kid, "typ": "JWT"}), claims)
        }
    }

    fn keys_with(issuer: &Issuer, jwks: Vec<Jwk>) -> Keys {
        let keys = Keys::default();
        *keys.entry(issuer).keys.write().unwrap() = Some((Arc::new(jwks), Instant::now()));
        // No fetch: the URL is not served in these tests.
        *keys.entry(issuer).tried.lock().unwrap() = Some(Instant::now());
        keys
    }

    const NOW: u64 = 1_800_000_000;

    fn claims() -> serde_json::Value {
        serde_json::json!({"iss": "https://idp.example", "aud": ["other", "hermes"], "sub": "ada", "org": "team-a",
            "roles": ["submitter", "unrelated"], "exp": NOW + 300, "iat": NOW - 10})
    }

    #[tokio::test]
    async fn a_signed_token_is_its_subject_in_its_claimed_tenant_with_its_roles() {
        let (issuer, signer) = (Arc::new(issuer()), Signer::new("k1"));
        let keys = keys_with(&issuer, vec![signer.jwk()]);
        let who = keys.verify_at(std::slice::from_ref(&issuer), &signer.token(claims()), NOW).await.unwrap();
        assert_eq!(who.name, format!("{}#ada", issuer.issuer));
        assert_eq!(who.tenant.as_deref(), Some("team-a"));
        assert!(who.require(crate::access::Need::Submit).is_ok());
        assert!(who.require(crate::access::Need::Operate).is_err());
    }

    #[tokio::test]
    async fn each_bad_token_is_refused_with_its_reason() {
        let (issuer, signer, stranger) = (Arc::new(issuer()), Signer::new("k1"), Signer::new("k1"));
        let keys = keys_with(&issuer, vec![signer.jwk()]);
        let with = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut c = claims();
            f(&mut c);
            c
        };
        let tampered = {
            let token = signer.token(claims());
            let (rest, sig) = token.rsplit_once('.').unwrap();
            let (header, _) = rest.split_once('.').unwrap();
            let forged = with(&|c| c["org"] = "team-b".into());
            format!("{header}.{}.{sig}", enc(forged.to_string().as_bytes()))
        };
        let cases: Vec<(String, &str)> = vec![
            (signer.token(with(&|c| c["exp"] = (NOW - 61).into())), "expired"),
            (
                signer.token(with(&|c| c.as_object_mut().unwrap().remove("exp").map(drop).unwrap_or(()))),
                "no expiry",
            ),
            (signer.token(with(&|c| c["nbf"] = (NOW + 61).into())), "not valid yet"),
            (signer.token(with(&|c| c["iat"] = (NOW + 3600).into())), "in the future"),
            (signer.token(with(&|c| c["aud"] = "other".into())), "audience"),
            (signer.token(with(&|c| c["iss"] = "https://evil.example".into())), "not trusted"),
            (signer.token(with(&|c| c["org"] = "Not A Tenant!".into())), "tenant"),
            (
                signer.token(with(&|c| c.as_object_mut().unwrap().remove("sub").map(drop).unwrap_or(()))),
                "`sub`",
            ),
            (stranger.token(claims()), "signature"),
            (tampered, "signature"),
            (signer.sign(serde_json::json!({"alg": "none", "kid": "k1"}), claims()), "algorithm"),
            (signer.sign(serde_json::json!({"alg": "HS256", "kid": "k1"}), claims()), "algorithm"),
            (signer.sign(serde_json::json!({"alg": "ES256", "kid": "k1"}), claims()), "signing key"),
            (signer.sign(serde_json::json!({"alg": "EdDSA", "kid": "k2"}), claims()), "`k2`"),
            (signer.sign(serde_json::json!({"alg": "EdDSA", "kid": "k1", "crit": ["x"]}), claims()), "crit"),
            ("eyJhbGciOiJFZERTQSJ9.e30".into(), "well-formed"),
            (format!("eyJ{}.a.b", "A".repeat(MAX_TOKEN_BYTES)), "bytes"),
        ];
        for (token, reason) in cases {
            let refused = keys.verify_at(std::slice::from_ref(&issuer), &token, NOW).await.unwrap_err();
            assert_eq!(refused.code(), crate::ErrorCode::Unauthenticated, "{reason}: {refused}");
            assert!(refused.to_string().contains(reason), "{reason}: {refused}");
        }
        // Within the clock skew is accepted.
        let late = signer.token(with(&|c| c["exp"] = (NOW - 59).into()));
        assert!(keys.verify_at(std::slice::from_ref(&issuer), &late, NOW).await.is_ok());
    }

    #[tokio::test]
    async fn roles_and_tenants_follow_the_issuers_mapping() {
        let mut mapped = issuer();
        mapped.roles_claim = "realm.roles".into();
        mapped.role_map = [("ops".to_owned(), vec![Role::Operator, Role::Approver])].into();
        mapped.roles = vec![Role::Viewer];
        mapped.tenants = vec!["team-a".into()];
        let (issuer, signer) = (Arc::new(mapped), Signer::new("k1"));
        let keys = keys_with(&issuer, vec![signer.jwk()]);
        let mut c = claims();
        c["realm"] = serde_json::json!({"roles": ["ops", "submitter"]});
        let who = keys.verify_at(std::slice::from_ref(&issuer), &signer.token(c.clone()), NOW).await.unwrap();
        assert!(who.require(crate::access::Need::Operate).is_ok());
        assert!(who.require(crate::access::Need::Approve).is_ok());
        // With a map, a value naming a role grants nothing unless mapped.
        assert!(who.require(crate::access::Need::Submit).is_err());
        c["org"] = "team-b".into();
        let refused = keys.verify_at(std::slice::from_ref(&issuer), &signer.token(c), NOW).await.unwrap_err();
        assert!(refused.to_string().contains("team-b"), "{refused}");
    }

    #[test]
    fn an_issuer_entry_is_checked() {
        let bad = [
            "issuer = \"https://i\"\naudience = \"\"\ntenant = \"a\"",
            "issuer = \"http://idp.example\"\naudience = \"h\"\ntenant = \"a\"",
            "issuer = \"https://i\"\naudience = \"h\"",
            "issuer = \"https://i\"\naudience = \"h\"\ntenant = \"a\"\ntenant_claim = \"t\"",
            "issuer = \"https://i\"\naudience = \"h\"\ntenant = \"a\"\nalgorithms = [\"HS256\"]",
            "issuer = \"https://i\"\naudience = \"h\"\ntenant = \"a\"\njwks_url = \"ftp://i/k\"",
        ];
        for text in bad {
            let parsed: Result<Issuer, _> = toml::from_str(text);
            assert!(parsed.map_err(anyhow::Error::from).and_then(|i| i.check()).is_err(), "{text}");
        }
        let local: Issuer =
            toml::from_str("issuer = \"http://127.0.0.1:8080/realm\"\naudience = \"h\"\ntenant = \"a\"")
                .unwrap();
        local.check().unwrap();
    }

    #[test]
    fn a_key_set_keeps_the_signature_keys_it_can_verify_with() {
        let body = serde_json::json!({"keys": [
            {"kty": "RSA", "kid": "r", "n": "AQAB", "e": "AQAB"},
            {"kty": "RSA", "kid": "enc", "use": "enc", "n": "AQAB", "e": "AQAB"},
            {"kty": "EC", "kid": "short", "crv": "P-256", "x": "AQAB", "y": "AQAB"},
            {"kty": "oct", "kid": "secret", "k": "AQAB"},
            {"kty": "OKP", "kid": "ed", "crv": "Ed25519", "x": "AQAB"}
        ]});
        let keys = parse_key_set(body.to_string().as_bytes()).unwrap();
        let kids: Vec<_> = keys.iter().filter_map(|k| k.kid.as_deref()).collect();
        assert_eq!(kids, ["r", "ed"]);
        assert!(parse_key_set(b"[]").is_err());
    }

    /// The provider's keys over HTTP, through its discovery document: RS256, ES256 and EdDSA
    /// tokens verify; a new key is fetched when a token names it; tokens naming made-up keys do
    /// not drive fetches; a provider that goes away leaves the keys fetched in use.
    #[tokio::test]
    async fn keys_come_from_the_providers_discovery_and_follow_its_rotation() {
        use hermes_test_util::oidc::{KeyKind, TestIdp};
        for kind in [KeyKind::Rsa, KeyKind::P256, KeyKind::Ed25519] {
            let idp = TestIdp::start(kind).await;
            let issuer: Issuer = toml::from_str(&format!(
                "issuer = \"{}\"\naudience = \"hermes\"\ntenant = \"team-a\"\nroles = [\"viewer\"]\nmin_refetch_s = 1",
                idp.issuer
            ))
            .unwrap();
            issuer.check().unwrap();
            let issuers = [Arc::new(issuer)];
            let keys = Keys::default();
            let token = idp.token("k1", "hermes", serde_json::json!({"sub": "ada"}));
            let who = keys.verify(&issuers, &token).await.unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            assert_eq!(
                (who.name.as_str(), who.tenant.as_deref()),
                (&*format!("{}#ada", idp.issuer), Some("team-a"))
            );
            assert_eq!(idp.fetches(), 1, "{kind:?}");
            keys.verify(&issuers, &token).await.unwrap();
            assert_eq!(idp.fetches(), 1, "kept: {kind:?}");

            // Rotation: a token of a new key has the keys fetched again, once the least time
            // between fetches has passed.
            idp.add_key("k2", kind);
            let rotated = idp.token("k2", "hermes", serde_json::json!({"sub": "ada"}));
            tokio::time::sleep(Duration::from_millis(1100)).await;
            keys.verify(&issuers, &rotated).await.unwrap_or_else(|e| panic!("{kind:?}: {e}"));
            assert_eq!(idp.fetches(), 2, "{kind:?}");

            // Made-up key ids: at most one fetch in the least time.
            let payload = enc(serde_json::json!({"iss": idp.issuer}).to_string().as_bytes());
            for n in 0..20 {
                let header = enc(serde_json::json!({"alg": "EdDSA", "kid": format!("nope-{n}")})
                    .to_string()
                    .as_bytes());
                assert!(keys.verify(&issuers, &format!("{header}.{payload}.AAAA")).await.is_err());
            }
            assert!(idp.fetches() <= 3, "{kind:?}: {} fetches", idp.fetches());

            // A withdrawn key's tokens are refused once the keys are fetched again.
            idp.withdraw_key("k1");
            idp.add_key("k3", kind);
            tokio::time::sleep(Duration::from_millis(1100)).await;
            keys.verify(&issuers, &idp.token("k3", "hermes", serde_json::json!({"sub": "ada"})))
                .await
                .unwrap();
            let refused = keys.verify(&issuers, &token).await.unwrap_err();
            assert!(refused.to_string().contains("`k1`"), "{kind:?}: {refused}");
        }
    }

    /// A provider that cannot be reached before any key was fetched makes the call
    /// `UNAVAILABLE` (not the caller's fault), every time until it answers.
    #[tokio::test]
    async fn no_keys_yet_is_unavailable_not_unauthenticated() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let issuer: Issuer = toml::from_str(&format!(
            "issuer = \"https://idp.example\"\naudience = \"hermes\"\njwks_url = \"http://127.0.0.1:{port}/keys\"\ntenant = \"a\""
        ))
        .unwrap();
        let (issuers, signer) = ([Arc::new(issuer)], Signer::new("k1"));
        let keys = Keys::default();
        for _ in 0..3 {
            let refused = keys.verify_at(&issuers, &signer.token(claims()), NOW).await.unwrap_err();
            assert_eq!(refused.code(), crate::ErrorCode::Unavailable, "{refused}");
        }
    }
}
