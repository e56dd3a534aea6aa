//! The one owner of the `hermes_approvals` bucket. Agents create pending approvals and record a
//! timeout; dispatchers record a person's decision; both go through [`ApprovalStore::decide`],
//! one compare-and-set loop where the first decision wins.

use std::collections::HashSet;

use async_nats::jetstream::kv;
use hermes_proto::{Approval, ApprovalDecision};
use prost::Message as _;

use crate::{Error, Result};

/// Conflicting deciders give up after this many reads.
const MAX_CAS_ATTEMPTS: usize = 16;

/// Approvals of tool calls, by call id. Cheap to clone.
#[derive(Clone)]
pub struct ApprovalStore {
    kv: kv::Store,
}

/// What [`ApprovalStore::decide`] found.
#[derive(Debug, Clone, PartialEq)]
pub struct Decided {
    /// The decision that stands.
    pub decision: ApprovalDecision,
    /// This call recorded it (otherwise an earlier one had).
    pub recorded: bool,
    /// The approval it decides.
    pub approval: Approval,
}

impl ApprovalStore {
    pub fn new(kv: kv::Store) -> Self {
        Self { kv }
    }

    /// The approval of `call_id` and its revision, if there is one.
    pub async fn load(&self, call_id: &str) -> Result<Option<(Approval, u64)>> {
        match self.kv.entry(call_id).await.map_err(|e| Error::jetstream("load approval", e))? {
            Some(entry) if entry.operation == kv::Operation::Put => {
                let approval = Approval::decode(entry.value)
                    .map_err(|e| Error::Decode { kind: "Approval", reason: e.to_string() })?;
                Ok(Some((approval, entry.revision)))
            }
            _ => Ok(None),
        }
    }

    /// Stores a pending approval; when one exists for the call already (another delivery or
    /// attempt asked first), returns that one. The flag says whether this call created it.
    pub async fn create(&self, approval: &Approval) -> Result<(Approval, u64, bool)> {
        match self.kv.create(&approval.call_id, approval.encode_to_vec().into()).await {
            Ok(revision) => Ok((approval.clone(), revision, true)),
            Err(e) if e.kind() == kv::CreateErrorKind::AlreadyExists => {
                let (existing, revision) = self
                    .load(&approval.call_id)
                    .await?
                    .ok_or_else(|| Error::Unavailable(format!("approval {} vanished", approval.call_id)))?;
                Ok((existing, revision, false))
            }
            Err(e) => Err(Error::jetstream("create approval", e)),
        }
    }

    /// Records `decision` on the approval of `call_id` of goal `goal_id`, unless a decision is
    /// recorded already: the first one wins and is returned. `None` when there is no such
    /// approval (or it belongs to another goal).
    pub async fn decide(
        &self,
        goal_id: &str,
        call_id: &str,
        decision: ApprovalDecision,
    ) -> Result<Option<Decided>> {
        for _ in 0..MAX_CAS_ATTEMPTS {
            let Some((mut approval, revision)) = self.load(call_id).await? else { return Ok(None) };
            if approval.goal_id != goal_id {
                return Ok(None);
            }
            if let Some(standing) = approval.decision.clone() {
                return Ok(Some(Decided { decision: standing, recorded: false, approval }));
            }
            approval.decision = Some(decision.clone());
            match self.kv.update(call_id, approval.encode_to_vec().into(), revision).await {
                Ok(_) => return Ok(Some(Decided { decision, recorded: true, approval })),
                Err(e) if e.kind() == kv::UpdateErrorKind::WrongLastRevision => continue,
                Err(e) => return Err(Error::jetstream("decide approval", e)),
            }
        }
        Err(Error::Unavailable(format!("approval {call_id}: too many concurrent updates")))
    }

    /// Every approval written from now on (asked for, decided, timed out), in order, until the
    /// watch ends: for following changes rather than listing again and again.
    pub async fn changes(&self) -> Result<impl futures::Stream<Item = Approval> + Send + use<>> {
        use futures::StreamExt as _;
        let watch = self.kv.watch(">").await.map_err(|e| Error::jetstream("watch approvals", e))?;
        Ok(watch.filter_map(|entry| async move {
            let entry = entry.ok().filter(|e| e.operation == kv::Operation::Put)?;
            Approval::decode(entry.value).ok()
        }))
    }

    /// Every approval nobody decided yet, across goals, the soonest to expire first.
    pub async fn pending(&self) -> Result<Vec<Approval>> {
        let mut out = Vec::new();
        for key in crate::kv::kv_keys(&self.kv, "list approvals").await? {
            if let Some((approval, _)) = self.load(&key).await?
                && approval.decision.is_none()
            {
                out.push(approval);
            }
        }
        out.sort_by(|a, b| a.expires_unix_ms.cmp(&b.expires_unix_ms).then_with(|| a.call_id.cmp(&b.call_id)));
        Ok(out)
    }

    /// Nodes of `goal_id` with an approval nobody decided yet.
    pub async fn pending_nodes(&self, goal_id: &str) -> Result<HashSet<String>> {
        let mut out = HashSet::new();
        let prefix = format!("{goal_id}.");
        for key in crate::kv::kv_keys(&self.kv, "list approvals").await? {
            if !key.starts_with(&prefix) {
                continue;
            }
            if let Some((approval, _)) = self.load(&key).await?
                && approval.decision.is_none()
            {
                out.insert(approval.node_id);
            }
        }
        Ok(out)
    }
}
