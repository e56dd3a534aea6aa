//! Who may do what through the API doors (gRPC, HTTP, A2A): API tokens, each bound to a tenant
//! and a set of roles, checked by the dispatcher's caller gate (`gate.rs`), so every door
//! applies one rule, and by [`guard`] in front of the Registry and Memory gRPC services (on the
//! dispatcher's port, or on their own with `api_tokens_file`).
//!
//! Tokens live in a TOML file (`dispatcher.api_tokens_file`, `HERMES_API_TOKENS_FILE`), hashed:
//!
//! ```toml
//! [[token]]
//! name = "ci-bot"                 # who, in logs and errors
//! sha256 = "9f86d08..."           # hex SHA-256 of the token: `printf %s "$TOKEN" | sha256sum`
//! tenant = "team-a"
//! roles = ["submitter", "viewer"]
//! ```
//!
//! `[[oidc]]` entries of the same file trust identity providers' signed access tokens beside
//! these ([`crate::oidc`], checked by [`Tokens::authenticate`]).
//!
//! A caller sends `Authorization: Bearer <token>` (gRPC metadata `authorization`). Without the
//! file, auth is off: every caller is the one default principal with every role, and goals carry
//! no tenant. With it, a missing or unknown token is `UNAUTHENTICATED` (HTTP 401), a role
//! missing for the call is `DENIED` (gRPC `PERMISSION_DENIED`, HTTP 403), and a goal of another
//! tenant is `NOT_FOUND`, as one that does not exist.
//!
//! The file is read again on SIGHUP, and when its content changes (within 10 s), by [`Tokens`]:
//! a process that serves with it (the dispatcher, the registry and memory with
//! `api_tokens_file`, `hermes up`) takes the new tokens, tenants, quotas and weights without a
//! restart. A file that no longer reads is refused with an error in
//! the log, and the tokens before it stay in force.

use std::collections::HashMap;
use std::path::Path;

use crate::Error;
use anyhow::Context as _;
use hermes_proto::GoalState;
use serde::Deserialize;
use sha2::{Digest, Sha256};

/// The label a goal's tenant is kept under.
pub const TENANT_LABEL: &str = "tenant";

/// The tenant a goal belongs to (its `tenant` label), if any.
pub fn tenant_of(state: &GoalState) -> Option<&str> {
    state.spec.as_ref().and_then(|s| s.labels.get(TENANT_LABEL)).map(String::as_str)
}

/// What a call needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Reading goals, their events and outputs, approvals, agents, sessions: any role.
    Read,
    /// Submitting and cancelling goals.
    Submit,
    /// Deciding approvals.
    Approve,
    /// Dead letters: listing, reading and replaying them.
    Operate,
    /// Reading goals' inputs and outputs with their secrets.
    Secrets,
}

/// A role a token grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Viewer,
    Submitter,
    Approver,
    Operator,
    /// Sees goals' inputs and outputs whole, secrets included; everyone else sees them redacted.
    Secrets,
    /// A platform operator: what its other roles allow, on every tenant's goals, dead letters,
    /// cache and audit trail, not its own tenant's only. Its actions on another tenant's goals go
    /// into that tenant's audit trail too. It still submits into its own tenant.
    Platform,
}

impl Role {
    /// The role of its name in the tokens file (`viewer`, `submitter`, ...).
    pub fn named(name: &str) -> Option<Role> {
        serde::de::Deserialize::deserialize(
            serde::de::value::StrDeserializer::<serde::de::value::Error>::new(name),
        )
        .ok()
    }

    fn grants(self, need: Need) -> bool {
        match need {
            Need::Read => true,
            Need::Submit => self == Role::Submitter,
            Need::Approve => self == Role::Approver,
            Need::Operate => self == Role::Operator,
            Need::Secrets => self == Role::Secrets,
        }
    }
}

/// Who is calling.
#[derive(Debug, Clone, PartialEq)]
pub struct Principal {
    /// The token's name, or `anonymous` with auth off.
    pub name: String,
    /// `None` with auth off: no tenant, every goal.
    pub tenant: Option<String>,
    roles: Vec<Role>,
    /// Where the call came from, for the audit trail: the door and the peer address
    /// (`grpc 10.0.0.7:51234`); empty when unknown.
    pub origin: String,
}

impl Principal {
    /// A caller of `tenant` with `roles` (an OIDC token's, [`crate::oidc`]).
    pub fn new(name: String, tenant: Option<String>, roles: Vec<Role>) -> Principal {
        Principal { name, tenant, roles, origin: String::new() }
    }

    /// A caller whose credentials were refused, for the audit trail: no role, no tenant.
    pub fn unauthenticated(origin: String) -> Principal {
        Principal { name: "unauthenticated".into(), tenant: None, roles: Vec::new(), origin }
    }

    /// The caller when auth is off: every role, every goal.
    pub fn anyone() -> Principal {
        Principal {
            name: "anonymous".into(),
            tenant: None,
            roles: vec![Role::Viewer, Role::Submitter, Role::Approver, Role::Operator, Role::Secrets],
            origin: String::new(),
        }
    }

    /// This principal calling through `door` from `peer`.
    pub fn at(mut self, door: &str, peer: Option<std::net::SocketAddr>) -> Principal {
        self.origin = match peer {
            Some(peer) => format!("{door} {peer}"),
            None => door.to_owned(),
        };
        self
    }

    /// `DENIED` naming the role the call needs, unless a role of this principal grants it.
    pub fn require(&self, need: Need) -> Result<(), Error> {
        if self.roles.iter().any(|r| r.grants(need)) {
            return Ok(());
        }
        let role = match need {
            Need::Read => "any role",
            Need::Submit => "the submitter role",
            Need::Approve => "the approver role",
            Need::Operate => "the operator role",
            Need::Secrets => "the secrets role",
        };
        Err(Error::Denied { reason: format!("`{}` may not do this: it needs {role}", self.name) })
    }

    /// `state` as this principal may read it: whole with the secrets role (and with auth off),
    /// else with its secrets redacted (`crate::redact::goal_state`).
    pub fn view(&self, state: GoalState) -> GoalState {
        match self.require(Need::Secrets) {
            Ok(()) => state,
            Err(_) => crate::redact::goal_state(&state),
        }
    }

    /// An artifact of `goal` as this principal may read it: whole with the secrets role (and
    /// with auth off), else redacted as [`Principal::view`] redacts the outputs it stands in for
    /// (`crate::redact::artifact`, with the goal's `secret_inputs`).
    pub fn view_artifact(&self, goal: &GoalState, bytes: Vec<u8>) -> Vec<u8> {
        if self.require(Need::Secrets).is_ok() {
            return bytes;
        }
        let nodes = goal.plan.iter().flat_map(|p| p.nodes.iter());
        let marked: Vec<String> = nodes.flat_map(|n| n.secret_inputs.iter().cloned()).collect();
        crate::redact::artifact(bytes, &marked)
    }

    /// Whether the goal belongs to this principal's tenant (every goal, with auth off or the
    /// platform role).
    pub fn sees(&self, goal: &GoalState) -> bool {
        match self.scope() {
            None => true,
            Some(tenant) => tenant_of(goal) == Some(tenant),
        }
    }

    /// The one tenant this principal's reach is bounded to: its own, or none with auth off or
    /// the platform role (every tenant's).
    pub fn scope(&self) -> Option<&str> {
        match self.roles.contains(&Role::Platform) {
            true => None,
            false => self.tenant.as_deref(),
        }
    }

    /// Whether this principal acts across tenants (the platform role).
    pub fn across_tenants(&self) -> bool {
        self.tenant.is_some() && self.roles.contains(&Role::Platform)
    }
}

/// One tenant's quotas (a `[[tenant]]` entry, enforced by the dispatcher); an absent field is
/// no limit.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantQuota {
    pub name: String,
    pub max_running_goals: Option<usize>,
    pub submits_per_second: Option<f64>,
    pub submit_burst: Option<u32>,
    pub daily_tokens: Option<u64>,
    pub daily_cost_usd: Option<f64>,
    /// The tenant's share of the agents' slots while its pooled tasks wait beside other
    /// tenants': a tenant of weight 3 is served three tasks for each one of a tenant of weight
    /// 1 (`crate::lanes`). 1 when absent.
    pub weight: Option<f64>,
}

impl TenantQuota {
    /// Checks the values, naming the tenant.
    pub fn check(&self) -> anyhow::Result<()> {
        crate::ids::check_id("tenant", &self.name, 64, crate::ids::IdShape::Word)?;
        let positive = |what: &str, ok: bool| {
            anyhow::ensure!(ok, "tenant `{}`: {what} must be a positive number", self.name);
            Ok(())
        };
        positive("max_running_goals", self.max_running_goals.is_none_or(|n| n > 0))?;
        positive("submits_per_second", self.submits_per_second.is_none_or(|r| r.is_finite() && r > 0.0))?;
        positive("submit_burst", self.submit_burst.is_none_or(|b| b > 0))?;
        positive("daily_tokens", self.daily_tokens.is_none_or(|t| t > 0))?;
        positive("daily_cost_usd", self.daily_cost_usd.is_none_or(|c| c.is_finite() && c > 0.0))?;
        positive("weight", self.weight.is_none_or(crate::lanes::valid_weight))?;
        anyhow::ensure!(
            self.submit_burst.is_none() || self.submits_per_second.is_some(),
            "tenant `{}`: submit_burst needs submits_per_second",
            self.name
        );
        Ok(())
    }
}

/// The tokens, or none (auth off), and the tenants' quotas.
#[derive(Debug, Default)]
pub struct Access {
    tokens: Option<HashMap<[u8; 32], Principal>>,
    /// The `[[oidc]]` entries: identity providers whose signed tokens are callers.
    pub issuers: Vec<std::sync::Arc<crate::oidc::Issuer>>,
    /// The `[[agent]]` entries, by their token's hash: agents' NATS identities
    /// (`hermes_registry::identities`).
    agents: HashMap<[u8; 32], AgentGrant>,
    /// The `[[tenant]]` entries (the dispatcher's quotas).
    pub quotas: Vec<TenantQuota>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokensFile {
    #[serde(default)]
    token: Vec<TokenEntry>,
    #[serde(default)]
    tenant: Vec<TenantQuota>,
    #[serde(default)]
    oidc: Vec<crate::oidc::Issuer>,
    #[serde(default)]
    agent: Vec<AgentEntry>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AgentEntry {
    id: String,
    sha256: String,
}

/// An agent token's grant: the agent id it may connect to NATS as.
#[derive(Debug, Clone, PartialEq)]
pub struct AgentGrant {
    pub id: String,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenEntry {
    name: String,
    sha256: String,
    tenant: String,
    roles: Vec<Role>,
}

impl Access {
    /// No tokens: auth off.
    pub fn open() -> Access {
        Access::default()
    }

    /// The tokens of the file a setting names (`api_tokens_file`); a blank setting is auth off.
    pub fn from_setting(file: &str) -> anyhow::Result<Access> {
        match file.trim() {
            "" => Ok(Access::open()),
            path => Access::load(Path::new(path)),
        }
    }

    /// The tokens of `path`; any problem with the file is an error naming it, so a server never
    /// starts with auth silently off.
    pub fn load(path: &Path) -> anyhow::Result<Access> {
        let text = std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
        Access::from_file_content(path, &text)
    }

    /// The tokens of `content`, read from `path` (named in errors).
    fn from_file_content(path: &Path, content: &[u8]) -> anyhow::Result<Access> {
        let text =
            std::str::from_utf8(content).with_context(|| format!("{} is not UTF-8", path.display()))?;
        Access::parse(text).with_context(|| format!("in the API tokens file {}", path.display()))
    }

    pub fn parse(text: &str) -> anyhow::Result<Access> {
        let file: TokensFile = toml::from_str(text)?;
        anyhow::ensure!(
            !file.token.is_empty() || !file.oidc.is_empty() || !file.agent.is_empty(),
            "it names no token ([[token]] entries), no issuer ([[oidc]]) and no agent ([[agent]])"
        );
        let mut agents = HashMap::new();
        for entry in file.agent {
            crate::topology::validate_agent_id(&entry.id)
                .with_context(|| format!("[[agent]] `{}`", entry.id))?;
            let digest = decode_sha256(&entry.sha256)
                .with_context(|| format!("[[agent]] `{}`: sha256 must be 64 hex digits", entry.id))?;
            anyhow::ensure!(
                !agents.values().any(|a: &AgentGrant| a.id == entry.id),
                "agent `{}` has two [[agent]] entries",
                entry.id
            );
            anyhow::ensure!(
                agents.insert(digest, AgentGrant { id: entry.id.clone() }).is_none(),
                "[[agent]] `{}` repeats another agent's token hash",
                entry.id
            );
        }
        let mut issuers: Vec<std::sync::Arc<crate::oidc::Issuer>> = Vec::new();
        for issuer in file.oidc {
            issuer.check()?;
            anyhow::ensure!(
                !issuers.iter().any(|i| i.issuer == issuer.issuer),
                "issuer `{}` has two [[oidc]] entries",
                issuer.issuer
            );
            issuers.push(issuer.into());
        }
        let mut tokens = HashMap::new();
        for entry in file.token {
            let digest = decode_sha256(&entry.sha256)
                .with_context(|| format!("token `{}`: sha256 must be 64 hex digits", entry.name))?;
            crate::ids::check_id("tenant", &entry.tenant, 64, crate::ids::IdShape::Word)
                .with_context(|| format!("token `{}`", entry.name))?;
            anyhow::ensure!(!entry.roles.is_empty(), "token `{}` has no roles", entry.name);
            let principal = Principal {
                name: entry.name.clone(),
                tenant: Some(entry.tenant),
                roles: entry.roles,
                origin: String::new(),
            };
            anyhow::ensure!(
                tokens.insert(digest, principal).is_none(),
                "token `{}` repeats a hash",
                entry.name
            );
        }
        let mut tenants: std::collections::HashSet<String> =
            tokens.values().filter_map(|p: &Principal| p.tenant.clone()).collect();
        // An issuer whose tokens' claims may name any tenant may have a quota for any.
        let any_tenant = issuers.iter().any(|i| i.known_tenants().is_none());
        tenants.extend(issuers.iter().filter_map(|i| i.known_tenants()).flatten());
        let mut named = std::collections::HashSet::new();
        for quota in &file.tenant {
            quota.check()?;
            anyhow::ensure!(
                named.insert(quota.name.clone()),
                "tenant `{}` has two [[tenant]] entries",
                quota.name
            );
            anyhow::ensure!(
                any_tenant || tenants.contains(&quota.name),
                "[[tenant]] `{}` is no token's or issuer's tenant (a typo would leave a tenant without its quotas)",
                quota.name
            );
        }
        for digest in agents.keys() {
            anyhow::ensure!(!tokens.contains_key(digest), "an [[agent]] token hash is also an API token's");
        }
        Ok(Access { tokens: Some(tokens), issuers, agents, quotas: file.tenant })
    }

    /// Every tenant a token, an issuer or a `[[tenant]]` entry names, with its weight (its
    /// `[[tenant]]` entry's, else 1): the lanes of the pool ([`crate::lanes`]).
    pub fn tenant_weights(&self) -> std::collections::BTreeMap<String, f64> {
        let tenants = self
            .tokens
            .iter()
            .flat_map(|tokens| tokens.values().filter_map(|p| p.tenant.clone()))
            .chain(self.issuers.iter().filter_map(|i| i.known_tenants()).flatten())
            .chain(self.quotas.iter().map(|q| q.name.clone()));
        tenants
            .map(|tenant| {
                let weight = self.quotas.iter().find(|q| q.name == tenant).and_then(|q| q.weight);
                (tenant, weight.unwrap_or(1.0))
            })
            .collect()
    }

    /// The grant of an agent token, by its SHA-256.
    pub fn agent(&self, digest: &[u8; 32]) -> Option<&AgentGrant> {
        self.agents.get(digest)
    }

    /// The ids of the agents with `[[agent]]` entries.
    pub fn agent_ids(&self) -> impl Iterator<Item = &str> {
        self.agents.values().map(|a| a.id.as_str())
    }

    /// Whether callers must authenticate.
    pub fn enabled(&self) -> bool {
        self.tokens.is_some()
    }

    /// The principal of a call's `Authorization` value (`Bearer <token>`), by the static tokens
    /// only; [`Tokens::authenticate`] takes OIDC tokens too.
    pub fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, Error> {
        let Some(tokens) = &self.tokens else { return Ok(Principal::anyone()) };
        let token = bearer(authorization)?;
        let digest: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        tokens
            .get(&digest)
            .cloned()
            .ok_or_else(|| Error::Unauthenticated("the API token is not known".into()))
    }
}

/// The token of an `Authorization` value (`Bearer <token>`).
fn bearer(authorization: Option<&str>) -> Result<&str, Error> {
    authorization
        .and_then(|v| v.trim().strip_prefix("Bearer ").or_else(|| v.trim().strip_prefix("bearer ")))
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .ok_or_else(|| Error::Unauthenticated("send an API token as `Authorization: Bearer <token>`".into()))
}

/// API tokens as the file holds them now: an [`Access`] replaced from the same file on SIGHUP or
/// a change ([`Tokens::reload_on_hangup`]), for every reader at once. Auth off (no file) stays
/// off: there is nothing to read again.
pub struct Tokens {
    file: Option<std::path::PathBuf>,
    current: tokio::sync::watch::Sender<std::sync::Arc<Access>>,
    /// The file's content the tokens in force were read from, so a change right after start is
    /// not missed.
    read_at_start: Option<Vec<u8>>,
    /// The OIDC issuers' keys, kept across reloads.
    keys: crate::oidc::Keys,
}

impl std::fmt::Debug for Tokens {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokens").field("file", &self.file).field("current", &self.current()).finish()
    }
}

impl Tokens {
    /// The tokens of the file a setting names (`api_tokens_file`); a blank setting is auth off.
    pub fn from_setting(file: &str) -> anyhow::Result<std::sync::Arc<Tokens>> {
        let path = (!file.trim().is_empty()).then(|| std::path::PathBuf::from(file.trim()));
        let (access, read_at_start) = match &path {
            None => (Access::open(), None),
            Some(path) => {
                let content =
                    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))?;
                (Access::from_file_content(path, &content)?, Some(content))
            }
        };
        let current = tokio::sync::watch::Sender::new(access.into());
        Ok(std::sync::Arc::new(Tokens { file: path, current, read_at_start, keys: Default::default() }))
    }

    /// Tokens that come from no file and are never read again (tests, benches).
    pub fn fixed(access: Access) -> std::sync::Arc<Tokens> {
        std::sync::Arc::new(Tokens {
            file: None,
            current: tokio::sync::watch::Sender::new(access.into()),
            read_at_start: None,
            keys: Default::default(),
        })
    }

    /// The principal of a call's `Authorization` value (`Bearer <token>`): a static token of the
    /// file, or a JWT of one of its `[[oidc]]` issuers ([`crate::oidc`]), its keys fetched when
    /// needed.
    pub async fn authenticate(&self, authorization: Option<&str>) -> Result<Principal, Error> {
        let access = self.current();
        let refused = match access.authenticate(authorization) {
            Ok(principal) => return Ok(principal),
            Err(refused) => refused,
        };
        match bearer(authorization) {
            Ok(token) if !access.issuers.is_empty() && crate::oidc::looks_like_jwt(token) => {
                self.keys.verify(&access.issuers, token).await
            }
            _ => Err(refused),
        }
    }

    /// The tokens in force.
    pub fn current(&self) -> std::sync::Arc<Access> {
        self.current.borrow().clone()
    }

    /// Each set of tokens as it comes into force, the one in force first.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<std::sync::Arc<Access>> {
        self.current.subscribe()
    }

    /// Puts the tokens of `content`, read again from the file, in force; content that does not
    /// parse, or has no token, is an error and changes nothing. Says how many tokens and tenants
    /// are in force.
    fn take(&self, file: &Path, content: &[u8]) -> anyhow::Result<(usize, usize)> {
        let access = Access::from_file_content(file, content)?;
        let counts = (
            access.tokens.as_ref().map_or(0, HashMap::len) + access.issuers.len(),
            access.tenant_weights().len(),
        );
        self.current.send_replace(access.into());
        Ok(counts)
    }

    /// Reads the file again on every SIGHUP, and when its content changes (looked at every
    /// [`TOKENS_POLL`]: a Kubernetes Secret mounted as a volume changes under the process), until
    /// `shutdown`, logging what came of it. Nothing to do with auth off.
    pub fn reload_on_hangup(self: &std::sync::Arc<Self>, shutdown: tokio_util::sync::CancellationToken) {
        let Some(file) = self.file.clone() else { return };
        let tokens = self.clone();
        let watched = crate::reload::Watched {
            what: "API tokens",
            event: "api_tokens",
            files: vec![file.clone()],
            read_at_start: vec![self.read_at_start.clone()],
        };
        crate::reload::follow(watched, shutdown, move |contents| {
            let Some(content) = contents.first().cloned().flatten() else {
                anyhow::bail!("cannot read {}", file.display())
            };
            let (n, tenants) = tokens.take(&file, &content)?;
            Ok(format!("{n} tokens and issuers, {tenants} tenants"))
        });
    }
}

/// How often a tokens file is looked at for a change ([`Tokens::reload_on_hangup`]).
pub const TOKENS_POLL: std::time::Duration = crate::reload::POLL;

/// The check of the services that check no credentials themselves, composed on the dispatcher's
/// gRPC server or on their own (`hermes-registry`, `hermes-memory` with `api_tokens_file`):
/// `hermes.v1.Registry` needs any role (it reads agents), `hermes.v1.Memory` the operator role.
/// The guard stamps the caller's tenant as [`TENANT_HEADER`], and [`REDACT_HEADER`] when it lacks
/// the secrets role, removing any the caller sent; the Memory service keeps each tenant's
/// sessions, collections and artifacts apart by the first and redacts goals' artifacts by the
/// second. The Dispatcher service checks its own calls; health and reflection stay open (they
/// say nothing about goals).
///
/// [`TENANT_HEADER`]: crate::grpc::TENANT_HEADER
/// [`REDACT_HEADER`]: crate::grpc::REDACT_HEADER
pub fn guard(tokens: std::sync::Arc<Tokens>) -> crate::grpc::Guard {
    std::sync::Arc::new(move |path: String, headers: axum::http::HeaderMap| {
        let tokens = tokens.clone();
        Box::pin(async move { guarded(&tokens, &path, headers).await.map_err(tonic::Status::from) })
    })
}

/// [`guard`]'s check of one call.
async fn guarded(
    tokens: &Tokens,
    path: &str,
    mut headers: axum::http::HeaderMap,
) -> Result<axum::http::HeaderMap, Error> {
    use crate::grpc::{REDACT_HEADER, TENANT_HEADER};
    headers.remove(TENANT_HEADER);
    headers.remove(REDACT_HEADER);
    let need = if path.starts_with("/hermes.v1.Registry/") {
        Need::Read
    } else if path.starts_with("/hermes.v1.Memory/") {
        Need::Operate
    } else {
        return Ok(headers);
    };
    let authorization = headers.get("authorization").and_then(|v| v.to_str().ok());
    let who = tokens.authenticate(authorization).await?;
    who.require(need)?;
    if who.require(Need::Secrets).is_err() {
        headers.insert(REDACT_HEADER, axum::http::HeaderValue::from_static("1"));
    }
    if let Some(tenant) = &who.tenant {
        // A tenant is a checked word (`check_id`), always a valid header value.
        if let Ok(value) = axum::http::HeaderValue::from_str(tenant) {
            headers.insert(TENANT_HEADER, value);
        }
    }
    Ok(headers)
}

fn decode_sha256(hex: &str) -> Option<[u8; 32]> {
    let hex = hex.trim();
    if hex.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sha(token: &str) -> String {
        Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn tokens_map_to_their_tenant_and_roles_and_others_are_refused() {
        let access = Access::parse(&format!(
            "[[token]]\nname = \"viewer-a\"\nsha256 = \"{}\"\ntenant = \"team-a\"\nroles = [\"viewer\"]\n",
            sha("s3cret")
        ))
        .unwrap();
        let who = access.authenticate(Some("Bearer s3cret")).unwrap();
        assert_eq!(who.tenant.as_deref(), Some("team-a"));
        assert!(who.require(Need::Read).is_ok());
        let denied = who.require(Need::Submit).unwrap_err();
        assert_eq!(denied.code(), crate::ErrorCode::Denied);
        assert!(denied.to_string().contains("submitter"), "{denied}");
        for bad in [None, Some("Bearer nope"), Some("s3cret"), Some("Bearer ")] {
            let refused = access.authenticate(bad).unwrap_err();
            assert_eq!(refused.code(), crate::ErrorCode::Unauthenticated, "{bad:?}");
        }
    }

    #[test]
    fn a_broken_tokens_file_is_an_error_not_auth_off() {
        for text in [
            "",
            "[[token]]\nname = \"x\"\nsha256 = \"abc\"\ntenant = \"t\"\nroles = [\"viewer\"]\n",
            "[[token]]\nname = \"x\"\nsha256 = \"00\"\ntenant = \"t\"\nroles = [\"root\"]\n",
        ] {
            assert!(Access::parse(text).is_err(), "{text}");
        }
        assert!(!Access::open().enabled());
        assert_eq!(Access::open().authenticate(None).unwrap(), Principal::anyone());
    }

    #[test]
    fn a_principal_sees_only_its_tenants_goals() {
        let mut goal = GoalState::default();
        let who = Principal {
            name: "a".into(),
            tenant: Some("team-a".into()),
            roles: vec![Role::Viewer],
            origin: String::new(),
        };
        assert!(!who.sees(&goal));
        goal.spec = Some(hermes_proto::GoalSpec {
            labels: [(TENANT_LABEL.to_owned(), "team-a".to_owned())].into(),
            ..Default::default()
        });
        assert!(who.sees(&goal));
        assert!(Principal::anyone().sees(&GoalState::default()));
    }
}
