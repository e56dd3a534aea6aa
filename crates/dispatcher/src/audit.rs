//! The audit trail: who did what through the API doors, when, from where, and how it ended.
//! Every submit, cancel, approval decision and dead-letter replay is appended to `HERMES_AUDIT`,
//! a stream that denies deletes and purges, on `hermes.audit.<tenant>`, whether it succeeded or
//! was refused. Operators read their own tenant's records (`ListAudit`, `GET /v1/audit`,
//! `hermes audit`).

use std::time::Duration;

use async_nats::jetstream::stream;
use hermes_core::{Bus, Error, Result, now_unix_ms};
use hermes_proto::AuditRecord;
use prost::Message as _;
use tracing::warn;

use hermes_core::access::Principal;

/// How long audit records are kept.
pub const AUDIT_MAX_AGE: Duration = Duration::from_secs(400 * 24 * 3600);

/// An audited action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    Submit,
    Cancel,
    Approve,
    Deny,
    Replay,
    WebhookCreate,
    WebhookDelete,
    WebhookRotate,
    WebhookResend,
    CacheClear,
    /// A call refused for its credentials (no token, an unknown one): who is not known, so the
    /// record names the door and address it came from ([`FailedAuth`]).
    AuthFailed,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Submit => "goal.submit",
            Action::Cancel => "goal.cancel",
            Action::Approve => "approval.approve",
            Action::Deny => "approval.deny",
            Action::Replay => "dead_letter.replay",
            Action::WebhookCreate => "webhook.create",
            Action::WebhookDelete => "webhook.delete",
            Action::WebhookRotate => "webhook.rotate",
            Action::WebhookResend => "webhook.resend",
            Action::CacheClear => "tool_cache.clear",
            Action::AuthFailed => "auth.failed",
        }
    }
}

/// The failed authentications the trail keeps: at most one record per address every
/// [`FAILED_AUTH_EVERY`], and at most [`FAILED_AUTH_BURST`] records a second from all addresses
/// together, so a flood of bad tokens cannot fill the stream (or slow the doors: the records are
/// written off the call's path). A record says how many failures from its address went
/// unrecorded since the one before; `hermes_auth_failures` counts every one.
#[derive(Default)]
pub struct FailedAuth {
    state: std::sync::Mutex<FailedAuthState>,
}

#[derive(Default)]
struct FailedAuthState {
    /// By address: when its last record was written, and the failures since then unrecorded.
    by_peer: std::collections::HashMap<String, (std::time::Instant, u64)>,
    /// The records written in the current second, and when it began.
    second: (Option<std::time::Instant>, u32),
}

/// See [`FailedAuth`].
pub const FAILED_AUTH_EVERY: Duration = Duration::from_secs(10);
/// See [`FailedAuth`].
pub const FAILED_AUTH_BURST: u32 = 10;
/// Addresses remembered at most; past it the oldest are forgotten.
const FAILED_AUTH_PEERS: usize = 10_000;

impl FailedAuth {
    /// Whether a failure from `peer` gets a record now, and how many before it went unrecorded.
    pub fn admit(&self, peer: &str, now: std::time::Instant) -> Option<u64> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let (last, skipped) = match state.by_peer.get(peer) {
            Some(&(last, skipped)) => (Some(last), skipped),
            None => (None, 0),
        };
        let this_second =
            state.second.0.is_some_and(|start| now.duration_since(start) < Duration::from_secs(1));
        let second_full = this_second && state.second.1 >= FAILED_AUTH_BURST;
        let too_soon = last.is_some_and(|last| now.duration_since(last) < FAILED_AUTH_EVERY);
        if too_soon || second_full {
            // Counted for an address already remembered; a new one is not remembered unrecorded,
            // so a flood from many addresses cannot grow the map.
            if let Some(entry) = state.by_peer.get_mut(peer) {
                entry.1 += 1;
            }
            return None;
        }
        state.second = match this_second {
            true => (state.second.0, state.second.1 + 1),
            false => (Some(now), 1),
        };
        if state.by_peer.len() >= FAILED_AUTH_PEERS && !state.by_peer.contains_key(peer) {
            let oldest = state.by_peer.iter().min_by_key(|(_, (at, _))| *at).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                state.by_peer.remove(&oldest);
            }
        }
        state.by_peer.insert(peer.to_owned(), (now, 0));
        Some(skipped)
    }
}

/// Appends to and reads the audit stream. Cheap to clone.
#[derive(Clone)]
pub struct Audit {
    bus: Bus,
}

impl Audit {
    /// Opens the audit stream, creating it on the first start (the dispatchers own it).
    pub async fn open(bus: Bus) -> Result<Audit> {
        let topology = bus.topology();
        let config = stream::Config {
            name: topology.audit_stream(),
            description: Some("Hermes audit trail: who did what through the API, append-only".into()),
            subjects: vec![topology.all_audit()],
            retention: stream::RetentionPolicy::Limits,
            max_age: AUDIT_MAX_AGE,
            deny_delete: true,
            deny_purge: true,
            num_replicas: bus.config().replicas,
            ..Default::default()
        };
        hermes_core::bus::patiently(|| async {
            bus.jetstream()
                .get_or_create_stream(config.clone())
                .await
                .map_err(|e| Error::JetStream { operation: "create the audit stream", reason: e.to_string() })
        })
        .await?;
        Ok(Audit { bus })
    }

    /// Appends what `who` did to `target` and how it ended. The ack is awaited: an action is
    /// answered only once its record is stored. A failure to store is logged, not returned:
    /// the action itself has happened.
    pub async fn record<T>(
        &self,
        who: &Principal,
        action: Action,
        target: &str,
        detail: &str,
        outcome: &Result<T>,
    ) {
        let tenant = who.tenant.clone();
        self.append(who, tenant.as_deref(), action, target, detail, outcome).await
    }

    /// A platform operator's action on another tenant's goal, recorded in that tenant's trail
    /// too (beside [`Audit::record`] in its own), so the tenant's operators see who acted on
    /// their goals; `detail` names the operator's own tenant. Nothing for anyone else, or for
    /// a goal of the operator's own tenant.
    pub async fn record_across<T>(
        &self,
        who: &Principal,
        goal_tenant: Option<&str>,
        action: Action,
        target: &str,
        detail: &str,
        outcome: &Result<T>,
    ) {
        let Some(tenant) = goal_tenant else { return };
        if !who.across_tenants() || who.tenant.as_deref() == Some(tenant) {
            return;
        }
        let by = format!(
            "by platform operator `{}` of tenant `{}`",
            who.name,
            who.tenant.as_deref().unwrap_or("")
        );
        let detail = if detail.is_empty() { by } else { format!("{by}: {detail}") };
        self.append(who, Some(tenant), action, target, &detail, outcome).await
    }

    async fn append<T>(
        &self,
        who: &Principal,
        tenant: Option<&str>,
        action: Action,
        target: &str,
        detail: &str,
        outcome: &Result<T>,
    ) {
        let (outcome, detail) = match outcome {
            Ok(_) => ("OK".to_owned(), detail.to_owned()),
            Err(e) => {
                (e.code().as_str().to_owned(), hermes_core::redact::redact_text(&e.to_string()).into_owned())
            }
        };
        let record = AuditRecord {
            seq: 0,
            at_unix_ms: now_unix_ms(),
            principal: who.name.clone(),
            tenant: tenant.unwrap_or_default().to_owned(),
            action: action.as_str().to_owned(),
            // Bounded as `detail` is: the stream keeps every record for 400 days.
            target: target.chars().take(300).collect(),
            outcome,
            detail: detail.chars().take(500).collect(),
            origin: who.origin.clone(),
        };
        let subject = self.bus.topology().audit(tenant);
        let stored = match self.bus.jetstream().publish(subject, record.encode_to_vec().into()).await {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = stored {
            warn!(error = %e, action = action.as_str(), target = %record.target, principal = %who.name, "cannot store an audit record");
        }
    }

    /// Up to `limit` records after `after_seq`, oldest first: `tenant`'s only, or all of them
    /// (`None`, auth off). Who may read them is the gate's rule (operators).
    pub async fn list(&self, tenant: Option<&str>, limit: usize, after_seq: u64) -> Result<Vec<AuditRecord>> {
        let limit = match limit {
            0 => 100,
            n => n.min(1000),
        };
        let topology = self.bus.topology();
        let filter = match tenant {
            Some(tenant) => topology.audit(Some(tenant)),
            None => topology.all_audit(),
        };
        let read = hermes_core::bus::read_filtered::<AuditRecord>(
            self.bus.jetstream(),
            &topology.audit_stream(),
            filter,
            after_seq + 1,
            limit,
            "audit records",
        )
        .await?;
        let records = read.into_iter().map(|(seq, record)| AuditRecord { seq, ..record }).collect();
        Ok(records)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    #[test]
    fn failed_authentications_are_recorded_once_per_address_every_10_s_and_10_a_second_in_all() {
        let limit = FailedAuth::default();
        let start = Instant::now();
        assert_eq!(limit.admit("10.0.0.1", start), Some(0));
        for _ in 0..5 {
            assert_eq!(limit.admit("10.0.0.1", start + Duration::from_secs(1)), None);
        }
        // The next record from the address says how many went unrecorded.
        assert_eq!(limit.admit("10.0.0.1", start + FAILED_AUTH_EVERY), Some(5));
        // Many addresses at once: FAILED_AUTH_BURST records a second, no more.
        let later = start + Duration::from_secs(60);
        let recorded = (0..50).filter(|i| limit.admit(&format!("10.1.0.{i}"), later).is_some()).count();
        assert_eq!(recorded, FAILED_AUTH_BURST as usize);
        assert!(limit.admit("10.2.0.1", later + Duration::from_secs(1)).is_some(), "a new second");
    }
}
