//! A task's proof for the memory service: which goal it serves and whose tenant, signed by the
//! dispatchers, so an agent reaches only the memory of the tenant of a task it holds.
//!
//! Each `TaskMessage` carries a `memory_token` the dispatcher signs when it publishes the task:
//! `v1.<claims>.<mac>`, the claims (`{"g": goal id, "t": tenant, "e": expiry in Unix ms}`) and an
//! HMAC-SHA256 over `v1.<claims>`, both base64url. The key is the deployment's [`TaskKey`]: 32
//! random bytes in the `hermes_task_keys` bucket, made by the first dispatcher or memory service
//! to start, and readable only by those two services (`deploy/nats/accounts.conf`; agents may not
//! read it). The memory service refuses an agent's memory request (`upsert`, `search`,
//! `get_doc` over NATS) whose token does not verify, has expired, or names another tenant than
//! the request.

use async_nats::jetstream::kv;
use base64::Engine as _;
use serde::{Deserialize, Serialize};

use crate::{Bus, Error, Result};

/// The key's name in its bucket.
const KEY: &str = "hmac";

/// How long after its goal's deadline a task's token still verifies (a late retry's memory call).
pub const GRACE_MS: u64 = 10 * 60 * 1000;

/// The deployment's key for tasks' memory tokens.
#[derive(Clone)]
pub struct TaskKey(ring::hmac::Key);

impl std::fmt::Debug for TaskKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskKey(..)")
    }
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TaskClaims {
    #[serde(rename = "g")]
    pub goal_id: String,
    #[serde(rename = "t")]
    pub tenant: String,
    #[serde(rename = "e")]
    pub expires_unix_ms: u64,
}

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

impl TaskKey {
    /// A key of these bytes (tests).
    pub fn from_bytes(bytes: &[u8]) -> TaskKey {
        TaskKey(ring::hmac::Key::new(ring::hmac::HMAC_SHA256, bytes))
    }

    /// The deployment's key: read from its bucket, or made there by the first service to start
    /// (a race of two starts keeps the first key written).
    pub async fn open(bus: &Bus) -> Result<TaskKey> {
        let store = bus
            .ensure_bucket(kv::Config {
                bucket: bus.topology().task_keys_bucket(),
                description: "Hermes: the key dispatchers sign tasks' memory tokens with".into(),
                history: 1,
                num_replicas: bus.config().replicas,
                ..Default::default()
            })
            .await?;
        let fresh: [u8; 32] = rand::random();
        // Idempotent, so tried again while a forming cluster's stream has no leader yet.
        let held = crate::bus::patiently(|| async {
            let jetstream = |operation: &'static str, e: &dyn std::fmt::Display| Error::JetStream {
                operation,
                reason: e.to_string(),
            };
            match store.create(KEY, fresh.to_vec().into()).await {
                Ok(_) => return Ok(Some(bytes::Bytes::copy_from_slice(&fresh))),
                Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {}
                Err(e) => return Err(jetstream("write the task key", &e)),
            }
            store.get(KEY).await.map_err(|e| jetstream("read the task key", &e))
        })
        .await?;
        match held {
            Some(bytes) if bytes.len() == 32 => Ok(TaskKey::from_bytes(&bytes)),
            _ => Err(Error::FailedPrecondition("the task key in its bucket is not 32 bytes".into())),
        }
    }

    /// The token of a task of `goal_id` in `tenant` (empty: none), valid until `expires_unix_ms`.
    pub fn sign(&self, goal_id: &str, tenant: &str, expires_unix_ms: u64) -> String {
        let claims = TaskClaims { goal_id: goal_id.to_owned(), tenant: tenant.to_owned(), expires_unix_ms };
        let signed =
            format!("v1.{}", b64(serde_json::to_string(&claims).expect("claims serialize").as_bytes()));
        let mac = ring::hmac::sign(&self.0, signed.as_bytes());
        format!("{signed}.{}", b64(mac.as_ref()))
    }

    /// The claims of `token` at `now_unix_ms`, or `DENIED` saying why not.
    pub fn verify(&self, token: &str, now_unix_ms: u64) -> Result<TaskClaims> {
        let denied = |reason: &str| Error::Denied { reason: format!("the task token {reason}") };
        if token.is_empty() {
            return Err(denied("is missing: memory requests from agents carry their task's"));
        }
        let (signed, mac) = token.rsplit_once('.').ok_or_else(|| denied("is malformed"))?;
        let claims = signed.strip_prefix("v1.").ok_or_else(|| denied("is malformed"))?;
        let mac = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| denied("is malformed"))?;
        ring::hmac::verify(&self.0, signed.as_bytes(), &mac).map_err(|_| denied("does not verify"))?;
        let claims = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(claims)
            .map_err(|_| denied("is malformed"))?;
        let claims: TaskClaims = serde_json::from_slice(&claims).map_err(|_| denied("is malformed"))?;
        if now_unix_ms > claims.expires_unix_ms {
            return Err(denied("has expired"));
        }
        Ok(claims)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_verifies_with_its_key_until_it_expires_and_not_otherwise() {
        let key = TaskKey::from_bytes(&[7; 32]);
        let token = key.sign("g-1", "team-a", 2_000);
        let claims = key.verify(&token, 1_000).unwrap();
        assert_eq!((claims.goal_id.as_str(), claims.tenant.as_str()), ("g-1", "team-a"));
        for (token, at, reason) in [
            (token.clone(), 2_001, "expired"),
            (TaskKey::from_bytes(&[8; 32]).sign("g-1", "team-a", 2_000), 1_000, "does not verify"),
            (String::new(), 1_000, "missing"),
            ("v1.e30".to_owned(), 1_000, "malformed"),
            (token.replacen("v1.", "v1.x", 1), 1_000, "does not verify"),
        ] {
            let refused = key.verify(&token, at).unwrap_err();
            assert_eq!(refused.code(), crate::ErrorCode::Denied);
            assert!(refused.to_string().contains(reason), "{reason}: {refused}");
        }
        // Another tenant's claims under the same mac.
        let (_, mac) = token.rsplit_once('.').unwrap();
        let forged = TaskClaims { goal_id: "g-1".into(), tenant: "team-b".into(), expires_unix_ms: 2_000 };
        let forged = format!("v1.{}.{mac}", b64(serde_json::to_string(&forged).unwrap().as_bytes()));
        assert!(key.verify(&forged, 1_000).is_err());
    }
}
