//! Process shutdown: the first SIGTERM or SIGINT cancels the token so services drain; a second
//! signal exits at once.

use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use tokio_util::sync::CancellationToken as ShutdownToken;

/// Spawns the signal watcher and returns the token it cancels.
pub fn install_signal_handlers() -> CancellationToken {
    let token = CancellationToken::new();
    let watched = token.clone();
    tokio::spawn(async move {
        wait_for_signal().await;
        info!(event = "shutdown_requested", "shutting down; send the signal again to exit at once");
        watched.cancel();
        wait_for_signal().await;
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
