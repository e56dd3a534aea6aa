//! Outbound webhooks (docs/webhooks.md): a goal's callbacks and its tenant's standing endpoints
//! are sent the goal's ends and its waits for a person, signed as the Standard Webhooks
//! specification says.
//!
//! - Endpoints live in the `hermes_webhooks` bucket, with their secrets (which no answer shows
//!   after the one that made them). Standing endpoints are mirrored here from a watch of the
//!   bucket, so finding a transition's endpoints costs no round trip.
//! - A committed transition's deliveries are messages on `hermes.webhook.<endpoint>.<goal>`,
//!   published with its events, in order ([`crate::effects`]); the work-queue stream keeps them
//!   until [`crate::workers::webhooks`] has sent them or given up.
//! - Each delivery's record, with every attempt, is in the `hermes_webhook_deliveries` bucket.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use async_nats::jetstream::{kv, stream};
use base64::Engine as _;
use futures::StreamExt as _;
use hermes_core::{Bus, Error, Result};
use hermes_proto::event::Kind;
use hermes_proto::{Callback, Event, GoalState, WebhookDelivery, WebhookEndpoint};
use prost::Message as _;
use tracing::warn;

/// The event types a webhook can be sent, in the order the docs list them.
pub const EVENT_TYPES: [&str; 5] =
    ["goal.completed", "goal.failed", "goal.cancelled", "goal.needs_input", "approval.expired"];

/// The default retry schedule: the wait before each attempt, the first one immediate.
pub const DEFAULT_SCHEDULE: [Duration; 8] = [
    Duration::ZERO,
    Duration::from_secs(5),
    Duration::from_secs(5 * 60),
    Duration::from_secs(30 * 60),
    Duration::from_secs(2 * 3600),
    Duration::from_secs(5 * 3600),
    Duration::from_secs(10 * 3600),
    Duration::from_secs(10 * 3600),
];

/// How long one attempt may take, connecting and reading the answer's head included.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(15);

/// Callbacks one goal may name.
pub const MAX_CALLBACKS: usize = 5;

/// How long delivery records are kept.
const RECORDS_MAX_AGE: Duration = Duration::from_secs(30 * 24 * 3600);

/// The webhook type an event is sent as, if it is one.
pub fn event_type(event: &Event) -> Option<&'static str> {
    Some(match event.kind.as_ref()? {
        Kind::GoalCompleted(_) => "goal.completed",
        Kind::GoalFailed(_) => "goal.failed",
        Kind::GoalCancelled(_) => "goal.cancelled",
        Kind::GoalNeedsInput(_) | Kind::ApprovalRequired(_) => "goal.needs_input",
        Kind::ApprovalDecided(decided) if decided.timed_out => "approval.expired",
        _ => return None,
    })
}

/// The part of the ids that names the event within its goal: its `seq`, or for the approval
/// events an agent or a decision publishes (which have none) the kind and the call.
fn event_part(event: &Event) -> String {
    let call = |kind: &str, call_id: &str| {
        let safe: String = call_id
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
            .collect();
        format!("{kind}-{safe}")
    };
    match &event.kind {
        Some(Kind::ApprovalRequired(required)) => call("needs", &required.call_id),
        Some(Kind::ApprovalDecided(decided)) => call("expired", &decided.call_id),
        _ => event.seq.to_string(),
    }
}

/// The `webhook-id` of an event: the same for every attempt and every endpoint, so a receiver
/// deduplicates with it.
pub fn webhook_id(event: &Event) -> String {
    format!("msg_{}_{}", event.goal_id, event_part(event))
}

/// The terminal event of an ended goal, rebuilt from its state (its `seq` is the goal's last,
/// which the terminal event always is): for the webhooks of a transition whose effects could not
/// be published, whose deliveries' ids (from the goal and the `seq`) are those it would have had.
pub fn terminal_event(state: &GoalState) -> Option<Event> {
    use hermes_proto::{GoalCancelled, GoalCompleted, GoalFailed, GoalNeedsInput, GoalStatus};
    let message = state.error.as_ref().map(|e| e.message.clone()).unwrap_or_default();
    let kind = match GoalStatus::try_from(state.status).ok()? {
        GoalStatus::Completed => {
            Kind::GoalCompleted(GoalCompleted { output_json: state.output_json.clone() })
        }
        GoalStatus::Failed => Kind::GoalFailed(GoalFailed { error: state.error.clone() }),
        GoalStatus::Cancelled => Kind::GoalCancelled(GoalCancelled { reason: message }),
        GoalStatus::NeedsInput => Kind::GoalNeedsInput(GoalNeedsInput { explanation: message }),
        _ => return None,
    };
    Some(Event {
        goal_id: state.goal_id.clone(),
        at_unix_ms: state.updated_unix_ms,
        seq: state.event_seq,
        session_id: state.spec.as_ref().map(|s| s.session_id.clone()).unwrap_or_default(),
        tenant: hermes_core::access::tenant_of(state).unwrap_or_default().to_owned(),
        kind: Some(kind),
    })
}

/// A new signing secret: `whsec_` and the base64 of 32 random bytes.
pub fn new_secret() -> String {
    format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 32]>()))
}

/// `given` when it is a valid secret, a new one when it is empty.
pub fn secret_or_new(given: &str) -> Result<String> {
    if given.is_empty() {
        return Ok(new_secret());
    }
    secret_key(given)?;
    Ok(given.to_owned())
}

/// The key bytes of a secret, checked: `whsec_` and the base64 of 24 to 64 bytes.
pub fn secret_key(secret: &str) -> Result<Vec<u8>> {
    let bad = |reason: &str| Error::InvalidArgument { field: "secret".into(), reason: reason.into() };
    let encoded = secret.strip_prefix("whsec_").ok_or_else(|| bad("must start with `whsec_`"))?;
    let key = base64::engine::general_purpose::STANDARD
        .decode(encoded)
        .map_err(|_| bad("is not `whsec_` and base64"))?;
    if !(24..=64).contains(&key.len()) {
        return Err(bad("must hold 24 to 64 bytes"));
    }
    Ok(key)
}

/// The `webhook-signature` header: `v1,<base64 HMAC-SHA256 of id.timestamp.body>` for each
/// secret, space-separated, so a receiver holding either secret of a rotation accepts it.
pub fn signature(secrets: &[String], id: &str, timestamp: u64, body: &[u8]) -> String {
    let mut signed = Vec::with_capacity(id.len() + 24 + body.len());
    signed.extend_from_slice(id.as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(timestamp.to_string().as_bytes());
    signed.push(b'.');
    signed.extend_from_slice(body);
    secrets
        .iter()
        .filter_map(|secret| secret_key(secret).ok())
        .map(|key| {
            let tag = ring::hmac::sign(&ring::hmac::Key::new(ring::hmac::HMAC_SHA256, &key), &signed);
            format!("v1,{}", base64::engine::general_purpose::STANDARD.encode(tag.as_ref()))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// Checks an endpoint's URL and event filter.
pub fn check_endpoint(url: &str, events: &[String]) -> Result<()> {
    let bad = |field: &str, reason: String| Error::InvalidArgument { field: field.into(), reason };
    let parsed = url::Url::parse(url).map_err(|e| bad("url", format!("`{url}` is not a URL: {e}")))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(bad("url", format!("`{url}`: only http and https are sent to")));
    }
    if parsed.host().is_none() {
        return Err(bad("url", format!("`{url}` has no host")));
    }
    if url.len() > 2048 {
        return Err(bad("url", "is over 2048 bytes".into()));
    }
    if let Some(unknown) = events.iter().find(|e| !EVENT_TYPES.contains(&e.as_str())) {
        return Err(bad("events", format!("`{unknown}` is not one of {}", EVENT_TYPES.join(", "))));
    }
    Ok(())
}

/// Checks an endpoint's body format: empty (Standard Webhooks) or `a2a`.
pub fn check_format(format: &str) -> Result<()> {
    match format {
        "" | FORMAT_A2A => Ok(()),
        other => Err(Error::InvalidArgument {
            field: "format".into(),
            reason: format!(
                "`{other}` is not a webhook format (leave it empty, or `a2a` for A2A push notifications)"
            ),
        }),
    }
}

/// The format of an A2A push-notification endpoint.
pub const FORMAT_A2A: &str = "a2a";

/// The endpoints bucket's key of an endpoint id (`wh-x` is `wh.x`, `cb-g-..-0` is `cb.g-..-0`):
/// standing endpoints are then listed and watched as `wh.>`.
fn key_of(id: &str) -> String {
    id.replacen('-', ".", 1)
}

/// The id of a goal's `n`-th callback.
pub fn callback_id(goal_id: &str, n: usize) -> String {
    format!("cb-{goal_id}-{n}")
}

/// The endpoint without its secrets, as answers show it.
pub fn shown(mut endpoint: WebhookEndpoint) -> WebhookEndpoint {
    endpoint.secrets.clear();
    endpoint.token.clear();
    endpoint.authorization.clear();
    endpoint
}

/// The endpoints, the delivery records, and the standing endpoints' mirror. Cheap to clone.
#[derive(Clone)]
pub struct Webhooks {
    bus: Bus,
    /// The deliveries stream, for reading the oldest delivery of a subject.
    deliveries: stream::Stream,
    endpoints: kv::Store,
    records: kv::Store,
    /// Standing endpoints by tenant (`""` with auth off).
    standing: Arc<RwLock<HashMap<String, Vec<WebhookEndpoint>>>>,
}

impl Webhooks {
    /// Opens (creating them when missing) the deliveries stream and the two buckets, and loads
    /// the standing endpoints; [`Webhooks::mirror`] keeps them current.
    pub async fn open(bus: Bus) -> Result<Webhooks> {
        let topology = bus.topology().clone();
        let replicas = bus.config().replicas;
        let config = stream::Config {
            name: topology.webhooks_stream(),
            description: Some("Hermes webhook deliveries waiting to be sent".into()),
            subjects: vec![topology.all_webhooks()],
            retention: stream::RetentionPolicy::WorkQueue,
            duplicate_window: Duration::from_secs(120),
            num_replicas: replicas,
            ..Default::default()
        };
        let deliveries = hermes_core::bus::patiently(|| async {
            bus.jetstream().get_or_create_stream(config.clone()).await.map_err(|e| Error::JetStream {
                operation: "create the webhooks stream",
                reason: e.to_string(),
            })
        })
        .await?;
        let endpoints = bus
            .ensure_bucket(kv::Config {
                bucket: topology.webhooks_bucket(),
                description: "Hermes webhook endpoints, with their signing secrets".into(),
                history: 1,
                num_replicas: replicas,
                ..Default::default()
            })
            .await?;
        let records = bus
            .ensure_bucket(kv::Config {
                bucket: topology.webhook_deliveries_bucket(),
                description: "Hermes webhook deliveries and their attempts".into(),
                history: 1,
                max_age: RECORDS_MAX_AGE,
                num_replicas: replicas,
                ..Default::default()
            })
            .await?;
        let webhooks = Webhooks { bus, deliveries, endpoints, records, standing: Default::default() };
        webhooks.load_standing().await?;
        Ok(webhooks)
    }

    async fn load_standing(&self) -> Result<()> {
        let mut standing: HashMap<String, Vec<WebhookEndpoint>> = HashMap::new();
        for endpoint in self.list_standing().await? {
            standing.entry(endpoint.tenant.clone()).or_default().push(endpoint);
        }
        *self.standing.write().unwrap_or_else(|p| p.into_inner()) = standing;
        Ok(())
    }

    /// Follows the bucket's standing endpoints until `shutdown`, loading them whole again after a
    /// lost watch.
    pub async fn mirror(self, shutdown: tokio_util::sync::CancellationToken) {
        while !shutdown.is_cancelled() {
            match self.endpoints.watch("wh.>").await {
                Ok(mut watch) => {
                    if let Err(e) = self.load_standing().await {
                        warn!(error = %e, "cannot list the webhook endpoints");
                    }
                    loop {
                        let entry = tokio::select! {
                            _ = shutdown.cancelled() => return,
                            entry = watch.next() => entry,
                        };
                        let Some(Ok(entry)) = entry else { break };
                        let id = entry.key.replacen('.', "-", 1);
                        let mut standing = self.standing.write().unwrap_or_else(|p| p.into_inner());
                        for list in standing.values_mut() {
                            list.retain(|e| e.id != id);
                        }
                        if entry.operation == kv::Operation::Put
                            && let Ok(endpoint) = WebhookEndpoint::decode(entry.value)
                        {
                            standing.entry(endpoint.tenant.clone()).or_default().push(endpoint);
                        }
                    }
                }
                Err(e) => warn!(error = %e, "cannot watch the webhook endpoints"),
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    }

    async fn load_key(&self, key: &str) -> Result<Option<WebhookEndpoint>> {
        get_decoded(&self.endpoints, key, "load webhook endpoint", "WebhookEndpoint").await
    }

    /// An endpoint, secrets included.
    pub async fn endpoint(&self, id: &str) -> Result<Option<WebhookEndpoint>> {
        self.load_key(&key_of(id)).await
    }

    /// Stores a new endpoint; `false` if one with its id exists (a retried submit's callback).
    pub async fn create(&self, endpoint: &WebhookEndpoint) -> Result<bool> {
        match self.endpoints.create(key_of(&endpoint.id), endpoint.encode_to_vec().into()).await {
            Ok(_) => Ok(true),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => Ok(false),
            Err(e) => Err(crate::dead_letters::js_error("create webhook endpoint", e)),
        }
    }

    /// Stores an endpoint over its previous value.
    pub async fn put(&self, endpoint: &WebhookEndpoint) -> Result<()> {
        self.endpoints
            .put(key_of(&endpoint.id), endpoint.encode_to_vec().into())
            .await
            .map(|_| ())
            .map_err(|e| crate::dead_letters::js_error("store webhook endpoint", e))
    }

    pub async fn delete(&self, id: &str) -> Result<()> {
        self.endpoints
            .delete(key_of(id))
            .await
            .map_err(|e| crate::dead_letters::js_error("delete webhook endpoint", e))
    }

    /// Every standing endpoint, read from the bucket (not the mirror, which may lag a change
    /// just made), secrets included.
    pub async fn list_standing(&self) -> Result<Vec<WebhookEndpoint>> {
        let keys = hermes_core::kv::kv_keys_matching(&self.endpoints, "wh.>", "list webhooks").await?;
        let mut endpoints = Vec::new();
        for key in keys {
            endpoints.extend(self.load_key(&key).await?);
        }
        endpoints.sort_by_key(|e| e.created_unix_ms);
        Ok(endpoints)
    }

    /// A tenant's standing endpoints, secrets included.
    pub fn standing_of(&self, tenant: &str) -> Vec<WebhookEndpoint> {
        self.standing.read().unwrap_or_else(|p| p.into_inner()).get(tenant).cloned().unwrap_or_default()
    }

    /// Whether any endpoint could be sent a transition of `state`.
    fn any_for(&self, state: &GoalState) -> bool {
        let has_callbacks = state.spec.as_ref().is_some_and(|s| !s.callbacks.is_empty());
        has_callbacks || {
            let tenant = hermes_core::access::tenant_of(state).unwrap_or_default();
            self.standing.read().unwrap_or_else(|p| p.into_inner()).get(tenant).is_some_and(|l| !l.is_empty())
        }
    }

    /// The deliveries `events` of `state` make: one per event of a webhook type and endpoint
    /// that takes it (the goal's callbacks, then its tenant's standing endpoints). The events are
    /// redacted already.
    pub fn deliveries(&self, state: &GoalState, events: &[Event]) -> Vec<WebhookDelivery> {
        if !self.any_for(state) || events.iter().all(|e| event_type(e).is_none()) {
            return Vec::new();
        }
        let tenant = hermes_core::access::tenant_of(state).unwrap_or_default().to_owned();
        let callbacks: &[Callback] = state.spec.as_ref().map(|s| s.callbacks.as_slice()).unwrap_or_default();
        // (endpoint, event filter, body format)
        let mut targets: Vec<(String, Vec<String>, String)> = callbacks
            .iter()
            .enumerate()
            .map(|(n, c)| (callback_id(&state.goal_id, n), c.events.clone(), c.format.clone()))
            .collect();
        targets.extend(
            self.standing_of(&tenant).into_iter().filter(|e| !e.disabled).map(|e| (e.id, e.events, e.format)),
        );
        let mut deliveries = Vec::new();
        for event in events {
            let Some(kind) = event_type(event) else { continue };
            let id = webhook_id(event);
            let standard = body(kind, event, state);
            for (endpoint_id, filter, format) in &targets {
                if !filter.is_empty() && !filter.iter().any(|f| f == kind) {
                    continue;
                }
                let body = match format.as_str() {
                    FORMAT_A2A => a2a_body(event, state),
                    _ => standard.clone(),
                };
                deliveries.push(WebhookDelivery {
                    id: format!("{}.{}.{endpoint_id}", state.goal_id, event_part(event)),
                    webhook_id: id.clone(),
                    endpoint_id: endpoint_id.clone(),
                    goal_id: state.goal_id.clone(),
                    tenant: tenant.clone(),
                    event_type: kind.to_owned(),
                    body_json: body,
                    created_unix_ms: event.at_unix_ms,
                    state: "pending".into(),
                    ..Default::default()
                });
            }
        }
        deliveries
    }

    /// Publishes the deliveries of one event of `state` made outside a transition (an approval's,
    /// or an ended goal's end sent again), redacted as events are; acks awaited.
    pub async fn publish_event(&self, state: &GoalState, event: Event) -> Result<()> {
        let mut events = [event];
        events.iter_mut().for_each(hermes_core::redact::in_place);
        for delivery in self.deliveries(state, &events) {
            let subject = self.bus.topology().webhook(&delivery.endpoint_id, &delivery.goal_id);
            self.bus.publish(subject, &delivery, &delivery.id, None).await?;
        }
        Ok(())
    }

    /// The oldest delivery left on `subject`, with its stream sequence.
    pub async fn head(&self, subject: &str) -> Result<Option<(u64, WebhookDelivery)>> {
        match self.deliveries.get_first_raw_message_by_subject(subject, 0).await {
            Ok(message) => Ok(WebhookDelivery::decode(message.payload).ok().map(|d| (message.sequence, d))),
            Err(e) if e.kind() == async_nats::jetstream::stream::RawMessageErrorKind::NoMessageFound => {
                Ok(None)
            }
            Err(e) => Err(crate::dead_letters::js_error("read the oldest webhook delivery", e)),
        }
    }

    /// A delivery's record.
    pub async fn record(&self, id: &str) -> Result<Option<WebhookDelivery>> {
        get_decoded(&self.records, id, "load webhook delivery", "WebhookDelivery").await
    }

    pub async fn save_record(&self, record: &WebhookDelivery) -> Result<()> {
        self.records
            .put(record.id.as_str(), record.encode_to_vec().into())
            .await
            .map(|_| ())
            .map_err(|e| crate::dead_letters::js_error("store webhook delivery", e))
    }

    /// Delivery records that `keep` keeps, of one goal when `goal_id` is set, newest first, at most
    /// `limit`. The records are read in the reverse order of their keys, which start with the goal
    /// id (time-ordered, except for goals named by an idempotency key), and the reading stops once
    /// `limit` are kept: a listing of the newest does not read the whole bucket.
    pub async fn records(
        &self,
        goal_id: Option<&str>,
        limit: usize,
        keep: impl Fn(&WebhookDelivery) -> bool,
    ) -> Result<Vec<WebhookDelivery>> {
        let pattern = match goal_id {
            Some(goal_id) => {
                hermes_core::ids::check_id("goal_id", goal_id, 200, hermes_core::ids::IdShape::Word)?;
                format!("{goal_id}.>")
            }
            None => ">".into(),
        };
        let keys =
            hermes_core::kv::kv_keys_matching(&self.records, &pattern, "list webhook deliveries").await?;
        let mut records = Vec::new();
        for key in keys.iter().rev() {
            if records.len() >= limit {
                break;
            }
            if let Some(record) = self.record(key).await?.filter(&keep) {
                records.push(record);
            }
        }
        records.sort_by(|a, b| b.created_unix_ms.cmp(&a.created_unix_ms).then_with(|| b.id.cmp(&a.id)));
        Ok(records)
    }

    /// Publishes a delivery again, from its record, for a new round of its schedule.
    pub async fn resend(&self, record: &WebhookDelivery) -> Result<()> {
        let subject = self.bus.topology().webhook(&record.endpoint_id, &record.goal_id);
        let message = WebhookDelivery {
            attempts: Vec::new(),
            state: "pending".into(),
            next_attempt_unix_ms: 0,
            ..record.clone()
        };
        let msg_id = format!("resend:{}:{}", record.id, hermes_core::now_unix_ms());
        self.bus.publish(subject, &message, &msg_id, None).await.map(|_| ())
    }
}

/// The message at `key` in `kv`, decoded.
async fn get_decoded<M: prost::Message + Default>(
    kv: &kv::Store,
    key: &str,
    operation: &'static str,
    kind: &'static str,
) -> Result<Option<M>> {
    match kv.get(key).await.map_err(|e| crate::dead_letters::js_error(operation, e))? {
        Some(bytes) => Ok(Some(M::decode(bytes).map_err(|e| Error::Decode { kind, reason: e.to_string() })?)),
        None => Ok(None),
    }
}

/// The body of a delivery to an A2A push-notification endpoint: an A2A 1.0 stream response, the
/// task itself (with its output as an artifact) when the goal has ended, else the status update
/// the event makes (input required, with the call waiting; or working, an approval expired).
/// Artifact links are relative to the dispatcher's HTTP API.
fn a2a_body(event: &Event, state: &GoalState) -> String {
    let body = if crate::a2a_view::is_final(state) {
        serde_json::json!({"task": crate::a2a_view::task_value(state, &[], "")})
    } else {
        crate::a2a_view::stream_responses(state, event, "", false).0.pop().unwrap_or_default()
    };
    body.to_string()
}

/// The body of a delivery: `{"type", "timestamp", "data"}` as the specification suggests, the
/// data being the goal's id, tenant, status and labels and the event as `WatchGoal` shows it.
fn body(kind: &str, event: &Event, state: &GoalState) -> String {
    let timestamp = chrono::DateTime::from_timestamp_millis(event.at_unix_ms as i64)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    let status = hermes_proto::GoalStatus::try_from(state.status)
        .map(|s| s.as_str_name().trim_start_matches("GOAL_STATUS_").to_ascii_lowercase())
        .unwrap_or_default();
    let labels = state.spec.as_ref().map(|s| s.labels.clone()).unwrap_or_default();
    serde_json::json!({
        "type": kind,
        "timestamp": timestamp,
        "data": {
            "goal_id": event.goal_id,
            "tenant": hermes_core::access::tenant_of(state).unwrap_or_default(),
            "status": status,
            "labels": labels,
            "event": serde_json::to_value(event).unwrap_or_default(),
        }
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_signature_is_the_specifications_example() {
        // The Standard Webhooks specification's own example (its README and reference
        // libraries): this secret, id, timestamp and body sign to this value.
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw".to_owned();
        let body = br#"{"test": 2432232314}"#;
        assert_eq!(
            signature(&[secret], "msg_p5jXN8AQM9LWM0D4loKWxJek", 1614265330, body),
            "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
        );
    }

    #[test]
    fn two_secrets_give_two_signatures_and_bad_secrets_are_refused() {
        let (a, b) = (new_secret(), new_secret());
        let both = signature(&[a.clone(), b], "id", 1, b"{}");
        assert_eq!(both.split(' ').count(), 2);
        assert!(both.starts_with(&signature(&[a], "id", 1, b"{}")));
        assert!(secret_key("whsec_short").is_err());
        assert!(secret_key("nope").is_err());
        assert!(secret_key(&new_secret()).is_ok());
    }

    #[test]
    fn an_ended_goals_terminal_event_is_rebuilt_with_its_last_seq() {
        use hermes_proto::GoalStatus;
        let state = GoalState {
            goal_id: "g-1".into(),
            status: GoalStatus::Completed as i32,
            event_seq: 7,
            output_json: "42".into(),
            ..Default::default()
        };
        let event = terminal_event(&state).unwrap();
        assert_eq!((event.seq, event_type(&event)), (7, Some("goal.completed")));
        assert_eq!(webhook_id(&event), "msg_g-1_7");
        let running = GoalState { status: GoalStatus::Running as i32, ..state.clone() };
        assert!(terminal_event(&running).is_none());
        let cancelled = GoalState {
            status: GoalStatus::Cancelled as i32,
            error: Some(hermes_proto::Error { message: "stop".into(), ..Default::default() }),
            ..state
        };
        let Some(Kind::GoalCancelled(c)) = terminal_event(&cancelled).unwrap().kind else { panic!() };
        assert_eq!(c.reason, "stop");
    }

    #[test]
    fn endpoints_are_checked() {
        assert!(check_endpoint("https://example.com/hook", &[]).is_ok());
        assert!(check_endpoint("ftp://example.com/hook", &[]).is_err());
        assert!(check_endpoint("not a url", &[]).is_err());
        assert!(check_endpoint("https://example.com/hook", &["goal.done".into()]).is_err());
        assert!(check_endpoint("https://example.com/hook", &["goal.failed".into()]).is_ok());
    }
}
