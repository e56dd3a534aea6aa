//! The webhooks worker: sends each delivery on the webhooks stream to its endpoint, signed, and
//! keeps its record (docs/webhooks.md).
//!
//! - Order: a delivery is sent only when it is the oldest message of its subject
//!   (`hermes.webhook.<endpoint>.<goal>`) left in the work-queue stream, so one goal's events reach
//!   one endpoint in order, across replicas and restarts. A later one waits until then.
//! - Retries: the wait before each attempt is the schedule's (or a `429`/`503`'s `Retry-After`),
//!   kept by the server as the delay of a nak, and written in the record, so a restart or a kill
//!   waits out the rest of it and no more. A delivery whose schedule ran out is moved to the DLQ
//!   (`hermes dlq replay` starts a new round).
//! - `410 Gone` disables the endpoint; what is waiting for it is then dropped, recorded as such.

use std::sync::Arc;
use std::time::{Duration, Instant};

use async_nats::jetstream::consumer::PullConsumer;
use hermes_core::bus::Handled;
use hermes_core::egress::{Entry, Policy};
use hermes_core::{Delivery, Result, now_unix_ms};
use hermes_proto::{WebhookAttempt, WebhookDelivery, WebhookEndpoint};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::config::WebhookConfig;
use crate::webhooks::{Webhooks, signature};

/// How long the server waits for a delivery being sent to be settled before it sends it again:
/// longer than an attempt may take.
pub(crate) const WEBHOOK_ACK_WAIT: Duration = Duration::from_secs(60);
/// Deliveries handled at once (each waits at most the attempt timeout).
const CONCURRENCY: usize = 64;
/// Longest wait a `Retry-After` may ask for.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// What an attempt's answer means.
enum Outcome {
    Delivered,
    Gone,
    /// Try again, after the `Retry-After` when the receiver gave one.
    Again(Option<Duration>),
    /// The address filter refused the endpoint: no attempt will pass.
    Refused,
}

/// Sends deliveries; cheap to clone.
#[derive(Clone)]
pub(crate) struct Sender {
    webhooks: Webhooks,
    client: reqwest::Client,
    policy: Arc<Policy>,
    schedule: Arc<Vec<Duration>>,
}

impl Sender {
    pub(crate) fn new(webhooks: Webhooks, config: &WebhookConfig) -> anyhow::Result<Sender> {
        let entries = config
            .allow
            .iter()
            .map(|e| Entry::parse(e).map_err(|e| anyhow::anyhow!("dispatcher.webhooks.allow: {e}")))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let policy = Arc::new(Policy { entries });
        let client = Policy::client(&policy, config.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .user_agent(concat!("hermes-webhooks/", env!("CARGO_PKG_VERSION")))
            .build()?;
        Ok(Sender { webhooks, client, policy, schedule: Arc::new(config.schedule.clone()) })
    }

    async fn handle(&self, delivery: &Delivery<WebhookDelivery>) -> Handled {
        match self.try_handle(delivery).await {
            Ok(handled) => handled,
            Err(e) => {
                warn!(delivery = %delivery.message.id, error = %e, "cannot handle a webhook delivery; trying again");
                Handled::Retry { after: Duration::from_secs(2) }
            }
        }
    }

    async fn try_handle(&self, delivery: &Delivery<WebhookDelivery>) -> Result<Handled> {
        let message = &delivery.message;
        let seq = delivery.raw().info().map(|i| i.stream_sequence).unwrap_or_default();
        if let Some(wait) = self.behind(delivery.subject(), seq).await? {
            return Ok(Handled::Retry { after: wait });
        }
        let now = now_unix_ms();
        let mut record = match self.webhooks.record(&message.id).await? {
            Some(record) if record.stream_seq == seq => record,
            // A resend, or a DLQ replay: the same delivery, a new round of the schedule.
            Some(mut record) => {
                record.round += 1;
                record.round_start = record.attempts.len() as u32;
                record.state = "pending".into();
                record.next_attempt_unix_ms = 0;
                record.stream_seq = seq;
                record
            }
            None => WebhookDelivery { stream_seq: seq, state: "pending".into(), ..message.clone() },
        };
        if record.state != "pending" {
            // Settled already (an ack that was lost): nothing to send again.
            return Ok(Handled::Done);
        }
        if record.next_attempt_unix_ms > now {
            return Ok(Handled::Retry { after: Duration::from_millis(record.next_attempt_unix_ms - now) });
        }
        let Some(endpoint) = self.webhooks.endpoint(&message.endpoint_id).await? else {
            record.state = "endpoint_removed".into();
            self.webhooks.save_record(&record).await?;
            return Ok(Handled::Done);
        };
        if endpoint.disabled {
            record.state = "endpoint_gone".into();
            self.webhooks.save_record(&record).await?;
            return Ok(Handled::Done);
        }
        let (attempt, outcome) = self.attempt(&endpoint, message).await;
        crate::metrics::webhook_attempt(match &outcome {
            Outcome::Delivered => "delivered",
            Outcome::Gone => "gone",
            Outcome::Again(_) => "failed",
            Outcome::Refused => "refused",
        });
        let error = attempt.error.clone();
        record.attempts.push(attempt);
        let made = record.attempts.len() - record.round_start as usize;
        let handled = match outcome {
            Outcome::Delivered => {
                record.state = "delivered".into();
                Handled::Done
            }
            Outcome::Gone => {
                let reason = format!("{} answered 410 Gone", endpoint.url);
                info!(endpoint = %endpoint.id, event = "webhook_endpoint_disabled", "{reason}: endpoint disabled");
                self.webhooks
                    .put(&WebhookEndpoint { disabled: true, disabled_reason: reason, ..endpoint })
                    .await?;
                record.state = "endpoint_gone".into();
                Handled::Done
            }
            Outcome::Refused => {
                record.state = "dead_lettered".into();
                Handled::Reject { reason: format!("{error} (webhook {})", record.id) }
            }
            Outcome::Again(_) if made >= self.schedule.len() => {
                record.state = "dead_lettered".into();
                Handled::Reject {
                    reason: format!(
                        "{made} attempts to {} failed, the last with: {error} (webhook {})",
                        endpoint.url, record.id
                    ),
                }
            }
            Outcome::Again(retry_after) => {
                let wait = retry_after.unwrap_or(self.schedule[made]);
                record.next_attempt_unix_ms = now_unix_ms() + wait.as_millis() as u64;
                Handled::Retry { after: wait }
            }
        };
        self.webhooks.save_record(&record).await?;
        Ok(handled)
    }

    /// How long to wait when an older delivery of the same subject is still in the stream: until
    /// that one's next attempt (at least a second, at most a minute, so a settled one is noticed).
    async fn behind(&self, subject: &str, seq: u64) -> Result<Option<Duration>> {
        let Some(head) = self.webhooks.head(subject).await? else { return Ok(None) };
        if head.0 >= seq {
            return Ok(None);
        }
        let next = match self.webhooks.record(&head.1.id).await? {
            Some(record) => record.next_attempt_unix_ms.saturating_sub(now_unix_ms()),
            None => 0,
        };
        Ok(Some(Duration::from_millis(next + 1000).min(Duration::from_secs(60))))
    }

    /// One attempt: the signed POST, and what its answer means.
    async fn attempt(
        &self,
        endpoint: &WebhookEndpoint,
        message: &WebhookDelivery,
    ) -> (WebhookAttempt, Outcome) {
        let started = Instant::now();
        let at_unix_ms = now_unix_ms();
        let record = |status: u16, error: String| WebhookAttempt {
            at_unix_ms,
            status: status.into(),
            latency_ms: started.elapsed().as_millis() as u64,
            error,
        };
        if let Err(why) = self.check_address(&endpoint.url) {
            return (record(0, why), Outcome::Refused);
        }
        let timestamp = at_unix_ms / 1000;
        let body = message.body_json.clone();
        let mut request = self.client.post(&endpoint.url);
        if !endpoint.token.is_empty() {
            // A2A's SDKs read one spelling or the other.
            request = request
                .header("x-a2a-notification-token", &endpoint.token)
                .header("a2a-notification-token", &endpoint.token);
        }
        if !endpoint.authorization.is_empty() {
            request = request.header("authorization", &endpoint.authorization);
        }
        let sent = request
            .header("content-type", "application/json")
            .header("webhook-id", &message.webhook_id)
            .header("webhook-timestamp", timestamp.to_string())
            .header(
                "webhook-signature",
                signature(&endpoint.secrets, &message.webhook_id, timestamp, body.as_bytes()),
            )
            .body(body)
            .send()
            .await;
        match sent {
            Ok(response) => {
                let status = response.status();
                let retry_after = retry_after(response.headers());
                let outcome = match status.as_u16() {
                    200..=299 => Outcome::Delivered,
                    410 => Outcome::Gone,
                    429 | 503 => Outcome::Again(retry_after),
                    _ => Outcome::Again(None),
                };
                let error = if status.is_success() { String::new() } else { format!("answered {status}") };
                (record(status.as_u16(), error), outcome)
            }
            Err(e) => {
                let mut error = e.to_string();
                let mut source = std::error::Error::source(&e);
                while let Some(cause) = source {
                    error.push_str(&format!(": {cause}"));
                    source = cause.source();
                }
                let outcome =
                    if error.contains("refused address") { Outcome::Refused } else { Outcome::Again(None) };
                (record(0, hermes_core::redact::redact_text(&error).into_owned()), outcome)
            }
        }
    }

    /// A URL whose host is an address literal is checked here: the resolver sees only names.
    fn check_address(&self, url: &str) -> std::result::Result<(), String> {
        let parsed = url::Url::parse(url).map_err(|e| format!("`{url}` is not a URL: {e}"))?;
        self.policy
            .literal_ok(&parsed)
            .map_err(|e| format!("refused address: {e} (dispatcher.webhooks.allow)"))
    }
}

/// A `Retry-After` of seconds, or of an HTTP date, as a wait from now.
fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let value = headers.get(reqwest::header::RETRY_AFTER)?.to_str().ok()?.trim();
    let wait = match value.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => {
            let at = chrono::DateTime::parse_from_rfc2822(value).ok()?;
            let ms = at.timestamp_millis().saturating_sub(now_unix_ms() as i64).max(0);
            Duration::from_millis(ms as u64)
        }
    };
    Some(wait.min(MAX_RETRY_AFTER))
}

/// Sends deliveries until `shutdown`.
pub(crate) async fn run(
    sender: Sender,
    bus: hermes_core::Bus,
    consumer: PullConsumer,
    shutdown: CancellationToken,
) {
    let mut messages = match hermes_core::bus::pull(&consumer, CONCURRENCY).await {
        Ok(m) => m,
        Err(e) => {
            warn!(error = %e, "cannot pull webhook deliveries");
            return;
        }
    };
    hermes_core::bus::consume_concurrently(
        &bus,
        "webhook",
        &mut messages,
        CONCURRENCY,
        &shutdown,
        |delivery: Arc<Delivery<WebhookDelivery>>| {
            let sender = sender.clone();
            async move { sender.handle(&delivery).await }
        },
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after_reads_seconds_and_dates_and_is_bounded() {
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert(reqwest::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(reqwest::header::RETRY_AFTER, "999999999".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(MAX_RETRY_AFTER));
        headers.insert(reqwest::header::RETRY_AFTER, "Wed, 21 Oct 2015 07:28:00 GMT".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::ZERO));
        headers.insert(reqwest::header::RETRY_AFTER, "soon".parse().unwrap());
        assert_eq!(retry_after(&headers), None);
    }
}
