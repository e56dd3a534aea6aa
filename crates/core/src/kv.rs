//! Listing a KV bucket's keys. Its own module below the bus, so that the bucket owners the bus
//! opens (`approvals.rs` and the like) can list their keys without importing the bus back.

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
