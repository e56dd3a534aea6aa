//! Each tenant's own sessions, collections and artifacts.
//!
//! Memory keeps every tenant's data in the same buckets under names only that tenant's calls
//! reach. A call names its tenant in the request's `tenant` field (on the dispatcher's gRPC port,
//! the guard sets it from the caller's token, see `hermes_core::grpc::TENANT_HEADER`); the empty
//! tenant (auth off) is the unscoped namespace of the names as given.
//!
//! - A session `s` of tenant `t` is stored as `t/s`. Session ids are dotted words without `/`,
//!   so no other tenant's session, and no unscoped one, has that name.
//! - A collection `c` of tenant `t` is stored as `t<hex of t>-c`: collections are KV key tokens
//!   (`[a-z0-9_-]`), hex ends at the first `-`, so two tenants' names never meet.
//! - An artifact records the tenant that stored it; another tenant's is `NOT_FOUND`.
//!
//! Every reply names sessions and collections as their tenant gave them.

/// The stored name of session `session_id` of `tenant`.
pub fn session_key(tenant: &str, session_id: &str) -> String {
    if tenant.is_empty() { session_id.to_owned() } else { format!("{tenant}/{session_id}") }
}

/// The session id `tenant` gave for the stored name `key`, or `None` when it is not the tenant's.
/// The empty tenant sees every name as stored.
pub fn session_of<'a>(tenant: &str, key: &'a str) -> Option<&'a str> {
    if tenant.is_empty() {
        return Some(key);
    }
    key.strip_prefix(tenant)?.strip_prefix('/')
}

/// The stored name of collection `name` of `tenant`.
pub fn collection_key(tenant: &str, name: &str) -> String {
    if tenant.is_empty() { name.to_owned() } else { format!("t{}-{name}", hex(tenant)) }
}

/// The collection name `tenant` gave for the stored `key`, or `None` when it is not the tenant's.
pub fn collection_of<'a>(tenant: &str, key: &'a str) -> Option<&'a str> {
    if tenant.is_empty() {
        return Some(key);
    }
    key.strip_prefix('t')?.strip_prefix(hex(tenant).as_str())?.strip_prefix('-')
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_tenant_sees_only_its_own_names() {
        assert_eq!(session_key("", "chat"), "chat");
        assert_eq!(session_key("team-a", "chat"), "team-a/chat");
        assert_eq!(session_of("team-a", "team-a/chat"), Some("chat"));
        assert_eq!(session_of("team-a", "team-ab/chat"), None);
        assert_eq!(session_of("team-a", "chat"), None);
        assert_eq!(session_of("", "team-a/chat"), Some("team-a/chat"));

        let a = collection_key("a", "b-c");
        let ab = collection_key("a-b", "c");
        assert_ne!(a, ab);
        assert_eq!(collection_of("a", &a), Some("b-c"));
        assert_eq!(collection_of("a", &ab), None);
        assert_eq!(collection_of("a-b", &a), None);
        assert_eq!(collection_of("a-b", &ab), Some("c"));
        assert_eq!(collection_of("a", "memory"), None);
    }
}
