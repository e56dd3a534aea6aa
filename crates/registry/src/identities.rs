//! Per-agent NATS identities, issued by the registry as the NATS server's auth callout.
//!
//! With `identities.issuer_seed` set, the registry answers the server's authorization requests
//! (`$SYS.REQ.USER.AUTH`, NATS 2.10+ `auth_callout`, `deploy/nats/callout.conf`). An agent
//! connects as the NATS user `agent_<id>` with its agent token as the password: an `[[agent]]`
//! entry of the API tokens file (`id` and the token's `sha256`). The registry checks the token is that agent's and answers with a user JWT, signed
//! by the issuer account key, that allows only that agent's own subjects
//! ([`agent_permissions`]):
//!
//! - its own reply inbox, `_INBOX_agent_<id>` (Hermes takes the prefix from the URL's user), so
//!   no other agent reads its task deliveries (and their result tokens) or its replies;
//! - its own direct-task consumer `agent_<id>`: the other agents' are denied to it;
//! - its own heartbeat subject and its own entry of the agents bucket, so it cannot speak for
//!   another agent;
//! - the pools and tenants' lanes, which every agent shares.
//!
//! Anything else an agent does (results checked by their attempt's token, reports through a
//! dispatcher, cancels, the shared buckets) is as the static `agent` user allows it. Any other
//! user, an unknown token, a token used for another agent's id, or a request the server did not
//! sign is refused. The user JWT expires after `identities.ttl_secs`: the server then closes the
//! connection, the agent reconnects and is checked again, so a token removed from the file stops
//! working within that time.
//!
//! On Kubernetes, with `identities.kubernetes.issuer` set, a pod is admitted as the agent its pod
//! name is: it connects as `agent_<pod name>` with its projected service-account token (made for
//! `identities.kubernetes.audience`) as the password, and the registry checks the token's
//! signature against the cluster's keys, that it is bound to that pod, and that its service
//! account is one of `identities.kubernetes.service_accounts`. So autoscaled replicas need no
//! token issued to them: the kubelet gives each its own.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use hermes_core::Bus;
use hermes_core::access::Tokens;
use hermes_core::nats_jwt::{self, Permissions};
use hermes_core::topology::Topology;
use serde::{Deserialize, Serialize};
use sha2::Digest as _;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Where a NATS server sends authorization requests.
pub const CALLOUT_SUBJECT: &str = "$SYS.REQ.USER.AUTH";

/// The NATS user name prefix of an agent with an identity of its own: `agent_<id>`.
pub const AGENT_USER_PREFIX: &str = hermes_core::broker::AGENT_IDENTITY_PREFIX;

/// Settings of the callout (`[identities]`; `HERMES_IDENTITIES_*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct IdentitySettings {
    /// The account seed (`SA...`) whose public key the server's `auth_callout.issuer` names;
    /// empty: the registry issues no identities.
    pub issuer_seed: String,
    /// The account agents are placed in (accounts.conf's `HERMES`).
    pub account: String,
    /// How long an issued identity lasts before the agent is checked again.
    pub ttl_secs: u64,
    /// Pods admitted by their service-account tokens.
    pub kubernetes: KubernetesIdentities,
}

impl Default for IdentitySettings {
    fn default() -> Self {
        IdentitySettings {
            issuer_seed: String::new(),
            account: "HERMES".into(),
            ttl_secs: 3600,
            kubernetes: KubernetesIdentities::default(),
        }
    }
}

/// Pods admitted as agents by their projected service-account tokens
/// (`[identities.kubernetes]`; `HERMES_IDENTITIES_KUBERNETES_*`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct KubernetesIdentities {
    /// The cluster's service-account token issuer (its API server's `--service-account-issuer`,
    /// the tokens' `iss`); empty: no pod is admitted by its token.
    pub issuer: String,
    /// The audience the pods' projected tokens are made for.
    pub audience: String,
    /// Where the cluster's keys are (`https://kubernetes.default.svc/openid/v1/jwks` in a pod);
    /// empty: the issuer's discovery document says.
    pub jwks_url: String,
    /// The CA certificates trusted for fetching them (in a pod, the service account's `ca.crt`).
    pub ca_file: String,
    /// A token sent with the fetch (in a pod, the service account's own `token`).
    pub token_file: String,
    /// The service accounts, `namespace/name`, whose pods are admitted as agents.
    pub service_accounts: Vec<String>,
}

impl Default for KubernetesIdentities {
    fn default() -> Self {
        KubernetesIdentities {
            issuer: String::new(),
            audience: "hermes-nats".into(),
            jwks_url: String::new(),
            ca_file: String::new(),
            token_file: String::new(),
            service_accounts: Vec::new(),
        }
    }
}

/// The cluster whose pods are admitted by their service-account tokens.
struct Cluster {
    issuer: Arc<hermes_core::oidc::Issuer>,
    /// The admitted service accounts as the tokens' `sub` names them.
    subjects: std::collections::BTreeSet<String>,
    keys: hermes_core::oidc::Keys,
}

impl Cluster {
    fn new(settings: &KubernetesIdentities) -> anyhow::Result<Option<Cluster>> {
        if settings.issuer.trim().is_empty() {
            return Ok(None);
        }
        let issuer = hermes_core::oidc::Issuer::for_claims(
            "identities.kubernetes",
            &settings.issuer,
            &settings.audience,
            &settings.jwks_url,
            &settings.ca_file,
            &settings.token_file,
        )?;
        let mut subjects = std::collections::BTreeSet::new();
        for account in &settings.service_accounts {
            let (namespace, name) = account.trim().split_once('/').unwrap_or_default();
            anyhow::ensure!(
                !namespace.is_empty() && !name.is_empty() && !name.contains('/'),
                "identities.kubernetes.service_accounts: `{account}` is not namespace/name"
            );
            subjects.insert(format!("system:serviceaccount:{namespace}:{name}"));
        }
        anyhow::ensure!(
            !subjects.is_empty(),
            "identities.kubernetes.service_accounts is empty: name the service accounts whose pods are agents"
        );
        Ok(Some(Cluster { issuer: Arc::new(issuer), subjects, keys: Default::default() }))
    }

    /// Whether `token` is a service-account token of an admitted account bound to pod `id`.
    async fn admit(&self, id: &str, token: &str) -> Result<(), String> {
        let (_, claims) = self
            .keys
            .verify_claims(std::slice::from_ref(&self.issuer), token)
            .await
            .map_err(|e| format!("the service-account token is refused: {e}"))?;
        let subject = claims.get("sub").and_then(|s| s.as_str()).unwrap_or_default();
        if !self.subjects.contains(subject) {
            return Err(format!(
                "service account `{}` is not one whose pods are agents",
                subject.chars().take(120).collect::<String>()
            ));
        }
        match claims.pointer("/kubernetes.io/pod/name").and_then(|p| p.as_str()) {
            Some(pod) if pod == id => Ok(()),
            Some(pod) => Err(format!(
                "the token is pod `{}`'s, not `{id}`'s",
                pod.chars().take(80).collect::<String>()
            )),
            None => Err("the token is bound to no pod (a projected service-account token is)".into()),
        }
    }
}

/// The callout: the issuer key, the account and the tokens agents present.
pub struct Identities {
    issuer: nkeys::KeyPair,
    account: String,
    ttl: Duration,
    tokens: Arc<Tokens>,
    /// Agents' tokens that are in no file, by their sha256: `hermes up`'s own agents'.
    local: std::collections::HashMap<[u8; 32], String>,
    /// Pods admitted by their service-account tokens.
    cluster: Option<Cluster>,
    /// The registry's live agents, whose own consumers are denied to the others beside those
    /// of the file's and the local agents.
    view: Option<crate::Registry>,
    topology: Topology,
}

impl Identities {
    /// The callout of `settings`, or `None` when it has no issuer seed.
    pub fn new(
        settings: &IdentitySettings,
        tokens: Arc<Tokens>,
        topology: Topology,
    ) -> anyhow::Result<Option<Self>> {
        let seed = settings.issuer_seed.trim();
        if seed.is_empty() {
            return Ok(None);
        }
        let issuer = nkeys::KeyPair::from_seed(seed)
            .map_err(|e| anyhow::anyhow!("identities.issuer_seed is not an nkey seed: {e}"))?;
        anyhow::ensure!(
            issuer.public_key().starts_with('A'),
            "identities.issuer_seed must be an account seed (SA...), the key auth_callout.issuer names"
        );
        anyhow::ensure!(!settings.account.trim().is_empty(), "identities.account is empty");
        anyhow::ensure!(
            (60..=7 * 24 * 3600).contains(&settings.ttl_secs),
            "identities.ttl_secs must be 60 to 604800 (a week)"
        );
        Ok(Some(Identities {
            issuer,
            account: settings.account.trim().to_owned(),
            ttl: Duration::from_secs(settings.ttl_secs),
            tokens,
            local: Default::default(),
            cluster: Cluster::new(&settings.kubernetes)?,
            view: None,
            topology,
        }))
    }

    /// Denies also the own consumers of `registry`'s live agents to each agent (pods admitted by
    /// their tokens are in no file).
    pub fn with_registry(mut self, registry: crate::Registry) -> Self {
        self.view = Some(registry);
        self
    }

    /// Admits also the agents of `tokens` (agent id to its token), beside the tokens file's.
    pub fn with_local_agents<'a>(
        mut self,
        tokens: impl IntoIterator<Item = (&'a String, &'a String)>,
    ) -> Self {
        for (id, token) in tokens {
            self.local.insert(sha2::Sha256::digest(token.as_bytes()).into(), id.clone());
        }
        self
    }

    /// The issuer's public key, for the server's `auth_callout.issuer`.
    pub fn issuer(&self) -> String {
        self.issuer.public_key()
    }

    /// The NATS user and the permissions of a connection that presents `user` and `password`,
    /// or why it is refused.
    pub async fn decide(&self, user: &str, password: &str) -> Result<(String, Permissions), String> {
        let Some(id) = user.strip_prefix(AGENT_USER_PREFIX) else {
            return Err(format!(
                "`{}` is not an agent's user (agent_<id>)",
                user.chars().take(80).collect::<String>()
            ));
        };
        hermes_core::topology::validate_agent_id(id).map_err(|e| e.to_string())?;
        let access = self.tokens.current();
        match &self.cluster {
            Some(cluster) if hermes_core::oidc::looks_like_jwt(password) => {
                cluster.admit(id, password).await?
            }
            _ => {
                let digest: [u8; 32] = sha2::Sha256::digest(password.as_bytes()).into();
                let holder = match self.local.get(&digest) {
                    Some(local) => local.as_str(),
                    None => access
                        .agent(&digest)
                        .map(|grant| grant.id.as_str())
                        .ok_or("the agent token is not known")?,
                };
                if holder != id {
                    return Err(format!("the agent token is not agent `{id}`'s"));
                }
            }
        }
        let mut others: std::collections::BTreeSet<String> =
            access.agent_ids().chain(self.local.values().map(String::as_str)).map(str::to_owned).collect();
        if let Some(view) = &self.view {
            others.extend(view.agent_ids());
        }
        Ok((user.to_owned(), agent_permissions(&self.topology, id, others.iter().map(String::as_str))))
    }

    /// The signed answer to one authorization request.
    async fn answer(&self, request: &[u8]) -> Option<String> {
        let token = std::str::from_utf8(request).ok()?;
        let request = match nats_jwt::decode_request(token) {
            Ok(request) => request,
            Err(e) => {
                warn!(error = %e, event = "identity_request_refused", "an authorization request that is not a server's was ignored");
                return None;
            }
        };
        let options = &request.connect_opts;
        let password = if options.pass.is_empty() { &options.auth_token } else { &options.pass };
        let expires = hermes_core::now_unix_ms() / 1000 + self.ttl.as_secs();
        let decided = self.decide(&options.user, password).await;
        let answer = match &decided {
            Ok((name, permissions)) => {
                info!(user = %name, host = %request.client_info.host, event = "identity_issued", "agent identity issued");
                nats_jwt::response(&self.issuer, &request, Ok((name, &self.account, permissions, expires)))
            }
            Err(reason) => {
                warn!(user = %options.user.chars().take(80).collect::<String>(), host = %request.client_info.host, reason = %reason, event = "identity_refused", "NATS connection refused");
                nats_jwt::response(&self.issuer, &request, Err(reason))
            }
        };
        match answer {
            Ok(jwt) => Some(jwt),
            Err(e) => {
                warn!(error = %e, "cannot sign an authorization response");
                None
            }
        }
    }
}

/// Answers the server's authorization requests until `shutdown`.
pub async fn serve(bus: Bus, identities: Identities, shutdown: CancellationToken) -> anyhow::Result<()> {
    let requests = listen(&bus).await?;
    serve_requests(bus, identities, requests, shutdown).await
}

/// Subscribes to the server's authorization requests; once this returns, the server sends them
/// here (the subscription is flushed).
pub async fn listen(bus: &Bus) -> anyhow::Result<async_nats::Subscriber> {
    let requests = bus.client().queue_subscribe(CALLOUT_SUBJECT, "hermes-identities".to_owned()).await?;
    bus.client().flush().await?;
    Ok(requests)
}

/// Answers the authorization requests of `requests` (from [`listen`]) until `shutdown`.
pub async fn serve_requests(
    bus: Bus,
    identities: Identities,
    mut requests: async_nats::Subscriber,
    shutdown: CancellationToken,
) -> anyhow::Result<()> {
    info!(issuer = %identities.issuer(), account = %identities.account, "issuing agent identities (NATS auth callout)");
    loop {
        let message = tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            message = requests.next() => match message { Some(m) => m, None => return Ok(()) },
        };
        let Some(reply) = message.reply.clone() else { continue };
        if let Some(jwt) = identities.answer(&message.payload).await
            && let Err(e) = bus.client().publish(reply, jwt.into()).await
        {
            warn!(error = %e, "cannot answer an authorization request");
        }
    }
}

/// What agent `id` may publish and subscribe to, with `others` the ids of the other agents that
/// have identities: its own inbox, direct-task consumer, heartbeat and agents entry; the pools
/// and tenants' lanes every agent shares; and what every agent may do ([`SHARED_PUBLISH`]).
///
/// Pool and lane consumers are pulled by name, and a lane's name carries its tenant inside one
/// subject token (`lane_<type>__<tenant>`), which no wildcard can match part of: so pulling,
/// reading and acknowledging are allowed on any consumer of the tasks stream, and denied on the
/// other agents' own (`agent_<other>`, and `reassign_<other>`, a dispatcher's takeover of its
/// work). Creating a consumer is allowed only with a pool or lane filter, or on the agent's own
/// direct subjects.
pub fn agent_permissions<'a>(
    topology: &Topology,
    id: &str,
    others: impl IntoIterator<Item = &'a str>,
) -> Permissions {
    let tasks = topology.tasks_stream();
    let api = |verb: &str, rest: &str| format!("$JS.API.CONSUMER.{verb}.{tasks}.{rest}");
    let own = topology.agent_consumer(id);
    let mut publish: Vec<String> = SHARED_PUBLISH.iter().map(|s| (*s).to_owned()).collect();
    publish.extend([
        api("INFO", "*"),
        api("MSG.NEXT", "*"),
        format!("$JS.ACK.{tasks}.>"),
        api("CREATE", &format!("*.{}", topology.pool_task(">"))),
        api("CREATE", &format!("*.{}", topology.lane_task("*", ">"))),
        api("CREATE", &format!("{own}.{}", topology.direct_tasks_of(id))),
        topology.heartbeat(id),
        format!("$KV.{}.{id}", topology.agents_bucket()),
    ]);
    let mut deny = Vec::new();
    for other in others.into_iter().filter(|o| *o != id) {
        for consumer in [topology.agent_consumer(other), topology.reassign_consumer(other)] {
            // Creating (or updating: the same API) one of them would point it elsewhere.
            deny.extend([
                api("INFO", &consumer),
                api("MSG.NEXT", &consumer),
                api("CREATE", &format!("{consumer}.>")),
                api("CREATE", &consumer),
                format!("$JS.ACK.{tasks}.{consumer}.>"),
            ]);
        }
    }
    let subscribe = vec![format!("_INBOX_{AGENT_USER_PREFIX}{id}.>"), topology.all_cancels()];
    Permissions { publish, publish_deny: deny, subscribe }
}

/// What every agent may publish, as the static `agent` user of `deploy/nats/accounts.conf`
/// allows it, less the entries [`agent_permissions`] narrows to the agent's own (its consumers,
/// heartbeat and agents entry). A test keeps the two in step.
pub const SHARED_PUBLISH: &[&str] = &[
    "$JS.API.STREAM.INFO.HERMES_TASKS",
    "$JS.API.STREAM.INFO.HERMES_RESULTS",
    "$JS.API.STREAM.INFO.HERMES_PLANS",
    "$JS.API.STREAM.INFO.HERMES_EVENTS",
    "$JS.API.STREAM.INFO.HERMES_DLQ",
    "$JS.API.STREAM.INFO.KV_hermes_goals",
    "$JS.API.STREAM.INFO.KV_hermes_agents",
    "$JS.API.STREAM.INFO.KV_hermes_approvals",
    "$JS.API.STREAM.INFO.KV_hermes_model_limits",
    "$JS.API.STREAM.CREATE.KV_hermes_model_limits",
    "$JS.API.DIRECT.GET.KV_hermes_model_limits.$KV.hermes_model_limits.>",
    "$KV.hermes_model_limits.>",
    "$JS.API.CONSUMER.CREATE.KV_hermes_model_limits",
    "$JS.API.CONSUMER.CREATE.KV_hermes_model_limits.*.$KV.hermes_model_limits.>",
    "$JS.API.CONSUMER.DELETE.KV_hermes_model_limits.*",
    "$JS.API.CONSUMER.INFO.KV_hermes_model_limits.*",
    "$JS.FC.KV_hermes_model_limits.>",
    "$JS.API.STREAM.INFO.KV_hermes_lanes",
    "$JS.API.STREAM.CREATE.KV_hermes_lanes",
    "$JS.API.CONSUMER.CREATE.KV_hermes_lanes",
    "$JS.API.CONSUMER.CREATE.KV_hermes_lanes.*.$KV.hermes_lanes.>",
    "$JS.API.CONSUMER.DELETE.KV_hermes_lanes.*",
    "$JS.API.CONSUMER.INFO.KV_hermes_lanes.*",
    "$JS.FC.KV_hermes_lanes.>",
    "hermes.result.>",
    "hermes.dlq.task",
    "$JS.API.DIRECT.GET.KV_hermes_approvals.$KV.hermes_approvals.>",
    "hermes.memory.rpc.upsert",
    "hermes.memory.rpc.search",
    "hermes.memory.rpc.get_doc",
    "hermes.memory.rpc.ledger",
    "hermes.memory.rpc.tool_cache",
    "hermes.memory.rpc.artifact_info",
    "hermes.memory.rpc.artifact_read",
    "hermes.memory.rpc.artifact_part",
    "hermes.memory.rpc.artifact_commit",
    "hermes.agent.report",
];

/// The static `agent` user's entries on the ledger, the artifacts and the tool cache, which an
/// agent's own identity does not get: it reaches its tasks' entries and artifacts through the
/// memory service with each task's token (`hermes_core::broker`), since these subjects name keys
/// and objects, not goals or tenants, and no permission could confine it to its own.
pub const BROKERED: &[&str] = &[
    "$JS.API.STREAM.INFO.KV_hermes_ledger",
    "$JS.API.STREAM.INFO.OBJ_hermes_artifacts",
    "$JS.API.DIRECT.GET.KV_hermes_ledger.$KV.hermes_ledger.>",
    "$KV.hermes_ledger.>",
    "$JS.API.DIRECT.GET.OBJ_hermes_artifacts.$O.hermes_artifacts.M.>",
    "$O.hermes_artifacts.C.>",
    "$O.hermes_artifacts.M.>",
    "$JS.API.CONSUMER.CREATE.OBJ_hermes_artifacts",
    "$JS.API.CONSUMER.CREATE.OBJ_hermes_artifacts.*.$O.hermes_artifacts.C.>",
    "$JS.API.CONSUMER.DELETE.OBJ_hermes_artifacts.*",
    "$JS.FC.OBJ_hermes_artifacts.>",
    "$JS.API.STREAM.INFO.KV_hermes_tool_cache",
    "$JS.API.STREAM.CREATE.KV_hermes_tool_cache",
    "$JS.API.DIRECT.GET.KV_hermes_tool_cache.$KV.hermes_tool_cache.>",
    "$KV.hermes_tool_cache.>",
    "$JS.API.CONSUMER.CREATE.KV_hermes_tool_cache",
    "$JS.API.CONSUMER.CREATE.KV_hermes_tool_cache.*.$KV.hermes_tool_cache.>",
    "$JS.API.CONSUMER.DELETE.KV_hermes_tool_cache.*",
    "$JS.API.CONSUMER.INFO.KV_hermes_tool_cache.*",
    "$JS.FC.KV_hermes_tool_cache.>",
];

/// The static `agent` user's entries [`agent_permissions`] replaces with the agent's own.
pub const NARROWED: &[&str] = &[
    "$JS.API.CONSUMER.INFO.HERMES_TASKS.*",
    "$JS.API.CONSUMER.CREATE.HERMES_TASKS.*.hermes.task.pool.>",
    "$JS.API.CONSUMER.CREATE.HERMES_TASKS.*.hermes.task.lane.>",
    "$JS.API.CONSUMER.CREATE.HERMES_TASKS.*.hermes.task.direct.>",
    "$JS.API.CONSUMER.MSG.NEXT.HERMES_TASKS.*",
    "$JS.ACK.HERMES_TASKS.>",
    "$KV.hermes_agents.*",
    "hermes.registry.heartbeat.*",
];

#[cfg(test)]
mod tests {
    use super::*;

    /// The agent block of deploy/nats/accounts.conf: every string of its publish allow list.
    fn static_agent_publish() -> Vec<String> {
        let conf = include_str!("../../../deploy/nats/accounts.conf");
        let block = &conf[conf.find("user: agent\n").expect("the agent user")..];
        let publish = &block[block.find("publish").unwrap()..block.find("subscribe").unwrap()];
        publish
            .lines()
            .map(|l| l.split('#').next().unwrap_or_default())
            .flat_map(|l| l.split('"').skip(1).step_by(2).map(str::to_owned).collect::<Vec<_>>())
            .collect()
    }

    #[test]
    fn an_identity_allows_what_the_static_agent_user_does_narrowed_to_its_own() {
        let conf = static_agent_publish();
        let shared: std::collections::BTreeSet<&str> = SHARED_PUBLISH.iter().copied().collect();
        let narrowed: std::collections::BTreeSet<&str> = NARROWED.iter().chain(BROKERED).copied().collect();
        for entry in &conf {
            assert!(
                shared.contains(entry.as_str()) || narrowed.contains(entry.as_str()),
                "accounts.conf's agent may publish `{entry}`: add it to SHARED_PUBLISH, or narrow it"
            );
        }
        for entry in shared.iter().chain(&narrowed) {
            assert!(conf.iter().any(|c| c == entry), "`{entry}` is no longer in accounts.conf's agent user");
        }
        // An identity reaches the ledger and the artifacts only through the memory service.
        let identity = agent_permissions(&Topology::default(), "a1", ["a1"]);
        let reached: Vec<&String> = identity
            .publish
            .iter()
            .filter(|p| p.contains("hermes_ledger") || p.contains("hermes_artifacts"))
            .collect();
        assert!(reached.is_empty(), "an agent's identity may publish {reached:?}");
    }

    #[test]
    fn the_kubernetes_settings_are_checked_naming_the_setting() {
        let mut k = KubernetesIdentities {
            issuer: "https://kubernetes.default.svc.cluster.local".into(),
            service_accounts: vec!["agents/hermes-pool-general".into()],
            ..Default::default()
        };
        let cluster = Cluster::new(&k).unwrap().expect("configured");
        assert!(cluster.subjects.contains("system:serviceaccount:agents:hermes-pool-general"));
        let refused =
            |k: &KubernetesIdentities| Cluster::new(k).err().map(|e| e.to_string()).unwrap_or_default();
        k.service_accounts = vec!["hermes-pool-general".into()];
        assert!(refused(&k).contains("is not namespace/name"), "{}", refused(&k));
        k.service_accounts = Vec::new();
        assert!(refused(&k).contains("service_accounts is empty"), "{}", refused(&k));
        k.service_accounts = vec!["agents/a".into()];
        k.jwks_url = "http://kubernetes.default.svc/openid/v1/jwks".into();
        assert!(refused(&k).contains("must be https"), "{}", refused(&k));
        k.issuer = String::new();
        assert!(Cluster::new(&k).unwrap().is_none(), "no issuer: off");
    }

    #[test]
    fn an_agent_gets_its_own_subjects_and_not_another_agents() {
        let t = Topology::default();
        let p = agent_permissions(&t, "a1", ["a1", "b2"]);
        assert!(p.publish.contains(&"hermes.registry.heartbeat.a1".to_owned()));
        assert!(p.publish.contains(&"$KV.hermes_agents.a1".to_owned()));
        assert!(
            p.publish.contains(
                &"$JS.API.CONSUMER.CREATE.HERMES_TASKS.agent_a1.hermes.task.direct.a1.>".to_owned()
            )
        );
        assert!(!p.publish.iter().any(|s| s.contains("b2")), "{:?}", p.publish);
        for denied in [
            "$JS.API.CONSUMER.MSG.NEXT.HERMES_TASKS.agent_b2",
            "$JS.API.CONSUMER.MSG.NEXT.HERMES_TASKS.reassign_b2",
            "$JS.API.CONSUMER.CREATE.HERMES_TASKS.agent_b2.>",
            "$JS.ACK.HERMES_TASKS.agent_b2.>",
        ] {
            assert!(p.publish_deny.contains(&denied.to_owned()), "{denied}");
        }
        assert!(!p.publish_deny.iter().any(|s| s.contains("a1")), "its own is not denied");
        assert_eq!(p.subscribe, ["_INBOX_agent_a1.>", "hermes.cancel.*"]);
    }
}
