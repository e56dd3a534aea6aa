//! Files a process serves with, followed while it runs: read again on SIGHUP, and when their
//! content changes (looked at every [`POLL`]: a Kubernetes Secret mounted as a volume changes
//! under the pod). The API tokens file ([`crate::access::Tokens`]) and the doors' TLS
//! certificates ([`crate::tls::TlsFiles::follow`]) use it.

use std::path::PathBuf;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

/// How often followed files are looked at for a change.
pub const POLL: Duration = Duration::from_secs(10);

/// What [`follow`] follows.
pub struct Watched {
    /// What the files are, in the log (`API tokens`); its events are `<event>_reloaded` and
    /// `<event>_reload_failed`.
    pub what: &'static str,
    pub event: &'static str,
    pub files: Vec<PathBuf>,
    /// The contents in force, so a change right after start is not missed.
    pub read_at_start: Vec<Option<Vec<u8>>>,
}

/// Calls `take` with the files' contents (`None` for one that cannot be read) on every SIGHUP
/// and whenever one of them changed, until `shutdown`, and logs what came of it: `take`'s
/// message, or its error, after which what was in force stays so (it is `take`'s to change
/// nothing then).
pub fn follow<F>(watched: Watched, shutdown: CancellationToken, mut take: F)
where
    F: FnMut(&[Option<Vec<u8>>]) -> anyhow::Result<String> + Send + 'static,
{
    let Watched { what, event, files, read_at_start } = watched;
    tokio::spawn(async move {
        let mut hangups = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) {
            Ok(hangups) => Some(hangups),
            Err(e) => {
                tracing::warn!(error = %e, what, "cannot watch for SIGHUP: the files are read again only when they change");
                None
            }
        };
        let hangup = async |hangups: &mut Option<tokio::signal::unix::Signal>| match hangups {
            Some(h) => h.recv().await,
            None => std::future::pending().await,
        };
        let mut seen = read_at_start;
        let mut poll = tokio::time::interval(POLL);
        poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            let why = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = hangup(&mut hangups) => "SIGHUP",
                _ = poll.tick() => "a file changed",
            };
            // Read once: what is compared is what is taken.
            let contents: Vec<Option<Vec<u8>>> = files.iter().map(|f| std::fs::read(f).ok()).collect();
            if why != "SIGHUP" && contents == seen {
                continue;
            }
            seen = contents.clone();
            match take(&contents) {
                Ok(detail) => tracing::info!(
                    what,
                    why,
                    detail,
                    event = format!("{event}_reloaded"),
                    "{what} read again"
                ),
                Err(e) => tracing::error!(
                    what,
                    why,
                    error = %format!("{e:#}"),
                    event = format!("{event}_reload_failed"),
                    "{what} not taken; what was in force stays"
                ),
            }
        }
    });
}
