//! The JetStream bus: one cloneable handle per process that connects (and reconnects), creates the
//! topology idempotently, publishes typed protobuf messages with deterministic `Nats-Msg-Id`s and
//! awaited acks, and consumes typed messages from durable pull consumers.
//!
//! A message that does not decode is terminated and copied to the DLQ stream with the reason, so a
//! poison message is never retried forever and never stops a consumer.

use std::sync::Arc;
use std::time::Duration;

use async_nats::HeaderMap;
use async_nats::jetstream::{self, AckKind, consumer, kv, stream};
use bytes::Bytes;
use tracing::{debug, warn};

use crate::error::{Error, Result};
use crate::topology::Topology;
use crate::trace::{self, TraceContext};

/// The oldest nats-server Hermes runs against: older servers lack per-message TTLs and
/// `sync_interval`, and async-nats' defaults assume 2.10 or later.
pub const MIN_SERVER_VERSION: (u64, u64) = (2, 10);

/// Header naming why a message was dead-lettered.
pub const DLQ_REASON: &str = "Hermes-Dlq-Reason";
/// Header naming the subject the dead-lettered message was published on.
pub const DLQ_SUBJECT: &str = "Hermes-Dlq-Subject";
/// Header naming the stream and sequence the dead-lettered message came from.
pub const DLQ_ORIGIN: &str = "Hermes-Dlq-Origin";

/// How to reach NATS and how to lay out JetStream.
#[derive(Debug, Clone)]
pub struct BusConfig {
    /// The server's URL (or a cluster's, comma-separated), credentials and all; it prints
    /// without them.
    pub url: crate::secret::SecretUrl,
    pub topology: Topology,
    /// Connection name shown in server monitoring.
    pub name: String,
    pub connect_timeout: Duration,
    /// How long events stay replayable for WatchGoal.
    pub events_max_age: Duration,
    /// Stream replicas; 1 for a single server, 3 in production.
    pub replicas: usize,
    /// Payloads above this travel as artifacts (see [`crate::artifacts`]); keep it below the
    /// server's `max_payload`.
    pub inline_limit: usize,
    /// The longest an artifact is kept (the object store's max age).
    pub artifacts_max_age: Duration,
    /// A NATS credentials file (JWT and NKey seed) to authenticate with. User and password can
    /// instead be given in the URL (`nats://user:password@host:4222`).
    pub credentials_file: Option<std::path::PathBuf>,
    /// The prefix of this connection's reply subjects (every request, JetStream API call and
    /// publish ack answers there). `None`: `_INBOX_<user>` when the URL names a user, else
    /// `_INBOX`. With one inbox prefix per NATS user, a server can forbid each user the others'
    /// replies (`deploy/nats/accounts.conf`).
    pub inbox_prefix: Option<String>,
    /// TLS to the server ([`NatsTls`]); without any of its files the connection is plaintext
    /// unless the URL says `tls://`.
    pub tls: NatsTls,
    /// A file holding the password of the URL's user (`nats://agent_<id>@host`), read again at
    /// every connect: a Kubernetes projected service-account token, which the kubelet renews in
    /// place, is an agent's identity there (`hermes_registry::identities`).
    pub password_file: Option<std::path::PathBuf>,
}

/// TLS of a NATS connection (`nats.tls.*`): the CAs to trust for the server's certificate, and
/// a client certificate with its key for a server that requires one (mTLS). Any of them makes
/// TLS required: the connection never falls back to plaintext.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct NatsTls {
    /// CA certificates (PEM) the server's certificate must chain to; unset: the system's roots.
    pub ca_file: Option<std::path::PathBuf>,
    /// The client's certificate chain (PEM), for a server that verifies clients.
    pub cert_file: Option<std::path::PathBuf>,
    /// The private key of `cert_file` (PEM).
    pub key_file: Option<std::path::PathBuf>,
}

impl NatsTls {
    /// Whether any TLS file is set.
    pub fn enabled(&self) -> bool {
        self.ca_file.is_some() || self.cert_file.is_some() || self.key_file.is_some()
    }

    /// `options` with these files: each must exist, and a certificate needs its key. Errors name
    /// the setting.
    pub fn apply(&self, mut options: async_nats::ConnectOptions) -> Result<async_nats::ConnectOptions> {
        if !self.enabled() {
            return Ok(options);
        }
        let readable = |setting: &str, path: &std::path::Path| {
            std::fs::metadata(path).map(|_| ()).map_err(|e| Error::InvalidArgument {
                field: format!("{setting} (HERMES_{})", setting.replace('.', "_").to_uppercase()),
                reason: format!("cannot read {}: {e}", path.display()),
            })
        };
        if let Some(ca) = &self.ca_file {
            readable("nats.tls.ca_file", ca)?;
            options = options.add_root_certificates(ca.clone());
        }
        match (&self.cert_file, &self.key_file) {
            (Some(cert), Some(key)) => {
                readable("nats.tls.cert_file", cert)?;
                readable("nats.tls.key_file", key)?;
                options = options.add_client_certificate(cert.clone(), key.clone());
            }
            (None, None) => {}
            _ => {
                return Err(Error::InvalidArgument {
                    field: "nats.tls.cert_file, nats.tls.key_file".into(),
                    reason: "a client certificate needs its key, and a key its certificate: set both".into(),
                });
            }
        }
        Ok(options.require_tls(true))
    }

    /// The files set, in the order [`NatsTls::check`] takes their contents: CAs, certificate, key.
    fn files(&self) -> Vec<std::path::PathBuf> {
        [&self.ca_file, &self.cert_file, &self.key_file].into_iter().flatten().cloned().collect()
    }

    /// Whether `contents` (of [`NatsTls::files`], `None` for one that cannot be read) make what
    /// a connection presents and trusts: PEM CAs, and a certificate chain with its own key.
    fn check(&self, contents: &[Option<Vec<u8>>]) -> anyhow::Result<()> {
        use crate::tls::{pem_certificates, pem_private_key};
        let mut contents = contents.iter();
        let mut next = |setting: &str| -> anyhow::Result<Vec<u8>> {
            contents.next().cloned().flatten().ok_or_else(|| anyhow::anyhow!("cannot read {setting}"))
        };
        if self.ca_file.is_some() {
            pem_certificates("nats.tls.ca_file", &next("nats.tls.ca_file")?)?;
        }
        if self.cert_file.is_some() && self.key_file.is_some() {
            let chain = pem_certificates("nats.tls.cert_file", &next("nats.tls.cert_file")?)?;
            let key = pem_private_key("nats.tls.key_file", &next("nats.tls.key_file")?)?;
            rustls::sign::CertifiedKey::from_der(chain, key, &rustls::crypto::ring::default_provider())
                .map_err(|e| anyhow::anyhow!("the certificate and its key do not match: {e}"))?;
        }
        Ok(())
    }

    /// Follows the files of `client`'s connection until `stop`: on SIGHUP and when they change
    /// ([`crate::reload`]), files that make a TLS identity ([`NatsTls::check`]) and differ from
    /// the ones in force are taken by reconnecting, so the server sees the new certificate (and
    /// the new CAs judge its own) at once; others are refused, logged, and the connection stays.
    /// async-nats reads the files at each connection, so a reconnect of any cause takes them too.
    fn follow(&self, client: async_nats::Client, stop: tokio_util::sync::CancellationToken) {
        let files = self.files();
        let read_at_start: Vec<Option<Vec<u8>>> = files.iter().map(|f| std::fs::read(f).ok()).collect();
        let (tls, mut in_force) = (self.clone(), read_at_start.clone());
        let watched =
            crate::reload::Watched { what: "NATS TLS certificate", event: "nats_tls", files, read_at_start };
        crate::reload::follow(watched, stop, move |contents| {
            if contents == in_force.as_slice() {
                return Ok("unchanged: the connection keeps them".into());
            }
            tls.check(contents)?;
            in_force = contents.to_vec();
            let client = client.clone();
            tokio::spawn(async move {
                if let Err(e) = client.force_reconnect().await {
                    warn!(error = %e, "cannot reconnect to NATS with the certificate read again");
                }
            });
            Ok("reconnecting to NATS with them".into())
        });
    }
}

impl BusConfig {
    /// The defaults for a server at `url`: one replica, no credentials. Services get theirs from
    /// their settings (`hermes_runtime::NatsSettings`); nothing here reads the environment.
    pub fn new(url: impl Into<crate::secret::SecretUrl>) -> Self {
        Self {
            url: url.into(),
            topology: Topology::default(),
            name: "hermes".to_owned(),
            connect_timeout: Duration::from_secs(5),
            events_max_age: Duration::from_secs(7 * 24 * 3600),
            replicas: 1,
            inline_limit: crate::artifacts::DEFAULT_INLINE_LIMIT,
            artifacts_max_age: Duration::from_secs(7 * 24 * 3600),
            credentials_file: None,
            inbox_prefix: None,
            password_file: None,
            tls: NatsTls::default(),
        }
    }

    pub fn with_name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The user this connection authenticates as: the URL's, with its password there or in
    /// `password_file` (a lone token names no user).
    pub fn user(&self) -> Option<String> {
        match &self.password_file {
            Some(_) => url_credentials(self.url.expose()).map(|(user, _)| user),
            None => url_user(self.url.expose()),
        }
    }
}

/// The process-wide handle. Cheap to clone.
#[derive(Clone)]
pub struct Bus {
    inner: Arc<BusInner>,
}

struct BusInner {
    client: async_nats::Client,
    js: jetstream::Context,
    config: BusConfig,
    goals: kv::Store,
    agents: kv::Store,
    /// `None` on an agent's own identity, which reaches it only through a task's token.
    ledger: Option<kv::Store>,
    approvals: kv::Store,
    artifacts: crate::artifacts::Artifacts,
    /// Stops the following of the connection's TLS files ([`NatsTls::follow`]) when the last
    /// handle is dropped.
    _tls_follow: Option<tokio_util::sync::DropGuard>,
    /// Buckets opened through [`Bus::ensure_bucket`], by name: opening one is a JetStream API
    /// round trip, which a per-call user (the tool cache) must not pay each time.
    opened: std::sync::Mutex<std::collections::HashMap<String, kv::Store>>,
}

/// What the server said about a publish.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishOutcome {
    pub sequence: u64,
    /// The server had already stored a message with the same `Nats-Msg-Id`.
    pub duplicate: bool,
}

fn is_subject_token(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The credentials a NATS URL carries, from the first of a cluster's URLs that has any: the user
/// and its password (`user:password@`), or a lone token (`token@`, no password). async-nats reads
/// none from the URL itself; [`Bus::connect`] applies these.
pub fn url_credentials(url: &str) -> Option<(String, Option<String>)> {
    let addr = server_urls(url)
        .iter()
        .filter_map(|u| u.parse::<async_nats::ServerAddr>().ok())
        .find(|a| a.username().is_some())?;
    Some((addr.username()?.to_owned(), addr.password().map(str::to_owned)))
}

/// The user a NATS URL connects as ([`url_credentials`] with a password; a lone token names no
/// user).
pub fn url_user(url: &str) -> Option<String> {
    url_credentials(url).and_then(|(user, password)| password.map(|_| user))
}

/// The URLs of `url`, a comma-separated list of a cluster's servers (or one server).
pub fn server_urls(url: &str) -> Vec<String> {
    url.split(',').map(str::trim).filter(|u| !u.is_empty()).map(str::to_owned).collect()
}

/// Options that authenticate as `user` with the password in `path`, read at every connect.
fn password_file_options(user: String, path: &std::path::Path) -> Result<async_nats::ConnectOptions> {
    let read = |path: &std::path::Path| {
        std::fs::read_to_string(path).map(|p| p.trim().to_owned()).map_err(|e| {
            format!("cannot read the password file {} (nats.password_file): {e}", path.display())
        })
    };
    // Read once now, so a missing file stops the start with its name.
    read(path).map_err(|reason| Error::InvalidArgument {
        field: "nats.password_file (HERMES_NATS_PASSWORD_FILE)".into(),
        reason,
    })?;
    let path = path.to_path_buf();
    Ok(async_nats::ConnectOptions::with_auth_callback(move |_nonce| {
        let (user, password) = (user.clone(), read(&path));
        async move {
            let mut auth = async_nats::Auth::new();
            auth.username = Some(user);
            auth.password = Some(password.map_err(async_nats::AuthError::new)?);
            Ok(auth)
        }
    }))
}

impl Bus {
    /// Connects, checks the server version and makes sure every stream and bucket exists.
    pub async fn connect(config: BusConfig) -> Result<Bus> {
        if !(1..=5).contains(&config.replicas) {
            return Err(Error::InvalidArgument {
                field: "nats.replicas (HERMES_NATS_REPLICAS)".into(),
                reason: "must be a number of stream replicas from 1 to 5".into(),
            });
        }
        let mut options = async_nats::ConnectOptions::new();
        let mut inbox_prefix = config.inbox_prefix.clone().unwrap_or_else(|| "_INBOX".to_owned());
        // A cluster is given as its servers' URLs, comma-separated; the client connects to one and
        // fails over to the others (and to those the servers announce) by itself.
        let urls = server_urls(config.url.expose());
        let credentials = url_credentials(config.url.expose());
        if let Some(user) = config.user()
            && config.inbox_prefix.is_none()
        {
            inbox_prefix = format!("_INBOX_{user}");
        }
        match (credentials, &config.password_file) {
            (Some((user, None)), Some(path)) => options = password_file_options(user, path)?,
            (_, Some(_)) => {
                return Err(Error::InvalidArgument {
                    field: "nats.password_file (HERMES_NATS_PASSWORD_FILE)".into(),
                    reason: "goes with a URL that names a user and no password (nats://user@host:4222)"
                        .into(),
                });
            }
            (Some((user, Some(password))), None) => options = options.user_and_password(user, password),
            (Some((token, None)), None) => options = options.token(token),
            (None, None) => {}
        }
        if !is_subject_token(inbox_prefix.trim_start_matches('_')) {
            return Err(Error::InvalidArgument {
                field: "nats.inbox_prefix (HERMES_NATS_INBOX_PREFIX)".into(),
                reason: format!("`{inbox_prefix}` must be one subject token of [A-Za-z0-9_-]"),
            });
        }
        // A server refuses a forbidden publish or subscription with an -ERR on the connection,
        // not on the request, which then times out: say what was refused.
        options = options.custom_inbox_prefix(inbox_prefix).event_callback(|event| async move {
            if let async_nats::Event::ServerError(e) = event {
                tracing::warn!(error = %e, "the NATS server refused an operation of this connection");
            }
        });
        options = config.tls.apply(options)?;
        if let Some(path) = &config.credentials_file {
            options = options.credentials_file(path).await.map_err(|e| Error::InvalidArgument {
                field: "nats.creds (HERMES_NATS_CREDS)".into(),
                reason: format!("cannot read credentials file {}: {e}", path.display()),
            })?;
        }
        let client = options
            .name(&config.name)
            .connection_timeout(config.connect_timeout)
            // A server that stops answering (frozen, partitioned) is left after two missed pings,
            // for another of the cluster: async-nats's default (a minute) would hold every pull
            // and publish of this process on it for two.
            .ping_interval(Duration::from_secs(3))
            // After the first connection succeeds, reconnect forever; services ride out a
            // nats-server restart without being restarted themselves.
            .max_reconnects(None)
            // The credentials are in `options`: the URLs it is given carry none, so a debug log of
            // async-nats's (which prints the server address it dials) cannot show them.
            .connect(urls.iter().map(|u| crate::secret::without_userinfo(u)).collect::<Vec<_>>())
            .await
            .map_err(|source| Error::Connect {
                reason: config.url.scrub(&source.to_string()),
                url: config.url.clone(),
                refused: source.kind() == async_nats::ConnectErrorKind::AuthorizationViolation,
            })?;
        check_server_version(&client.server_info().version)?;
        let js = jetstream::new(client.clone());
        let max_payload = client.server_info().max_payload;
        if max_payload > 0 && config.inline_limit + 4096 > max_payload {
            return Err(Error::InvalidArgument {
                field: "inline_limit".into(),
                reason: format!(
                    "{} bytes does not leave room for headers under the server's max_payload of {max_payload}",
                    config.inline_limit
                ),
            });
        }
        // An agent's own identity may not read the ledger or the artifacts: it asks the memory
        // service with a task's token (crate::broker), so it does not open them.
        let brokered = config.user().is_some_and(|u| crate::broker::is_agent_identity(&u));
        let (goals, agents, ledger, approvals, artifacts) = match brokered {
            false => {
                let ([goals, agents, ledger, approvals], store) = provision(&js, &config).await?;
                let bucket = config.topology.artifacts_bucket();
                let artifacts =
                    crate::artifacts::Artifacts::new(&js, &bucket, store, config.inline_limit).await?;
                (goals, agents, Some(ledger), approvals, artifacts)
            }
            true => {
                let [goals, agents, approvals] = patiently(|| ensure_shared(&js, &config)).await?;
                (goals, agents, None, approvals, crate::artifacts::Artifacts::closed(config.inline_limit))
            }
        };
        let _tls_follow = config.tls.enabled().then(|| {
            let stop = tokio_util::sync::CancellationToken::new();
            config.tls.follow(client.clone(), stop.clone());
            stop.drop_guard()
        });
        Ok(Bus {
            inner: Arc::new(BusInner {
                _tls_follow,
                client,
                js,
                config,
                goals,
                agents,
                ledger,
                approvals,
                artifacts,
                opened: Default::default(),
            }),
        })
    }

    pub fn client(&self) -> &async_nats::Client {
        &self.inner.client
    }

    pub fn jetstream(&self) -> &jetstream::Context {
        &self.inner.js
    }

    pub fn topology(&self) -> &Topology {
        &self.inner.config.topology
    }

    pub fn config(&self) -> &BusConfig {
        &self.inner.config
    }

    /// The `hermes_goals` bucket: goal id to `GoalState`.
    pub fn goals(&self) -> &kv::Store {
        &self.inner.goals
    }

    /// The `hermes_agents` bucket: agent id to last `AgentHeartbeat`.
    pub fn agents(&self) -> crate::agents::AgentStore {
        crate::agents::AgentStore::new(self.inner.agents.clone())
    }

    /// The `hermes_approvals` bucket: call id to `Approval`.
    /// Approvals of tool calls; every write goes through the store's compare-and-set.
    pub fn approvals(&self) -> crate::approvals::ApprovalStore {
        crate::approvals::ApprovalStore::new(self.inner.approvals.clone())
    }

    /// Opens the KV bucket `config` describes, creating it when it does not exist yet (racing
    /// creators agree on one). For buckets owned by one service, such as the memory service's.
    /// A bucket is opened once per connection; later calls return the same handle.
    pub async fn ensure_bucket(&self, config: kv::Config) -> Result<kv::Store> {
        fn opened(
            inner: &BusInner,
        ) -> std::sync::MutexGuard<'_, std::collections::HashMap<String, kv::Store>> {
            inner.opened.lock().unwrap_or_else(|p| p.into_inner())
        }
        if let Some(store) = opened(&self.inner).get(&config.bucket) {
            return Ok(store.clone());
        }
        let bucket = config.bucket.clone();
        let store = patiently(|| ensure_bucket(&self.inner.js, config.clone())).await?;
        opened(&self.inner).insert(bucket, store.clone());
        Ok(store)
    }

    /// The `hermes_artifacts` object store: payloads too large to send inline. On an agent's own
    /// identity every operation is refused: use [`Bus::task_artifacts`].
    pub fn artifacts(&self) -> &crate::artifacts::Artifacts {
        &self.inner.artifacts
    }

    /// The `hermes_ledger` bucket: side-effect idempotency key to the recorded outcome, and the
    /// crash markers of running tasks. On an agent's own identity every operation is refused:
    /// use [`Bus::task_ledger`].
    pub fn ledger(&self) -> crate::ledger::LedgerStore {
        match &self.inner.ledger {
            Some(kv) => crate::ledger::store(kv.clone()),
            None => crate::task_kv::TaskKv::closed(crate::task_kv::LEDGER),
        }
    }

    /// Whether this connection is an agent's own identity, which reaches the ledger and the
    /// artifacts only through the memory service ([`crate::broker`]).
    pub fn brokered(&self) -> bool {
        self.inner.ledger.is_none()
    }

    /// The ledger as a task whose `memory_token` is `token` reaches it: the bucket itself, or on
    /// an agent's own identity that task's goal's entries through the memory service.
    pub fn task_ledger(&self, token: &str) -> crate::ledger::LedgerStore {
        match self.brokered() {
            false => self.ledger(),
            true => crate::task_kv::TaskKv::brokered(self.task_broker(token), crate::task_kv::LEDGER),
        }
    }

    /// The artifacts as a task whose `memory_token` is `token` reaches them (as [`Bus::task_ledger`]).
    pub fn task_artifacts(&self, token: &str) -> crate::artifacts::Artifacts {
        match self.brokered() {
            false => self.inner.artifacts.clone(),
            true => {
                crate::artifacts::Artifacts::brokered(self.task_broker(token), self.inner.config.inline_limit)
            }
        }
    }

    /// A task's way to the memory service's brokered task data, with its `memory_token`.
    pub fn task_broker(&self, token: &str) -> crate::broker::TaskBroker {
        crate::broker::TaskBroker::new(self.inner.client.clone(), self.topology().clone(), token.to_owned())
    }

    /// Publishes `message` to a JetStream subject and waits for the ack. `msg_id` must be
    /// deterministic for the thing being published, so that a retry deduplicates.
    pub async fn publish<M: prost::Message>(
        &self,
        subject: String,
        message: &M,
        msg_id: &str,
        trace: Option<&TraceContext>,
    ) -> Result<PublishOutcome> {
        self.publish_bytes(subject, Bytes::from(message.encode_to_vec()), msg_id, trace).await
    }

    /// Publishes one goal event on `hermes.event.<goal_id>` (a batch of one, see
    /// [`crate::events`]), redacted (see [`crate::redact::event`]) and with the trace context of
    /// the current span.
    pub async fn publish_event(&self, event: &hermes_proto::Event, msg_id: &str) -> Result<PublishOutcome> {
        let subject = self.topology().event(&event.goal_id);
        let trace = TraceContext::current();
        let batch = crate::events::encode(&[crate::redact::event(event)]);
        self.publish_bytes(subject, batch, msg_id, trace.as_ref()).await
    }

    /// Publishes raw bytes; see [`Bus::publish`].
    pub async fn publish_bytes(
        &self,
        subject: String,
        payload: Bytes,
        msg_id: &str,
        trace: Option<&TraceContext>,
    ) -> Result<PublishOutcome> {
        self.send_bytes(subject, payload, msg_id, trace).await?.await
    }

    /// Sends a message to JetStream and returns the wait for its ack. Sends made one after the
    /// other (each awaited before the next) are stored in that order, while their acks can be
    /// awaited together; publishing many futures at once does not keep their order.
    pub async fn send_bytes(
        &self,
        subject: String,
        payload: Bytes,
        msg_id: &str,
        trace: Option<&TraceContext>,
    ) -> Result<impl std::future::Future<Output = Result<PublishOutcome>> + use<>> {
        let mut headers = HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, msg_id);
        if let Some(trace) = trace {
            headers.insert(trace::TRACEPARENT, trace.to_header().as_str());
        }
        let pending = self
            .inner
            .js
            .publish_with_headers(subject.clone(), headers, payload)
            .await
            .map_err(|e| Error::Publish { subject: subject.clone(), reason: e.to_string() })?;
        let msg_id = msg_id.to_owned();
        Ok(async move {
            let ack = pending
                .await
                .map_err(|e| Error::Publish { subject: subject.clone(), reason: e.to_string() })?;
            if ack.duplicate {
                debug!(subject = %subject, msg_id, "publish deduplicated by jetstream");
            }
            Ok(PublishOutcome { sequence: ack.sequence, duplicate: ack.duplicate })
        })
    }

    /// Creates (or binds to) a durable pull consumer, [`patiently_for`] [`CONSUMER_PATIENCE`]: a
    /// JetStream cluster starting, or electing a leader, times out or has none for a while.
    /// Creating it again is harmless, since one that was created after all is then bound to.
    pub async fn durable_consumer(&self, spec: ConsumerSpec) -> Result<consumer::PullConsumer> {
        patiently_for(CONSUMER_PATIENCE, || async {
            let stream = self
                .inner
                .js
                .get_stream(&spec.stream)
                .await
                .map_err(|e| Error::jetstream("get stream", e))?;
            stream
                .get_or_create_consumer(&spec.name, consumer_config(&spec))
                .await
                .map_err(|e| Error::jetstream("create consumer", e))
        })
        .await
    }

    /// The messages of a durable consumer that heals itself: when the consumer disappears (a
    /// dispatcher deletes an agent's directed consumer while taking over its work after the agent
    /// looked dead, and the agent turns out to be alive), it is created again and pulling goes
    /// on. Pull errors on a consumer that still exists are passed on for the caller to log.
    pub fn resilient_messages(
        &self,
        spec: ConsumerSpec,
        batch: usize,
    ) -> impl futures::Stream<Item = Result<jetstream::Message>> + Send + Unpin + 'static {
        use futures::StreamExt;
        type Messages = consumer::pull::Stream;
        let bus = self.clone();
        Box::pin(futures::stream::unfold(
            (None::<Messages>, bus, spec, batch),
            |(mut current, bus, spec, batch)| async move {
                loop {
                    if current.is_none() {
                        let opened = match bus.durable_consumer(spec.clone()).await {
                            Ok(consumer) => pull(&consumer, batch).await,
                            Err(e) => Err(e),
                        };
                        match opened {
                            Ok(messages) => current = Some(messages),
                            Err(e) => {
                                // Another process may still hold an overlapping consumer; try again.
                                tokio::time::sleep(Duration::from_secs(1)).await;
                                let reason = format!("consumer {}: {e}", spec.name);
                                return Some((
                                    Err(Error::JetStream { operation: "open consumer", reason }),
                                    (None, bus, spec, batch),
                                ));
                            }
                        }
                    }
                    let next = current.as_mut().map(|m| m.next());
                    let Some(next) = next else { continue };
                    match next.await {
                        Some(Ok(message)) => return Some((Ok(message), (current, bus, spec, batch))),
                        Some(Err(e)) => {
                            // Only the server's "no such consumer" says it is gone: a cluster
                            // electing a meta leader answers info requests with errors or not at
                            // all for a while, and the consumer is still there.
                            let exists = match bus.inner.js.get_stream(&spec.stream).await {
                                Ok(stream) => !matches!(
                                    stream.consumer_info(&spec.name).await,
                                    Err(e) if e.kind() == jetstream::context::ConsumerInfoErrorKind::NotFound
                                ),
                                Err(_) => true,
                            };
                            if !exists {
                                warn!(consumer = %spec.name, "consumer was deleted; creating it again");
                                current = None;
                                continue;
                            }
                            // Open the pull again: its pending requests may have died with the
                            // server that led the consumer (a JetStream cluster elects another),
                            // and a stream left on them would wait for nothing.
                            return Some((Err(Error::jetstream("pull", e)), (None, bus, spec, batch)));
                        }
                        None => current = None,
                    }
                }
            },
        ))
    }

    /// Copies a message that cannot be processed to `hermes.dlq.<kind>` with the reason, then
    /// terminates the original so it is never redelivered.
    pub async fn dead_letter(&self, kind: &str, msg: &jetstream::Message, reason: &str) {
        let origin = msg
            .info()
            .map(|i| format!("{}:{}", i.stream, i.stream_sequence))
            .unwrap_or_else(|_| "unknown".to_owned());
        let why = crate::topology::truncate_for_message(reason);
        match self.publish_dead_letter(kind, &msg.subject, &origin, &why, msg.payload.clone()).await {
            Ok(()) => {
                warn!(kind, origin = %origin, reason, event = "dead_lettered", "message moved to dlq");
                if let Err(e) = msg.ack_with(AckKind::Term).await {
                    warn!(error = %e, "failed to terminate dead-lettered message");
                }
            }
            // Leave the original unacked so it is redelivered and dead-lettered on a later try,
            // rather than dropping it.
            Err(e) => warn!(kind, origin = %origin, error = %e, "failed to publish to dlq"),
        }
    }

    /// Stores a copy of a message on `hermes.dlq.<kind>` with why, where it was published
    /// (`subject`) and where it came from (`origin`, `<stream>:<seq>`) in headers; the message id
    /// `dlq:<origin>` keeps a second copy of the same message out.
    pub async fn publish_dead_letter(
        &self,
        kind: &str,
        subject: &str,
        origin: &str,
        reason: &str,
        payload: bytes::Bytes,
    ) -> Result<()> {
        let mut headers = HeaderMap::new();
        headers.insert(async_nats::header::NATS_MESSAGE_ID, format!("dlq:{origin}").as_str());
        headers.insert(DLQ_REASON, crate::redact::redact_text(reason).as_ref());
        headers.insert(DLQ_SUBJECT, subject);
        headers.insert(DLQ_ORIGIN, origin);
        let dlq = self.topology().dlq(kind);
        let failed =
            |e: &dyn std::fmt::Display| Error::Publish { subject: dlq.clone(), reason: e.to_string() };
        let ack = self
            .inner
            .js
            .publish_with_headers(dlq.clone(), headers, payload)
            .await
            .map_err(|e| failed(&e))?;
        ack.await.map_err(|e| failed(&e))?;
        crate::metrics::global().dead_letters.get_or_create(&crate::metrics::labels(&[("kind", kind)])).inc();
        Ok(())
    }

    /// Decodes a consumed message, dead-lettering it when it is not a valid `M`.
    pub async fn decode_or_dead_letter<M: prost::Message + Default>(
        &self,
        kind: &str,
        msg: jetstream::Message,
    ) -> Option<Delivery<M>> {
        match Delivery::decode(kind, msg) {
            Ok(delivery) => Some(delivery),
            Err(bad) => {
                self.dead_letter(kind, &bad.0, &bad.1).await;
                None
            }
        }
    }
}

/// What a handler made of its message. The consumer loop ([`consume_concurrently`]) settles it
/// with [`Delivery::settle`], the one place Hermes acks, naks and dead-letters what it consumes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Handled {
    /// Done: acknowledged, confirmed by the server, so it is never redelivered.
    Done,
    /// Done, and a redelivery would be harmless (the handler is idempotent): acknowledged
    /// without waiting for the server.
    DoneUnconfirmed,
    /// Not done, for a reason that may pass (a dependency unreachable): delivered again after
    /// `after`. The server stops at the consumer's max deliveries and the dispatcher
    /// dead-letters it then (`POISON_MESSAGE`).
    Retry { after: Duration },
    /// Can never succeed: moved to the DLQ with `reason` and not delivered again.
    Reject { reason: String },
    /// Handed to someone who settles it later with [`Delivery::settle`] (a batching inbox).
    Kept,
}

/// The consumer loop every Hermes consumer runs: `handle` on each message of `messages`, at most
/// `concurrency` at once. A permit is taken before waiting for the next message, so no more than
/// `concurrency` messages are ever held. When `shutdown` is cancelled it stops taking messages,
/// hands back what was pulled but not started ([`hand_back`]), waits for the running handlers,
/// and returns; it also returns when the stream ends.
///
/// Each message is decoded as an `M` (one that is not goes to the DLQ under `kind`) and given to
/// `handle`, and what the handler returns ([`Handled`]) is how the loop settles it: handlers
/// never ack or nak themselves.
pub async fn consume_concurrently<M, S, E, F, Fut>(
    bus: &Bus,
    kind: &'static str,
    messages: &mut S,
    concurrency: usize,
    shutdown: &tokio_util::sync::CancellationToken,
    handle: F,
) where
    M: prost::Message + Default + Send + Sync + 'static,
    S: futures::Stream<Item = std::result::Result<jetstream::Message, E>> + Unpin,
    E: std::fmt::Display,
    F: Fn(Arc<Delivery<M>>) -> Fut,
    Fut: std::future::Future<Output = Handled> + Send + 'static,
{
    use futures::StreamExt;
    let permits = Arc::new(tokio::sync::Semaphore::new(concurrency.max(1)));
    let mut running = tokio::task::JoinSet::new();
    loop {
        let permit = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            permit = permits.clone().acquire_owned() => match permit {
                Ok(p) => p,
                Err(_) => break,
            },
        };
        let next = tokio::select! {
            biased;
            _ = shutdown.cancelled() => break,
            next = messages.next() => next,
        };
        match next {
            Some(Ok(msg)) => {
                let bus = bus.clone();
                match Delivery::<M>::decode(kind, msg) {
                    Ok(delivery) => {
                        let delivery = Arc::new(delivery);
                        let work = handle(delivery.clone());
                        // Boxed: tokio keeps a task's future inline in its cell and moves it
                        // whole when it spawns and finishes the task (four copies of a handler's
                        // few kilobytes a message, a few percent of a fan-out's CPU by `perf`);
                        // a box is one pointer to move.
                        running.spawn(Box::pin(async move {
                            let _permit = permit;
                            let handled = work.await;
                            delivery.settle(&bus, kind, handled).await;
                        }));
                    }
                    Err(bad) => {
                        running.spawn(async move {
                            let _permit = permit;
                            bus.dead_letter(kind, &bad.0, &bad.1).await;
                        });
                    }
                }
            }
            Some(Err(e)) => {
                warn!(error = %e, "pull failed; retrying");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            None => break,
        }
        while running.try_join_next().is_some() {}
    }
    if shutdown.is_cancelled() {
        hand_back(messages).await;
    }
    while running.join_next().await.is_some() {}
}

/// How long one pull request waits on the server, and how often the server says it is alive
/// while it has nothing to send. A pull request lives on the server that leads its consumer: when
/// that server dies or freezes (a JetStream cluster elects another leader), the client learns it
/// only from missing heartbeats (after two) or its request's expiry. These are shorter than the
/// client's defaults (30 s and 15 s), so a pull left on a dead leader is noticed within seconds.
pub const PULL_EXPIRES: Duration = Duration::from_secs(10);
/// See [`PULL_EXPIRES`].
pub const PULL_HEARTBEAT: Duration = Duration::from_secs(2);

/// Up to `limit` messages of `stream` on `filter`, from stream sequence `start` on, oldest
/// first, decoded, each with its stream sequence (an ordered consumer that reads what is there
/// now, then stops). One that does not decode is logged and skipped. `what` names the data in
/// errors.
pub async fn read_filtered<M: prost::Message + Default>(
    js: &jetstream::Context,
    stream: &str,
    filter: String,
    start: u64,
    limit: usize,
    what: &'static str,
) -> Result<Vec<(u64, M)>> {
    use futures::StreamExt as _;
    let unavailable = |e: &dyn std::fmt::Display| Error::Unavailable(format!("{what}: {e}"));
    let stream = js.get_stream(stream).await.map_err(|e| unavailable(&e))?;
    let mut consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: filter,
            deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: start.max(1) },
            ..Default::default()
        })
        .await
        .map_err(|e| unavailable(&e))?;
    let pending = consumer.info().await.map_err(|e| unavailable(&e))?.num_pending as usize;
    let wanted = pending.min(limit);
    let mut out = Vec::with_capacity(wanted);
    if wanted == 0 {
        return Ok(out);
    }
    let mut messages = consumer.messages().await.map_err(|e| unavailable(&e))?;
    while out.len() < wanted {
        let message = match tokio::time::timeout(Duration::from_secs(5), messages.next()).await {
            Ok(Some(Ok(message))) => message,
            Ok(Some(Err(e))) => return Err(unavailable(&e)),
            Ok(None) | Err(_) => break,
        };
        let seq = message.info().map(|i| i.stream_sequence).unwrap_or_default();
        match M::decode(message.payload.clone()) {
            Ok(decoded) => out.push((seq, decoded)),
            Err(e) => warn!(seq, error = %e, what, "an undecodable message"),
        }
    }
    Ok(out)
}

/// A pull stream of up to `batch` messages per request, with [`PULL_EXPIRES`] and
/// [`PULL_HEARTBEAT`]: every long-lived consumer of Hermes pulls through this.
pub async fn pull(consumer: &consumer::PullConsumer, batch: usize) -> Result<consumer::pull::Stream> {
    consumer
        .stream()
        .max_messages_per_batch(batch)
        .expires(PULL_EXPIRES)
        .heartbeat(PULL_HEARTBEAT)
        .messages()
        .await
        .map_err(|e| Error::jetstream("pull", e))
}

/// How long a handed-back message that came straight back to this process waits before it is
/// delivered again: this process was its only puller (an agent's own consumer), so it waits for
/// another replica or for the dispatcher's takeover of the agent's work.
pub const HAND_BACK_DELAY: Duration = Duration::from_secs(5);

/// The shutdown tail of a consumer loop: naks every message pulled but not started, for
/// immediate redelivery to another consumer, until nothing arrives for 20 ms. A message that
/// comes back (nobody else pulls from the consumer) is nak'ed once more with
/// [`HAND_BACK_DELAY`] rather than over and over, which would spend its deliveries and dead-letter
/// it.
pub async fn hand_back<S, E>(messages: &mut S)
where
    S: futures::Stream<Item = std::result::Result<jetstream::Message, E>> + Unpin,
{
    use futures::StreamExt;
    let mut handed = std::collections::HashSet::new();
    while let Ok(Some(next)) = tokio::time::timeout(Duration::from_millis(20), messages.next()).await {
        // One consumer's pull error says nothing of the messages the others hold.
        let Ok(msg) = next else { continue };
        let again = msg.info().is_ok_and(|info| !handed.insert(info.stream_sequence));
        let delay = again.then_some(HAND_BACK_DELAY);
        let _ = msg.ack_with(AckKind::Nak(delay)).await;
    }
}

/// How long [`Bus::durable_consumer`] tries again while JetStream times out or has no leader.
pub const CONSUMER_PATIENCE: Duration = Duration::from_secs(30);

fn consumer_config(spec: &ConsumerSpec) -> consumer::pull::Config {
    consumer::pull::Config {
        durable_name: Some(spec.name.clone()),
        filter_subject: spec.filter_subject.clone(),
        ack_policy: consumer::AckPolicy::Explicit,
        ack_wait: spec.ack_wait,
        max_deliver: spec.max_deliver,
        max_ack_pending: spec.max_ack_pending,
        ..Default::default()
    }
}

pub use crate::kv::{kv_current, kv_keys, kv_keys_matching};

/// The settings of an existing consumer that differ from `spec`'s, each as `name: in effect
/// (wanted)`. [`Bus::durable_consumer`] binds to a consumer as it is: one that serves a whole pool
/// keeps the settings of whoever created it first.
pub fn config_differences(config: &consumer::Config, spec: &ConsumerSpec) -> Vec<String> {
    let mut out = Vec::new();
    if config.ack_wait != spec.ack_wait {
        out.push(format!("ack_wait: {:?} (wanted {:?})", config.ack_wait, spec.ack_wait));
    }
    if config.max_deliver != spec.max_deliver {
        out.push(format!("max_deliver: {} (wanted {})", config.max_deliver, spec.max_deliver));
    }
    if config.max_ack_pending != spec.max_ack_pending {
        out.push(format!("max_ack_pending: {} (wanted {})", config.max_ack_pending, spec.max_ack_pending));
    }
    if config.filter_subject != spec.filter_subject {
        out.push(format!("filter_subject: {} (wanted {})", config.filter_subject, spec.filter_subject));
    }
    out
}

/// A durable pull consumer to create or bind.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub stream: String,
    pub name: String,
    pub filter_subject: String,
    pub ack_wait: Duration,
    pub max_deliver: i64,
    pub max_ack_pending: i64,
}

/// A decoded message with its acknowledgement handle.
pub struct Delivery<M> {
    pub message: M,
    pub trace: Option<TraceContext>,
    raw: jetstream::Message,
}

impl<M: prost::Message + Default> Delivery<M> {
    /// Decodes a consumed message; when it is not a valid `M`, gives it back with the reason.
    pub fn decode(
        kind: &str,
        msg: jetstream::Message,
    ) -> std::result::Result<Self, Box<(jetstream::Message, String)>> {
        match M::decode(msg.payload.clone()) {
            Ok(message) => {
                let trace = trace::extract(msg.headers.as_ref());
                Ok(Delivery { message, trace, raw: msg })
            }
            Err(e) => Err(Box::new((msg, format!("cannot decode {kind}: {e}")))),
        }
    }
}

impl Delivery<()> {
    /// A message taken as it is, without decoding, to settle one that is skipped.
    pub fn undecoded(msg: jetstream::Message) -> Self {
        Delivery { message: (), trace: trace::extract(msg.headers.as_ref()), raw: msg }
    }
}

impl<M> Delivery<M> {
    /// Settles the message as `handled` says: the one place acks, naks and dead letters are
    /// written (see [`Handled`]). Failures to reach the server are logged; the server then
    /// redelivers after the ack wait.
    pub async fn settle(&self, bus: &Bus, kind: &str, handled: Handled) {
        let result = match handled {
            Handled::Done => self.raw.double_ack().await.map_err(|e| Error::jetstream("ack", e)),
            Handled::DoneUnconfirmed => self.raw.ack().await.map_err(|e| Error::jetstream("ack", e)),
            Handled::Retry { after } => {
                self.raw.ack_with(AckKind::Nak(Some(after))).await.map_err(|e| Error::jetstream("nak", e))
            }
            Handled::Reject { reason } => {
                bus.dead_letter(kind, &self.raw, &reason).await;
                Ok(())
            }
            Handled::Kept => Ok(()),
        };
        if let Err(e) = result {
            warn!(kind, error = %e, "cannot settle a message; the server redelivers it after its ack wait");
        }
    }

    /// The message's payload as stored.
    pub fn payload(&self) -> &Bytes {
        &self.raw.payload
    }

    /// How many times the server has delivered this message, starting at 1.
    pub fn delivered(&self) -> i64 {
        self.raw.info().map(|i| i.delivered).unwrap_or(1)
    }

    pub fn subject(&self) -> &str {
        self.raw.subject.as_str()
    }

    pub fn raw(&self) -> &jetstream::Message {
        &self.raw
    }

    /// Tells the server work is ongoing, resetting AckWait.
    pub async fn progress(&self) -> Result<()> {
        self.raw.ack_with(AckKind::Progress).await.map_err(|e| Error::jetstream("progress", e))
    }
}

/// Refuses servers older than [`MIN_SERVER_VERSION`].
pub fn check_server_version(version: &str) -> Result<()> {
    let mut parts = version.trim_start_matches('v').split(['.', '-']);
    let major = parts.next().and_then(|p| p.parse::<u64>().ok());
    let minor = parts.next().and_then(|p| p.parse::<u64>().ok());
    match (major, minor) {
        (Some(major), Some(minor)) if (major, minor) >= MIN_SERVER_VERSION => Ok(()),
        _ => Err(Error::ServerTooOld {
            found: version.to_owned(),
            required: format!("{}.{}", MIN_SERVER_VERSION.0, MIN_SERVER_VERSION.1),
        }),
    }
}

/// How long a service starting tries again to create or open Hermes's streams and buckets while
/// JetStream answers as it does when a cluster is still forming or electing a leader.
pub const PROVISION_PATIENCE: Duration = Duration::from_secs(60);

/// Whether a JetStream failure is one a cluster that is forming or electing a leader gives, and
/// goes away by itself: a request timed out (408) or found no responder, no leader yet (503), or
/// too few peers for the replicas (JetStream error 10023, 10005) yet, or the stream just made not
/// yet known to the server asked. Judged on the message, which is what the creating calls leave.
fn transient(reason: &str) -> bool {
    let reason = reason.to_ascii_lowercase();
    [
        "timed out",
        "no responders",
        "request failed",
        "leader",
        "insufficient resources",
        "no suitable peers",
        "temporarily unavailable",
        "503",
        "408",
        "10023",
        "10005",
        // Every step creates its stream first: a stream not found just after is one a cluster's
        // server has not learnt of yet (a fresh bucket read through another server).
        "no stream found",
        "stream not found",
    ]
    .iter()
    .any(|t| reason.contains(t))
}

/// Runs `step` (creating or opening streams, buckets or consumers: idempotent), trying again
/// for up to [`PROVISION_PATIENCE`] while it fails with a [`transient`] JetStream error: every
/// try finds what an earlier one (or another service) created. For services starting on a
/// JetStream cluster that is still forming or electing a leader.
pub async fn patiently<T, F, Fut>(step: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    patiently_for(PROVISION_PATIENCE, step).await
}

/// [`patiently`], for up to `patience`.
pub async fn patiently_for<T, F, Fut>(patience: Duration, mut step: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    let deadline = std::time::Instant::now() + patience;
    let mut pause = Duration::from_millis(100);
    loop {
        match step().await {
            Ok(done) => return Ok(done),
            Err(Error::JetStream { operation, reason })
                if transient(&reason) && std::time::Instant::now() + pause < deadline =>
            {
                warn!(operation, reason, "JetStream is not ready yet; trying again");
                tokio::time::sleep(pause).await;
                pause = (pause * 2).min(Duration::from_secs(2));
            }
            Err(e) => return Err(e),
        }
    }
}

/// Creates or opens the streams, buckets and object store, [`patiently`].
async fn provision(
    js: &jetstream::Context,
    config: &BusConfig,
) -> Result<([kv::Store; 4], jetstream::object_store::ObjectStore)> {
    patiently(|| async { Ok((ensure_topology(js, config).await?, ensure_artifacts(js, config).await?)) })
        .await
}

async fn ensure_topology(js: &jetstream::Context, config: &BusConfig) -> Result<[kv::Store; 4]> {
    let [goals, agents, approvals] = ensure_shared(js, config).await?;
    let ledger = ensure_bucket(
        js,
        kv::Config {
            bucket: config.topology.ledger_bucket(),
            description: "Hermes side-effect ledger: what a side-effecting tool call did".into(),
            history: 1,
            max_age: Duration::from_secs(7 * 24 * 3600),
            num_replicas: config.replicas,
            ..Default::default()
        },
    )
    .await?;
    Ok([goals, agents, ledger, approvals])
}

/// The streams and the buckets every connection opens, an agent's own identity's included.
async fn ensure_shared(js: &jetstream::Context, config: &BusConfig) -> Result<[kv::Store; 3]> {
    let t = &config.topology;
    let dedupe = Duration::from_secs(120);
    let streams = [
        stream::Config {
            name: t.tasks_stream(),
            description: Some("Hermes tasks, one message per node attempt".into()),
            subjects: vec![t.all_tasks()],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: dedupe,
            num_replicas: config.replicas,
            ..Default::default()
        },
        stream::Config {
            name: t.results_stream(),
            description: Some("Hermes task results, consumed by the dispatchers".into()),
            subjects: vec![t.all_results()],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: dedupe,
            num_replicas: config.replicas,
            ..Default::default()
        },
        stream::Config {
            name: t.plans_stream(),
            description: Some(
                "Hermes plan requests (for planners) and plan results (for dispatchers)".into(),
            ),
            subjects: vec![t.all_plans()],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: dedupe,
            num_replicas: config.replicas,
            ..Default::default()
        },
        stream::Config {
            name: t.events_stream(),
            description: Some("Hermes goal events, replayed by WatchGoal".into()),
            subjects: vec![t.all_events()],
            retention: stream::RetentionPolicy::Limits,
            max_age: config.events_max_age,
            duplicate_window: dedupe,
            num_replicas: config.replicas,
            ..Default::default()
        },
        stream::Config {
            name: t.dlq_stream(),
            description: Some("Hermes dead letters: messages that could not be processed".into()),
            subjects: vec![t.all_dlq()],
            retention: stream::RetentionPolicy::Limits,
            max_age: Duration::from_secs(30 * 24 * 3600),
            duplicate_window: dedupe,
            num_replicas: config.replicas,
            ..Default::default()
        },
    ];
    for cfg in streams {
        let name = cfg.name.clone();
        js.get_or_create_stream(cfg)
            .await
            .map_err(|e| Error::JetStream { operation: "create stream", reason: format!("{name}: {e}") })?;
    }
    let goals = ensure_bucket(
        js,
        kv::Config {
            bucket: t.goals_bucket(),
            description: "Hermes goal state, updated by compare-and-set".into(),
            history: 1,
            num_replicas: config.replicas,
            ..Default::default()
        },
    )
    .await?;
    let agents = ensure_bucket(
        js,
        kv::Config {
            bucket: t.agents_bucket(),
            description: "Hermes agents' last heartbeats".into(),
            history: 1,
            max_age: crate::agents::MAX_AGE,
            num_replicas: config.replicas,
            ..Default::default()
        },
    )
    .await?;
    let approvals = ensure_bucket(
        js,
        kv::Config {
            bucket: t.approvals_bucket(),
            description: "Hermes tool-call approvals, pending and decided".into(),
            history: 1,
            max_age: Duration::from_secs(30 * 24 * 3600),
            num_replicas: config.replicas,
            ..Default::default()
        },
    )
    .await?;
    Ok([goals, agents, approvals])
}

async fn ensure_artifacts(
    js: &jetstream::Context,
    config: &BusConfig,
) -> Result<jetstream::object_store::ObjectStore> {
    ensure_object_store(
        js,
        jetstream::object_store::Config {
            bucket: config.topology.artifacts_bucket(),
            description: Some("Hermes artifacts: payloads too large to send inline".into()),
            max_age: config.artifacts_max_age,
            num_replicas: config.replicas,
            ..Default::default()
        },
    )
    .await
}

/// Opens the object store `config` describes, creating it when it does not exist yet (a creator
/// that loses the race to another opens the other's).
pub async fn ensure_object_store(
    js: &jetstream::Context,
    config: jetstream::object_store::Config,
) -> Result<jetstream::object_store::ObjectStore> {
    let bucket = config.bucket.clone();
    if let Ok(store) = js.get_object_store(&bucket).await {
        return Ok(store);
    }
    match js.create_object_store(config).await {
        Ok(store) => Ok(store),
        // Another process created it between our get and create.
        Err(create_err) => js.get_object_store(&bucket).await.map_err(|_| Error::JetStream {
            operation: "create object store",
            reason: format!("{bucket}: {create_err}"),
        }),
    }
}

async fn ensure_bucket(js: &jetstream::Context, config: kv::Config) -> Result<kv::Store> {
    if let Ok(store) = js.get_key_value(&config.bucket).await {
        return Ok(store);
    }
    let bucket = config.bucket.clone();
    match js.create_key_value(config).await {
        Ok(store) => Ok(store),
        // Another process created it between our get and create.
        Err(create_err) => js.get_key_value(&bucket).await.map_err(|_| Error::JetStream {
            operation: "create kv bucket",
            reason: format!("{bucket}: {create_err}"),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_forming_cluster_is_waited_for_and_a_wrong_config_is_not() {
        assert!(transient("HERMES_TASKS: timed out"));
        assert!(transient(
            "HERMES_TASKS: JetStream error: insufficient resources (code 503, error code 10023)"
        ));
        assert!(transient("hermes_goals: no responders"));
        assert!(transient("create consumer: timed out"));
        assert!(transient("create consumer: request failed"));
        assert!(transient(
            "write the task key: other error: failed getting entry: no stream found for given subject"
        ));
        assert!(!transient("HERMES_TASKS: stream name already in use with a different configuration"));
    }

    #[test]
    fn old_servers_are_refused() {
        check_server_version("2.15.1").unwrap();
        check_server_version("2.10.0").unwrap();
        check_server_version("3.0.0").unwrap();
        let err = check_server_version("2.9.10").unwrap_err();
        assert!(err.to_string().contains("2.9.10 is too old"), "{err}");
        assert!(check_server_version("garbage").is_err());
    }
}
