//! Per-tenant quotas, from the `[[tenant]]` entries of the API tokens file:
//!
//! ```toml
//! [[tenant]]
//! name = "team-a"
//! max_running_goals = 100     # goals not yet ended, across every dispatcher
//! submits_per_second = 20     # per dispatcher replica, with bursts of `submit_burst`
//! submit_burst = 40
//! daily_tokens = 2000000      # LLM tokens per UTC day, across the tenant's goals
//! daily_cost_usd = 50.0       # estimated cost per UTC day (needs LLM prices)
//! weight = 3                  # share of the slots while tenants wait (hermes_core::lanes)
//! ```
//!
//! A submit over a quota is `LIMIT_EXCEEDED` (gRPC `RESOURCE_EXHAUSTED` with a `retry-after`
//! metadata entry, HTTP 429 with `Retry-After`), and nothing is stored. Running goals are kept
//! per tenant in the `hermes_tenants` bucket (`running.<tenant>`: goal id to when it was
//! admitted) and released when a goal ends; the day's usage under `usage.<tenant>.<date>`, added
//! to whenever a goal's tokens grow. Both are updated by compare-and-set, so replicas agree.
//! Goals already running go on when a daily budget is spent: it stops new goals.

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use async_nats::jetstream::kv;
use hermes_core::access::TenantQuota;
use hermes_core::{Bus, Error, Result, now_unix_ms};
use serde::{Deserialize, Serialize};
use tracing::warn;

/// Conflicting writers give up after this many reads.
const MAX_CAS_ATTEMPTS: usize = 32;
/// What a full running-goals quota tells a client to wait: goals end on their own time.
const RUNNING_RETRY_AFTER_SECS: u64 = 5;
const DAY_MS: u64 = 24 * 3600 * 1000;
/// Places younger than this at a scan are not reconciled: their goals may not be stored yet.
const RECONCILE_GRACE_MS: u64 = 60_000;

/// A tenant's usage of one UTC day.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DailyUsage {
    pub tokens: u64,
    pub cost_usd: f64,
}

/// A token bucket: `rate` a second, at most `burst` saved.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The quotas and their state. Cheap to share.
pub struct Quotas {
    /// Replaced when the tokens file is read again ([`Quotas::set`]).
    tenants: std::sync::RwLock<HashMap<String, TenantQuota>>,
    buckets: Mutex<HashMap<String, Bucket>>,
    kv: Option<kv::Store>,
}

fn quota_error(reason: String, retry_after_secs: u64) -> Error {
    Error::QuotaExceeded { reason, retry_after_secs: retry_after_secs.max(1) }
}

fn kv_error(operation: &'static str, e: impl std::fmt::Display) -> Error {
    Error::JetStream { operation, reason: e.to_string() }
}

/// A stored JSON value and its revision; one that does not parse counts as the default (as an
/// absent one does), so a bad value is replaced by the next write rather than blocking it.
fn json_of<T: serde::de::DeserializeOwned + Default>(bytes: &[u8], revision: u64) -> (T, Option<u64>) {
    (serde_json::from_slice(bytes).unwrap_or_default(), Some(revision))
}

impl Quotas {
    /// The quotas of `tenants`; the bucket is opened (and created, by the first dispatcher)
    /// when auth is on (`auth_on`): only a tokens file has tenants, and one read again may bring
    /// quotas that need it.
    pub async fn open(bus: &Bus, tenants: Vec<TenantQuota>, auth_on: bool) -> Result<Quotas> {
        let kv = match auth_on {
            true => Some(
                bus.ensure_bucket(kv::Config {
                    bucket: bus.topology().tenants_bucket(),
                    description: "Hermes tenants' running goals and daily usage, for their quotas".into(),
                    history: 1,
                    max_age: Duration::from_secs(8 * 24 * 3600),
                    num_replicas: bus.config().replicas,
                    ..Default::default()
                })
                .await?,
            ),
            false => None,
        };
        Ok(Quotas { tenants: Default::default(), buckets: Mutex::new(HashMap::new()), kv }.with(tenants))
    }

    fn with(self, tenants: Vec<TenantQuota>) -> Quotas {
        self.set(tenants);
        self
    }

    /// Puts `tenants`' quotas in force in place of the ones before (the tokens file read again).
    /// A tenant's submit rate starts again from a full burst.
    pub fn set(&self, tenants: Vec<TenantQuota>) {
        let tenants = tenants.into_iter().map(|t| (t.name.clone(), t)).collect();
        *self.tenants.write().expect("quota tenants") = tenants;
        self.buckets.lock().expect("quota buckets").clear();
    }

    /// No quotas.
    pub fn none() -> Quotas {
        Quotas { tenants: Default::default(), buckets: Mutex::new(HashMap::new()), kv: None }
    }

    fn of(&self, tenant: Option<&str>) -> Option<TenantQuota> {
        self.tenants.read().expect("quota tenants").get(tenant?).cloned()
    }

    /// Takes a submit from the tenant's rate, and checks its daily budgets: before the goal is
    /// validated, so a flood of bad submits is limited too.
    pub async fn check_submit(&self, tenant: Option<&str>) -> Result<()> {
        let Some(quota) = self.of(tenant) else { return Ok(()) };
        if let Some(rate) = quota.submits_per_second {
            let burst = quota.submit_burst.map(f64::from).unwrap_or(rate.max(1.0));
            let mut buckets = self.buckets.lock().expect("quota buckets");
            let now = Instant::now();
            let bucket = buckets.entry(quota.name.clone()).or_insert(Bucket { tokens: burst, at: now });
            bucket.tokens = (bucket.tokens + now.duration_since(bucket.at).as_secs_f64() * rate).min(burst);
            bucket.at = now;
            if bucket.tokens < 1.0 {
                let wait = ((1.0 - bucket.tokens) / rate).ceil() as u64;
                return Err(quota_error(
                    format!("tenant `{}` may submit {rate} goals a second (bursts of {burst})", quota.name),
                    wait,
                ));
            }
            bucket.tokens -= 1.0;
        }
        if quota.daily_tokens.is_some() || quota.daily_cost_usd.is_some() {
            let now = now_unix_ms();
            let usage = self.usage(&quota.name, now).await?;
            let until_midnight = (DAY_MS - now % DAY_MS).div_ceil(1000);
            if let Some(limit) = quota.daily_tokens
                && usage.tokens >= limit
            {
                return Err(quota_error(
                    format!(
                        "tenant `{}` used {} of its {limit} LLM tokens today (UTC)",
                        quota.name, usage.tokens
                    ),
                    until_midnight,
                ));
            }
            if let Some(limit) = quota.daily_cost_usd
                && usage.cost_usd >= limit
            {
                return Err(quota_error(
                    format!(
                        "tenant `{}` spent ${:.4} of its ${limit} a day (UTC)",
                        quota.name, usage.cost_usd
                    ),
                    until_midnight,
                ));
            }
        }
        Ok(())
    }

    /// Admits goal `goal_id` under the tenant's running-goals quota, or refuses it. A goal
    /// admitted before (a retried submit) is admitted again.
    pub async fn admit(&self, tenant: Option<&str>, goal_id: &str) -> Result<()> {
        let Some(quota) = self.of(tenant) else { return Ok(()) };
        let Some(max) = quota.max_running_goals else { return Ok(()) };
        let key = running_key(&quota.name);
        self.update_json(&key, "running goals", |running: &mut BTreeMap<String, u64>| {
            if running.contains_key(goal_id) {
                return Ok(false);
            }
            if running.len() >= max {
                return Err(quota_error(
                    format!("tenant `{}` has {} goals running, its most", quota.name, running.len()),
                    RUNNING_RETRY_AFTER_SECS,
                ));
            }
            running.insert(goal_id.to_owned(), now_unix_ms());
            Ok(true)
        })
        .await
    }

    /// Releases the place of a goal that ended (or was never stored).
    pub async fn release(&self, tenant: Option<&str>, goal_id: &str) {
        let Some(quota) = self.of(tenant) else { return };
        if quota.max_running_goals.is_none() {
            return;
        }
        let key = running_key(&quota.name);
        let released = self.update_json(&key, "running goals", |running: &mut BTreeMap<String, u64>| {
            Ok(running.remove(goal_id).is_some())
        });
        if let Err(e) = released.await {
            warn!(tenant = %quota.name, goal_id, error = %e, "cannot release a goal's place under its tenant's quota");
        }
    }

    /// Gives back the places of goals that are not running: `running` holds, per tenant, the
    /// goals a scan of the goals bucket that began at `scanned_from` found running. Places
    /// taken less than a minute before the scan are kept (their goals may have been stored after
    /// the scan listed the bucket), and so are those of goals the scan found.
    pub async fn reconcile(
        &self,
        running: &HashMap<String, std::collections::HashSet<String>>,
        scanned_from: u64,
    ) {
        let none = std::collections::HashSet::new();
        let quotas: Vec<TenantQuota> = {
            let tenants = self.tenants.read().expect("quota tenants");
            tenants.values().filter(|q| q.max_running_goals.is_some()).cloned().collect()
        };
        for quota in &quotas {
            let alive = running.get(&quota.name).unwrap_or(&none);
            let key = running_key(&quota.name);
            let mut freed = 0;
            let pruned = self.update_json(&key, "running goals", |places: &mut BTreeMap<String, u64>| {
                let before = places.len();
                places.retain(|goal_id, admitted| {
                    *admitted + RECONCILE_GRACE_MS >= scanned_from || alive.contains(goal_id)
                });
                freed = before - places.len();
                Ok(freed > 0)
            });
            match pruned.await {
                Ok(()) if freed > 0 => {
                    warn!(tenant = %quota.name, freed, event = "quota_places_reconciled", "gave back the running-goal places of goals that had ended")
                }
                Ok(()) => {}
                Err(e) => {
                    warn!(tenant = %quota.name, error = %e, "cannot reconcile a tenant's running goals")
                }
            }
        }
    }

    /// Adds what a goal just used to its tenant's day.
    pub async fn charge(&self, tenant: Option<&str>, tokens: u64, cost_usd: f64) {
        let Some(quota) = self.of(tenant) else { return };
        if (quota.daily_tokens.is_none() && quota.daily_cost_usd.is_none())
            || (tokens == 0 && cost_usd <= 0.0)
        {
            return;
        }
        let key = usage_key(&quota.name, now_unix_ms());
        let added = self.update_json(&key, "daily usage", |usage: &mut DailyUsage| {
            usage.tokens += tokens;
            usage.cost_usd += cost_usd;
            Ok(true)
        });
        if let Err(e) = added.await {
            warn!(tenant = %quota.name, tokens, cost_usd, error = %e, "cannot add to a tenant's daily usage");
        }
    }

    /// The tenant's usage of the UTC day of `now_ms`.
    pub async fn usage(&self, tenant: &str, now_ms: u64) -> Result<DailyUsage> {
        Ok(self.read_json(&usage_key(tenant, now_ms), "daily usage").await?.0)
    }

    /// The JSON value of `key` (its default when absent or unreadable) and the entry's revision.
    async fn read_json<T: serde::de::DeserializeOwned + Default>(
        &self,
        key: &str,
        what: &'static str,
    ) -> Result<(T, Option<u64>)> {
        let Some(kv) = &self.kv else { return Ok((T::default(), None)) };
        Ok(match kv.entry(key).await.map_err(|e| kv_error(what, e))? {
            Some(entry) if entry.operation == kv::Operation::Put => json_of(&entry.value, entry.revision),
            _ => (T::default(), None),
        })
    }

    /// Applies `change` to the JSON value of `key` by compare-and-set, again after a conflict;
    /// `Ok(false)` from `change`: nothing to write.
    async fn update_json<T: serde::de::DeserializeOwned + Serialize + Default>(
        &self,
        key: &str,
        what: &'static str,
        mut change: impl FnMut(&mut T) -> Result<bool>,
    ) -> Result<()> {
        let Some(kv) = &self.kv else { return Ok(()) };
        for _ in 0..MAX_CAS_ATTEMPTS {
            // As the leader has it: "nothing to change" on a lagging replica's older value would
            // refuse a submit for places since given back, or keep a place a goal gave back.
            let (mut value, revision) = match hermes_core::bus::kv_current(kv, key, what).await? {
                Some((bytes, revision)) => json_of(&bytes, revision),
                None => (T::default(), None),
            };
            if !change(&mut value)? {
                return Ok(());
            }
            let bytes: bytes::Bytes = serde_json::to_vec(&value).expect("quota state serializes").into();
            let written = match revision {
                Some(revision) => kv.update(key, bytes, revision).await.is_ok(),
                None => kv.create(key, bytes).await.is_ok(),
            };
            if written {
                return Ok(());
            }
        }
        Err(Error::Unavailable(format!("a tenant's {what} (too many conflicting writers)")))
    }
}

fn running_key(tenant: &str) -> String {
    format!("running.{tenant}")
}

fn usage_key(tenant: &str, now_ms: u64) -> String {
    format!("usage.{tenant}.{}", now_ms / DAY_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn the_submit_rate_refuses_past_the_burst_and_says_when_to_retry() {
        let quota = TenantQuota {
            name: "team-a".into(),
            submits_per_second: Some(0.5),
            submit_burst: Some(2),
            ..Default::default()
        };
        let quotas = Quotas::none().with(vec![quota.clone()]);
        quotas.check_submit(Some("team-a")).await.unwrap();
        quotas.check_submit(Some("team-a")).await.unwrap();
        let refused = quotas.check_submit(Some("team-a")).await.unwrap_err();
        assert_eq!(refused.code(), hermes_core::ErrorCode::LimitExceeded);
        assert!(matches!(refused, Error::QuotaExceeded { retry_after_secs: 2, .. }), "{refused:?}");
        // Other tenants, and callers with no tenant, have no quota here.
        quotas.check_submit(Some("team-b")).await.unwrap();
        quotas.check_submit(None).await.unwrap();
        // The tokens file read again: the new quotas apply, with a full burst.
        quotas.set(vec![TenantQuota { submit_burst: Some(3), ..quota }]);
        for _ in 0..3 {
            quotas.check_submit(Some("team-a")).await.unwrap();
        }
        assert!(quotas.check_submit(Some("team-a")).await.is_err());
        quotas.set(Vec::new());
        quotas.check_submit(Some("team-a")).await.unwrap();
    }

    #[test]
    fn bad_quotas_are_refused() {
        for bad in [
            TenantQuota { name: "t".into(), weight: Some(0.0), ..Default::default() },
            TenantQuota { name: "t".into(), weight: Some(1e9), ..Default::default() },
            TenantQuota { name: "t".into(), max_running_goals: Some(0), ..Default::default() },
            TenantQuota { name: "t".into(), submits_per_second: Some(f64::NAN), ..Default::default() },
            TenantQuota { name: "t".into(), submit_burst: Some(3), ..Default::default() },
            TenantQuota { name: "t t".into(), ..Default::default() },
        ] {
            assert!(bad.check().is_err(), "{bad:?}");
        }
    }
}
