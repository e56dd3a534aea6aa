//! Listing a KV bucket's keys, and reading an entry as the bucket's leader has it. Its own module
//! below the bus, so that the bucket owners the bus opens (`approvals.rs` and the like) can use
//! them without importing the bus back.

use async_nats::jetstream::kv;

use crate::{Error, Result};

/// Every key of the bucket `kv`, sorted, read from the server's list of its stream's subjects.
///
/// `kv::Store::keys` is not used for this: it walks an ordered consumer that can end before it
/// has delivered every key while other keys are being written (in a test against nats-server it
/// missed a key in more than a quarter of listings of a three-key bucket under writes), which lost
/// goals from `ListGoals` and deadlines from the dispatcher's rescan. Every key that exists from
/// the start of the call to its end is listed. The list comes in pages (the server sends up to
/// 100,000 subjects a page, and the client always asks for one more), so a key created meanwhile
/// can come twice: keys are deduplicated. A key whose last entry is a delete or purge marker is
/// listed too: reading it finds nothing, so callers skip it there.
pub async fn kv_keys(kv: &kv::Store, operation: &'static str) -> Result<Vec<String>> {
    kv_keys_matching(kv, ">", operation).await
}

/// [`kv_keys`] of the keys that match `pattern`, a subject wildcard such as `inflight.>`.
pub async fn kv_keys_matching(kv: &kv::Store, pattern: &str, operation: &'static str) -> Result<Vec<String>> {
    use futures::TryStreamExt as _;
    let filter = format!("{}{pattern}", kv.prefix);
    let mut subjects =
        kv.stream.info_with_subjects(&filter).await.map_err(|e| Error::jetstream(operation, e))?;
    let mut keys = std::collections::BTreeSet::new();
    while let Some((subject, _)) = subjects.try_next().await.map_err(|e| Error::jetstream(operation, e))? {
        if let Some(key) = subject.strip_prefix(kv.prefix.as_str()) {
            keys.insert(key.to_owned());
        }
    }
    Ok(keys.into_iter().collect())
}

/// The value and revision of `key` as the bucket stream's leader has it (a `STREAM.MSG.GET`):
/// what every write acknowledged so far left. `None` when the key has no entry or its last is a
/// delete or purge marker.
///
/// For reads a decision rests on. `kv::Store::entry` is a direct get when the bucket allows them
/// (Hermes's do), and any replica answers a direct get: one catching up after a pause or a
/// partition answers with an older value (nats-server 2.15.1, `tests/tests/e2e/replicas.rs`).
/// A compare-and-set after the read catches a change computed on it, but not a decision that
/// there is nothing to change.
pub async fn kv_current(
    kv: &kv::Store,
    key: &str,
    operation: &'static str,
) -> Result<Option<(bytes::Bytes, u64)>> {
    use async_nats::jetstream::stream::LastRawMessageErrorKind;
    let subject = format!("{}{key}", kv.prefix);
    let message = match kv.stream.get_last_raw_message_by_subject(&subject).await {
        Ok(message) => message,
        Err(e) if e.kind() == LastRawMessageErrorKind::NoMessageFound => return Ok(None),
        Err(e) => return Err(Error::jetstream(operation, e)),
    };
    let marker = message.headers.get("KV-Operation").map(|v| v.as_str());
    if matches!(marker, Some("DEL") | Some("PURGE")) {
        return Ok(None);
    }
    Ok(Some((message.payload, message.sequence)))
}
