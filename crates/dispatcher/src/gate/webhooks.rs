//! The caller gate's webhook operations: a tenant's standing endpoints and the deliveries of its
//! goals (docs/webhooks.md). Changes need the submitter role and are audited; reading needs any
//! role. Another tenant's endpoint or delivery is `NOT_FOUND`.

use hermes_core::access::Need;
use hermes_core::ids::{IdShape, check_id};
use hermes_core::{Error, Result, now_unix_ms};
use hermes_proto::{WebhookDelivery, WebhookEndpoint};

use super::{Caller, Gate};
use crate::audit::Action;
use crate::webhooks::{check_endpoint, new_secret, secret_or_new, shown};

/// Deliveries listed when the caller asks for no limit, and the most listed at once.
const DELIVERIES_LIMIT: (usize, usize) = (100, 1000);

fn tenant(caller: &Caller) -> &str {
    caller.principal.tenant.as_deref().unwrap_or_default()
}

impl Gate {
    /// Registers a standing endpoint for the caller's tenant; returns it and its secret (shown
    /// this once). Audited.
    pub(crate) async fn create_webhook(
        &self,
        caller: &Caller,
        url: &str,
        events: Vec<String>,
        secret: &str,
    ) -> Result<(WebhookEndpoint, String)> {
        self.ready()?;
        let created = async {
            self.enter(caller, Need::Submit)?;
            check_endpoint(url, &events)?;
            let secret = secret_or_new(secret)?;
            let endpoint = WebhookEndpoint {
                id: format!("wh-{}", hex(&rand::random::<[u8; 8]>())),
                tenant: tenant(caller).to_owned(),
                url: url.to_owned(),
                events,
                secrets: vec![secret.clone()],
                created_unix_ms: now_unix_ms(),
                ..Default::default()
            };
            self.goals.webhooks().create(&endpoint).await?;
            Ok((shown(endpoint), secret))
        }
        .await;
        let target = created.as_ref().map(|(e, _)| e.id.as_str()).unwrap_or_default();
        self.audit.record(&caller.principal, Action::WebhookCreate, target, url, &created).await;
        created
    }

    /// The caller's tenant's standing endpoints, without their secrets.
    pub(crate) async fn webhooks(&self, caller: &Caller) -> Result<Vec<WebhookEndpoint>> {
        self.enter(caller, Need::Read)?;
        let mut endpoints = self.goals.webhooks().list_standing().await?;
        endpoints.retain(|e| e.tenant == tenant(caller));
        Ok(endpoints.into_iter().map(shown).collect())
    }

    /// An endpoint of the caller's tenant, secrets included (for the gate's own use).
    async fn own_webhook(&self, caller: &Caller, id: &str) -> Result<WebhookEndpoint> {
        check_id("id", id, 300, IdShape::Word)?;
        match self.goals.webhooks().endpoint(id).await? {
            Some(endpoint) if endpoint.tenant == tenant(caller) && endpoint.goal_id.is_empty() => {
                Ok(endpoint)
            }
            _ => Err(Error::NotFound { what: "webhook", id: id.to_owned() }),
        }
    }

    /// Removes a standing endpoint; what waits for it is dropped when its turn comes. Audited.
    pub(crate) async fn delete_webhook(&self, caller: &Caller, id: &str) -> Result<WebhookEndpoint> {
        self.ready()?;
        let deleted = async {
            self.enter(caller, Need::Submit)?;
            let endpoint = self.own_webhook(caller, id).await?;
            self.goals.webhooks().delete(id).await?;
            Ok(shown(endpoint))
        }
        .await;
        self.audit.record(&caller.principal, Action::WebhookDelete, id, "", &deleted).await;
        deleted
    }

    /// Gives an endpoint a new secret; the previous one stays valid beside it (both sign) until
    /// the next rotation. Returns the new secret, shown this once. Audited.
    pub(crate) async fn rotate_webhook(
        &self,
        caller: &Caller,
        id: &str,
    ) -> Result<(WebhookEndpoint, String)> {
        self.ready()?;
        let rotated = async {
            self.enter(caller, Need::Submit)?;
            let mut endpoint = self.own_webhook(caller, id).await?;
            let secret = new_secret();
            endpoint.secrets.insert(0, secret.clone());
            endpoint.secrets.truncate(2);
            self.goals.webhooks().put(&endpoint).await?;
            Ok((shown(endpoint), secret))
        }
        .await;
        self.audit.record(&caller.principal, Action::WebhookRotate, id, "", &rotated).await;
        rotated
    }

    /// The deliveries of the caller's tenant's goals, newest first: of one goal, of one endpoint,
    /// or all, at most `limit`.
    pub(crate) async fn webhook_deliveries(
        &self,
        caller: &Caller,
        goal_id: &str,
        endpoint_id: &str,
        limit: usize,
    ) -> Result<Vec<WebhookDelivery>> {
        self.enter(caller, Need::Read)?;
        let goal = match goal_id {
            "" => None,
            id => {
                self.goal_of(caller, id).await?;
                Some(id)
            }
        };
        let limit = match limit {
            0 => DELIVERIES_LIMIT.0,
            n => n.min(DELIVERIES_LIMIT.1),
        };
        let keep = |r: &WebhookDelivery| {
            r.tenant == tenant(caller) && (endpoint_id.is_empty() || r.endpoint_id == endpoint_id)
        };
        self.goals.webhooks().records(goal, limit, keep).await
    }

    /// Sends a delivery again, a new round of its schedule. Audited.
    pub(crate) async fn resend_webhook(&self, caller: &Caller, id: &str) -> Result<WebhookDelivery> {
        self.ready()?;
        let resent = async {
            self.enter(caller, Need::Submit)?;
            check_id("id", id, 600, IdShape::Dotted)?;
            let record = match self.goals.webhooks().record(id).await? {
                Some(record) if record.tenant == tenant(caller) => record,
                _ => return Err(Error::NotFound { what: "webhook delivery", id: id.to_owned() }),
            };
            if record.state == "pending" {
                return Err(Error::FailedPrecondition(format!(
                    "webhook delivery {id} is still being sent; it can be sent again once it is delivered or dead-lettered"
                )));
            }
            self.goals.webhooks().resend(&record).await?;
            Ok(record)
        }
        .await;
        self.audit.record(&caller.principal, Action::WebhookResend, id, "", &resent).await;
        resent
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
