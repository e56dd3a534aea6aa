//! Process shutdown: the first SIGTERM or SIGINT cancels the token so services drain; a second
//! signal exits at once.
//!
//! A signal that arrives within [`REPEAT_WINDOW`] of the first is the same request delivered
//! twice, not a second one: a supervised process (`hermes_executor::supervise`) gets the signal
//! its supervisor forwards and, when the signal went to the whole process group (Ctrl-C in a
//! terminal, `kill -- -pgid`, a cgroup-wide stop), the original as well. Taking that as "exit at
//! once" would abandon the tasks the drain was about to finish.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use tokio_util::sync::CancellationToken as ShutdownToken;

/// Signals this soon after the first are the same shutdown request, delivered twice.
pub const REPEAT_WINDOW: std::time::Duration = std::time::Duration::from_secs(1);

/// Spawns the signal watcher and returns the token it cancels.
pub fn install_signal_handlers() -> CancellationToken {
    let token = CancellationToken::new();
    let watched = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        info!(event = "shutdown_requested", "shutting down; send the signal again to exit at once");
        let first = std::time::Instant::now();
        watched.cancel();
        loop {
            wait_for_signal().await;
            if first.elapsed() >= REPEAT_WINDOW {
                break;
            }
        }
        warn!("second signal: exiting now");
        std::process::exit(130);
    });
    token
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}
