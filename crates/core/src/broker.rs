//! The memory service's NATS request/reply (`hermes.memory.rpc.<method>`), and the task data it
//! brokers for agents with their own NATS identity.
//!
//! An agent that connects as `agent_<id>` (docs/security.md, "Per-agent NATS identities") may not
//! touch the `hermes_ledger` and `hermes_tool_cache` buckets or the `hermes_artifacts` object store: their subjects name
//! keys and objects, not tenants or goals, so no permission could confine it to its own tasks'.
//! It asks the memory service instead, sending the `memory_token` of the task it works for
//! ([`crate::task_token`]); the service does the operation only on that task's goal's entries and
//! artifacts. A [`TaskBroker`] is that token and a connection: [`crate::task_kv::TaskKv`] (the
//! ledger, and the tool cache, whose entries are the token's tenant's) and
//! [`crate::artifacts::Artifacts`] use one in place of their bucket when [`crate::Bus::task_ledger`]
//! and [`crate::Bus::task_artifacts`] are asked on such a connection.

use std::time::Duration;

use crate::{Error, ErrorCode, Result, Topology};

/// Reply header with the error code of a failed memory request.
pub const ERROR_CODE_HEADER: &str = "Hermes-Error-Code";
/// Reply header with the error message of a failed memory request.
pub const ERROR_MESSAGE_HEADER: &str = "Hermes-Error-Message";

/// The prefix of the NATS users that are agents' own identities (`agent_<id>`).
pub const AGENT_IDENTITY_PREFIX: &str = "agent_";

/// Whether a NATS user is an agent's own identity, whose task data goes through the memory service.
pub fn is_agent_identity(user: &str) -> bool {
    user.strip_prefix(AGENT_IDENTITY_PREFIX).is_some_and(|id| !id.is_empty())
}

/// Sends one memory request and decodes its reply; an error reply (its code and message in the
/// headers) comes back as the [`Error`] it names. A refusal for a task token is `DENIED`, never
/// turned into a retryable `UNAVAILABLE`.
pub async fn request<Q: prost::Message, R: prost::Message + Default>(
    client: &async_nats::Client,
    topology: &Topology,
    method: &str,
    request: &Q,
    timeout: Duration,
) -> Result<R> {
    match ask(client, topology, method, request.encode_to_vec().into(), timeout).await {
        Ok(reply) => Ok(reply),
        Err(Asked::NoResponders) => {
            Err(Error::Unavailable("the memory service (no replica is running)".into()))
        }
        Err(Asked::Failed(e)) => Err(e),
    }
}

/// Why a request got no reply to decode.
enum Asked {
    /// No replica was subscribed: the request reached no one, so sending it again is safe.
    NoResponders,
    Failed(Error),
}

async fn ask<R: prost::Message + Default>(
    client: &async_nats::Client,
    topology: &Topology,
    method: &str,
    body: bytes::Bytes,
    timeout: Duration,
) -> std::result::Result<R, Asked> {
    let subject = topology.memory_rpc(method);
    let sent = tokio::time::timeout(timeout, client.request(subject, body)).await;
    let reply = match sent {
        Err(_) => {
            return Err(Asked::Failed(Error::Timeout {
                what: format!("memory `{method}`"),
                elapsed_ms: timeout.as_millis() as u64,
            }));
        }
        Ok(Err(e)) if e.kind() == async_nats::RequestErrorKind::NoResponders => {
            return Err(Asked::NoResponders);
        }
        Ok(Err(e)) => return Err(Asked::Failed(Error::Unavailable(format!("the memory service ({e})")))),
        Ok(Ok(reply)) => reply,
    };
    decode_reply(method, reply).map_err(Asked::Failed)
}

fn decode_reply<R: prost::Message + Default>(method: &str, reply: async_nats::Message) -> Result<R> {
    if let Some(headers) = &reply.headers
        && let Some(code) = headers.get(ERROR_CODE_HEADER)
    {
        let message = headers.get(ERROR_MESSAGE_HEADER).map(|m| m.as_str().to_owned()).unwrap_or_default();
        return Err(match ErrorCode::parse(code.as_str()) {
            Some(ErrorCode::InvalidArgument) => {
                Error::InvalidArgument { field: method.to_owned(), reason: message }
            }
            Some(ErrorCode::NotFound) => Error::NotFound { what: "memory", id: message },
            Some(ErrorCode::FailedPrecondition) => Error::FailedPrecondition(message),
            Some(ErrorCode::Denied) => Error::Denied { reason: message },
            _ => Error::Unavailable(message),
        });
    }
    R::decode(reply.payload).map_err(|e| Error::Decode { kind: "memory reply", reason: e.to_string() })
}

/// How long a brokered ledger or artifact request waits for the memory service's answer.
pub const BROKER_TIMEOUT: Duration = Duration::from_secs(15);

/// How long a brokered request is sent again while no memory replica is running (a restart, a
/// rolling update): a request that reached no one may be sent again, whatever it does. A request
/// that reached a replica and timed out is not, since it may have been done.
pub const BROKER_PATIENCE: Duration = Duration::from_secs(30);

/// A task's way to its own goal's ledger entries and artifacts through the memory service.
#[derive(Clone)]
pub struct TaskBroker {
    client: async_nats::Client,
    topology: Topology,
    token: String,
}

impl std::fmt::Debug for TaskBroker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TaskBroker(..)")
    }
}

impl TaskBroker {
    pub fn new(client: async_nats::Client, topology: Topology, token: String) -> TaskBroker {
        TaskBroker { client, topology, token }
    }

    /// The task's token, which every request carries.
    pub fn token(&self) -> &str {
        &self.token
    }

    /// One request, not sent again when no replica is running (for what can do without memory
    /// a while, the tool cache).
    pub(crate) async fn call_once<Q: prost::Message, R: prost::Message + Default>(
        &self,
        method: &str,
        body: &Q,
    ) -> Result<R> {
        request(&self.client, &self.topology, method, body, BROKER_TIMEOUT).await
    }

    /// One request, sent again for up to [`BROKER_PATIENCE`] while no replica is running.
    pub(crate) async fn call<Q: prost::Message, R: prost::Message + Default>(
        &self,
        method: &str,
        body: &Q,
    ) -> Result<R> {
        let body: bytes::Bytes = body.encode_to_vec().into();
        let deadline = std::time::Instant::now() + BROKER_PATIENCE;
        let mut pause = Duration::from_millis(100);
        loop {
            match ask(&self.client, &self.topology, method, body.clone(), BROKER_TIMEOUT).await {
                Ok(reply) => return Ok(reply),
                Err(Asked::NoResponders) if std::time::Instant::now() < deadline => {
                    tracing::warn!(method, "no memory service replica is running; asking again");
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(2));
                }
                Err(Asked::NoResponders) => {
                    return Err(Error::Unavailable(format!(
                        "the memory service (no replica has been running for {} s)",
                        BROKER_PATIENCE.as_secs()
                    )));
                }
                Err(Asked::Failed(e)) => return Err(e),
            }
        }
    }

    /// The most bytes one brokered request or reply carries: the server's `max_payload`, less
    /// room for the rest of the message.
    pub(crate) fn piece_bytes(&self) -> usize {
        piece_bytes(self.client.server_info().max_payload)
    }
}

/// The content bytes one brokered message carries under a server's `max_payload`: 512 KiB, or
/// less on a server that takes less, leaving 16 KiB for the rest of the message.
pub fn piece_bytes(max_payload: usize) -> usize {
    const MOST: usize = 512 * 1024;
    match max_payload {
        0 => MOST,
        max => max.saturating_sub(16 * 1024).clamp(4 * 1024, MOST),
    }
}

/// The goal a ledger key belongs to: its first token, after the crash markers' prefix.
pub fn ledger_key_goal(key: &str) -> &str {
    let key = key.strip_prefix(crate::ledger::CRASH_MARKER_PREFIX).unwrap_or(key);
    key.split('.').next().unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn agent_identities_are_agent_users_with_an_id() {
        assert!(is_agent_identity("agent_a-1"));
        assert!(!is_agent_identity("agent"));
        assert!(!is_agent_identity("agent_"));
        assert!(!is_agent_identity("dispatcher"));
    }

    #[test]
    fn a_ledger_keys_goal_is_its_first_token_after_the_crash_prefix() {
        assert_eq!(ledger_key_goal("g-1.fetch.0.abc"), "g-1");
        assert_eq!(ledger_key_goal("inflight.g-1.fetch"), "g-1");
        assert_eq!(ledger_key_goal("g-1"), "g-1");
        assert_eq!(ledger_key_goal(""), "");
    }

    #[test]
    fn pieces_leave_room_under_the_servers_payload_limit() {
        assert_eq!(piece_bytes(1024 * 1024), 512 * 1024);
        assert_eq!(piece_bytes(0), 512 * 1024);
        assert_eq!(piece_bytes(64 * 1024), 48 * 1024);
        assert_eq!(piece_bytes(1024), 4 * 1024);
    }
}
