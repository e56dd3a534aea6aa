//! The dispatcher as a [`hermes_runtime::Service`]: its settings and how it starts.

use std::time::Duration;

use hermes_llm::config::LlmSettings;
use hermes_runtime::{Context, GrpcSettings, NatsSettings};
use serde::{Deserialize, Serialize};

use crate::config::DispatcherConfig;

/// The `[dispatcher]` section, shared by `hermes-dispatcher` and `hermes up`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatchSettings {
    /// Whole-goal timeout for goals that do not set one, in seconds.
    pub goal_timeout_secs: u64,
    /// Per-attempt deadline for nodes that do not set one, in seconds.
    pub node_timeout_secs: u64,
    /// Most nodes a plan may have.
    pub max_nodes: usize,
    /// A planner service (`hermes-planner`) runs in this deployment: accept goals given as text.
    pub planner_service: bool,
    /// Results applied at once.
    pub result_concurrency: usize,
    /// Seconds a node waits for an agent serving its task type before it fails with
    /// NO_CAPABLE_AGENT.
    pub no_agent_wait_secs: u64,
    /// Milliseconds a catalogue snapshot is reused for plan validation.
    pub catalog_ttl_ms: u64,
    /// Goal event streams one client (peer address) may hold open at once.
    pub max_watches_per_client: usize,
    /// Goal event streams all clients together may hold open at once.
    pub max_watches: usize,
    /// The API tokens file (docs/security.md); empty: auth off.
    pub api_tokens_file: String,
    /// Serve a non-loopback address with auth off, when a proxy in front authenticates.
    pub allow_unauthenticated: bool,
    /// Record every model exchange of a goal (planner, summarizer, agents) and its agent loops'
    /// tool calls, for `hermes replay`.
    pub record_model_exchanges: bool,
    /// The HTTP API (docs/http.md).
    pub http: HttpSettings,
    /// Outbound webhooks (docs/webhooks.md).
    pub webhooks: WebhookSettings,
}

/// The `[dispatcher.webhooks]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct WebhookSettings {
    /// The wait before each attempt (`0s`, `5s`, `5m`, `2h`); as many attempts as waits.
    pub schedule: Vec<String>,
    /// Seconds one attempt may take.
    pub timeout_secs: u64,
    /// Addresses sent to although private, loopback or link-local (`10.0.0.0/8`, `127.0.0.1`).
    pub allow: Vec<String>,
}

impl Default for WebhookSettings {
    fn default() -> Self {
        let config = crate::config::WebhookConfig::default();
        WebhookSettings {
            schedule: config.schedule.iter().map(|d| format_wait(*d)).collect(),
            timeout_secs: config.timeout.as_secs(),
            allow: config.allow,
        }
    }
}

/// A wait as the schedule writes it: `0s`, `5s`, `5m`, `2h`.
fn format_wait(wait: Duration) -> String {
    match wait.as_secs() {
        s if s > 0 && s % 3600 == 0 => format!("{}h", s / 3600),
        s if s > 0 && s % 60 == 0 => format!("{}m", s / 60),
        s if wait.subsec_millis() == 0 => format!("{s}s"),
        _ => format!("{}ms", wait.as_millis()),
    }
}

/// A wait of the schedule: a number and `ms`, `s`, `m` or `h`.
fn parse_wait(text: &str) -> anyhow::Result<Duration> {
    let text = text.trim();
    let split = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, unit) = text.split_at(split);
    let n: u64 = number.parse().map_err(|_| {
        anyhow::anyhow!("dispatcher.webhooks.schedule: `{text}` is not a wait such as 5s, 5m or 2h")
    })?;
    Ok(match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        "h" => Duration::from_secs(n * 3600),
        _ => anyhow::bail!("dispatcher.webhooks.schedule: `{text}`: the unit is ms, s, m or h"),
    })
}

impl WebhookSettings {
    pub fn config(&self) -> anyhow::Result<crate::config::WebhookConfig> {
        let schedule = self.schedule.iter().map(|w| parse_wait(w)).collect::<anyhow::Result<Vec<_>>>()?;
        if schedule.is_empty() {
            anyhow::bail!("dispatcher.webhooks.schedule is empty: it needs at least one attempt (`0s`)");
        }
        Ok(crate::config::WebhookConfig {
            schedule,
            timeout: Duration::from_secs(self.timeout_secs.max(1)),
            allow: self.allow.clone(),
        })
    }
}

/// The `[dispatcher.http]` section: the HTTP API.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct HttpSettings {
    /// The address it listens on; `off` (or empty): no HTTP server.
    pub listen: String,
    /// Largest request body in bytes; a larger one is 413.
    pub max_body_bytes: usize,
    /// Origins a browser may call the API from (`*` for any); empty: no CORS headers.
    pub cors_allow_origins: Vec<String>,
    /// Host names the API answers to besides its listen address (`localhost` on loopback);
    /// `.example.com`: its subdomains; `*`: any.
    pub allowed_hosts: Vec<String>,
    /// TLS of the HTTP API; off without a certificate.
    pub tls: hermes_core::tls::TlsSettings,
    /// The web console at `/` (docs/console.md).
    pub console: ConsoleSettings,
}

/// The `[dispatcher.http.console]` section: the web console.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ConsoleSettings {
    /// Serve the console at `/`.
    pub enabled: bool,
    /// A goal's trace link, with `{trace_id}` in it; empty: no link.
    pub trace_url: String,
}

impl Default for ConsoleSettings {
    fn default() -> Self {
        let config = crate::console::ConsoleConfig::default();
        ConsoleSettings { enabled: config.enabled, trace_url: config.trace_url }
    }
}

impl Default for HttpSettings {
    fn default() -> Self {
        HttpSettings {
            listen: "127.0.0.1:8080".to_owned(),
            max_body_bytes: crate::http::DEFAULT_MAX_BODY_BYTES,
            cors_allow_origins: Vec::new(),
            allowed_hosts: Vec::new(),
            tls: Default::default(),
            console: ConsoleSettings::default(),
        }
    }
}

impl HttpSettings {
    /// The server's config, or `None` when it is off.
    pub fn config(&self) -> anyhow::Result<Option<crate::http::HttpConfig>> {
        let listen = self.listen.trim();
        if listen.is_empty() || listen.eq_ignore_ascii_case("off") {
            return Ok(None);
        }
        let listen = listen.parse().map_err(|_| {
            anyhow::anyhow!("dispatcher.http.listen `{listen}` is not an address (host:port, or `off`)")
        })?;
        Ok(Some(crate::http::HttpConfig {
            listen,
            max_body_bytes: self.max_body_bytes.max(1024),
            cors_allow_origins: self.cors_allow_origins.clone(),
            allowed_hosts: self.allowed_hosts.clone(),
            tls: self.tls.load("dispatcher.http.tls")?,
            console: crate::console::ConsoleConfig {
                enabled: self.console.enabled,
                trace_url: self.console.trace_url.trim().to_owned(),
            },
        }))
    }
}

impl Default for DispatchSettings {
    fn default() -> Self {
        let config = DispatcherConfig::default();
        DispatchSettings {
            goal_timeout_secs: config.goal_timeout.as_secs(),
            node_timeout_secs: config.node_timeout.as_secs(),
            max_nodes: config.max_nodes,
            planner_service: config.planner,
            result_concurrency: config.result_concurrency,
            no_agent_wait_secs: config.no_agent_wait.as_secs(),
            catalog_ttl_ms: config.catalog_ttl.as_millis() as u64,
            max_watches_per_client: config.max_watches_per_client,
            max_watches: config.max_watches,
            api_tokens_file: String::new(),
            allow_unauthenticated: false,
            record_model_exchanges: config.record_model_exchanges,
            http: HttpSettings::default(),
            webhooks: WebhookSettings::default(),
        }
    }
}

/// Earlier names of `[dispatcher]` keys (`HERMES_GOAL_TIMEOUT_SECS`, ...).
pub const ALIASES: &[(&str, &str)] = &[
    ("goal_timeout_secs", "dispatcher.goal_timeout_secs"),
    ("node_timeout_secs", "dispatcher.node_timeout_secs"),
    ("max_nodes", "dispatcher.max_nodes"),
    ("planner_service", "dispatcher.planner_service"),
    ("http_listen", "dispatcher.http.listen"),
    ("api_tokens_file", "dispatcher.api_tokens_file"),
    ("allow_unauthenticated", "dispatcher.allow_unauthenticated"),
    ("http_max_body_bytes", "dispatcher.http.max_body_bytes"),
    ("http_cors_allow_origins", "dispatcher.http.cors_allow_origins"),
    ("http_allowed_hosts", "dispatcher.http.allowed_hosts"),
];

/// Help for the `[dispatcher]` keys.
pub fn describe(key: &str) -> Option<&'static str> {
    Some(match key {
        "dispatcher.goal_timeout_secs" => "Whole-goal timeout for goals that set none, in seconds.",
        "dispatcher.node_timeout_secs" => "Per-attempt deadline for nodes that set none, in seconds.",
        "dispatcher.max_nodes" => "Most nodes a plan may have.",
        "dispatcher.planner_service" => {
            "A planner service runs in this deployment: accept goals given as text."
        }
        "dispatcher.result_concurrency" => "Results applied at once.",
        "dispatcher.no_agent_wait_secs" => {
            "Seconds a node waits for a capable agent before NO_CAPABLE_AGENT."
        }
        "dispatcher.catalog_ttl_ms" => "Milliseconds a catalogue snapshot is reused for plan validation.",
        "dispatcher.max_watches_per_client" => {
            "Goal event streams (gRPC, SSE, WebSocket) one client may hold open at once."
        }
        "dispatcher.max_watches" => {
            "Goal event streams (gRPC, SSE, WebSocket) all clients together may hold open at once."
        }
        "dispatcher.api_tokens_file" => {
            "API tokens (TOML, hashed, each with a tenant and roles; docs/security.md); unset: auth off."
        }
        "dispatcher.allow_unauthenticated" => {
            "Serve a non-loopback address with auth off (only behind a proxy that authenticates)."
        }
        "dispatcher.record_model_exchanges" => {
            "Record each goal's model exchanges (planner, summarizer, agents) and agent tool calls for hermes replay (docs/evaluation.md)."
        }
        "dispatcher.http.listen" => "The HTTP API's address (docs/http.md); `off`: none.",
        "dispatcher.http.max_body_bytes" => "Largest HTTP request body in bytes; larger is 413.",
        "dispatcher.http.cors_allow_origins" => {
            "Origins a browser may call the HTTP API from, state-changing calls included (`*`: any)."
        }
        "dispatcher.http.allowed_hosts" => {
            "Host names the HTTP API answers to besides its listen address (`.example.com`: subdomains, `*`: any); others get 421."
        }
        "dispatcher.webhooks.schedule" => {
            "Waits before each webhook attempt (0s, 5s, 5m, 2h...); after the last the delivery goes to the DLQ (docs/webhooks.md)."
        }
        "dispatcher.webhooks.timeout_secs" => "Seconds one webhook attempt may take.",
        "dispatcher.webhooks.allow" => {
            "Addresses webhooks may be sent to although private or loopback (10.0.0.0/8, 127.0.0.1:*)."
        }
        "dispatcher.http.console.enabled" => "Serve the web console at `/` (docs/console.md).",
        "dispatcher.http.console.trace_url" => {
            "The console's link to a goal's trace, with `{trace_id}` in it (Jaeger: http://jaeger:16686/trace/{trace_id})."
        }
        "dispatcher.http.tls.cert_file" => "The HTTP API's TLS certificate chain (PEM); unset: plaintext.",
        "dispatcher.http.tls.key_file" => "The private key of dispatcher.http.tls.cert_file (PEM).",
        "dispatcher.http.tls.client_ca_file" => {
            "CAs (PEM) whose client certificates the HTTP API requires (mTLS)."
        }
        _ => return None,
    })
}

impl DispatchSettings {
    /// The dispatcher's config, with the summarizer and prices of `llm` and the server of `grpc`.
    pub fn config(&self, llm: &LlmSettings, grpc: &GrpcSettings) -> anyhow::Result<DispatcherConfig> {
        let config = self.config_unchecked(llm, grpc)?;
        // A cost budget with no prices would never trip: say so at start.
        if config.prices == crate::engine::Prices::default()
            && let Some(tenant) = config.access.current().quotas.iter().find(|q| q.daily_cost_usd.is_some())
        {
            anyhow::bail!(
                "tenant `{}` has a daily_cost_usd quota, but no LLM prices are set (llm.price_input_per_mtok, llm.price_output_per_mtok), so goals cost nothing and it would never apply",
                tenant.name
            );
        }
        Ok(config)
    }

    fn config_unchecked(&self, llm: &LlmSettings, grpc: &GrpcSettings) -> anyhow::Result<DispatcherConfig> {
        Ok(DispatcherConfig {
            grpc_listen: grpc.listen,
            grpc_max_message_bytes: grpc.max_message_bytes,
            grpc_tls: grpc.tls.load("grpc.tls")?,
            max_nodes: self.max_nodes.max(1),
            goal_timeout: Duration::from_secs(self.goal_timeout_secs.max(1)),
            node_timeout: Duration::from_secs(self.node_timeout_secs.max(1)),
            catalog_ttl: Duration::from_millis(self.catalog_ttl_ms),
            result_concurrency: self.result_concurrency.max(1),
            no_agent_wait: Duration::from_secs(self.no_agent_wait_secs),
            planner: self.planner_service,
            http: self.http.config()?,
            max_watches_per_client: self.max_watches_per_client.max(1),
            max_watches: self.max_watches.max(1),
            access: hermes_core::access::Tokens::from_setting(&self.api_tokens_file)?,
            allow_unauthenticated: self.allow_unauthenticated,
            record_model_exchanges: self.record_model_exchanges,
            webhooks: self.webhooks.config()?,
            summarizer: llm.summarizer_model()?.map(crate::workers::summaries::Summarizer),
            prices: crate::engine::Prices {
                input_per_mtok: llm.price_input_per_mtok,
                output_per_mtok: llm.price_output_per_mtok,
            },
        })
    }
}

/// Settings of `hermes-dispatcher`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct DispatcherSettings {
    pub nats: NatsSettings,
    pub metrics_listen: Option<std::net::SocketAddr>,
    pub drain_timeout_secs: u64,
    pub grpc: GrpcSettings,
    pub dispatcher: DispatchSettings,
    /// The model that writes the answers of goals given as text, and the prices of tokens.
    pub llm: LlmSettings,
}

impl Default for DispatcherSettings {
    fn default() -> Self {
        DispatcherSettings {
            nats: NatsSettings::default(),
            metrics_listen: None,
            drain_timeout_secs: hermes_runtime::DEFAULT_DRAIN_TIMEOUT_SECS,
            grpc: GrpcSettings::local(50051),
            dispatcher: DispatchSettings::default(),
            llm: LlmSettings::default(),
        }
    }
}

impl hermes_runtime::Settings for DispatcherSettings {
    fn aliases() -> Vec<(&'static str, &'static str)> {
        [ALIASES, hermes_llm::config::ALIASES].concat()
    }

    fn describe(key: &str) -> Option<&'static str> {
        describe(key)
            .or_else(|| hermes_llm::config::describe(key))
            .or_else(|| hermes_runtime::settings::describe(key))
    }
}

hermes_runtime::service_settings!(DispatcherSettings);

/// `hermes-dispatcher`.
pub struct DispatcherService;

impl hermes_runtime::Service for DispatcherService {
    const NAME: &'static str = "hermes-dispatcher";
    const ABOUT: &'static str = "Hermes dispatcher and gRPC API";
    type Settings = DispatcherSettings;

    async fn start(settings: DispatcherSettings, cx: &mut Context) -> anyhow::Result<()> {
        let config = settings.dispatcher.config(&settings.llm, &settings.grpc)?;
        let bus = cx.connect(&settings.nats).await?;
        settings.llm.govern(&bus).await?;
        let started = crate::start(config, cx).await?;
        // The bound addresses (a configured port 0 shows the one chosen).
        let grpc = cx.grpc_addr().unwrap_or(settings.grpc.listen);
        match started.http_addr {
            Some(http) => println!("hermes dispatcher: grpc {grpc} http {http}"),
            None => println!("hermes dispatcher: grpc {grpc}"),
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_webhook_schedule_reads_and_writes_back() {
        let settings = super::WebhookSettings::default();
        assert_eq!(settings.schedule, ["0s", "5s", "5m", "30m", "2h", "5h", "10h", "10h"]);
        assert_eq!(settings.config().unwrap(), crate::config::WebhookConfig::default());
        let odd = super::WebhookSettings { schedule: vec!["250ms".into(), "1s".into()], ..settings.clone() };
        assert_eq!(odd.config().unwrap().schedule[0], std::time::Duration::from_millis(250));
        for bad in ["5 parsecs", "x", "5d"] {
            let bad = super::WebhookSettings { schedule: vec![bad.into()], ..settings.clone() };
            assert!(bad.config().is_err());
        }
        assert!(super::WebhookSettings { schedule: vec![], ..settings }.config().is_err());
    }

    #[test]
    fn keys_do_not_clash() {
        hermes_runtime::config::check_keys::<super::DispatcherSettings>().unwrap();
    }
}
