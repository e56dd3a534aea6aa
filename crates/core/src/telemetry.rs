//! Log set-up: JSON lines when stdout is not a terminal (for log shippers), human-readable text
//! when it is. `RUST_LOG` filters; the default is `info`.

use std::io::IsTerminal;

use tracing_subscriber::{EnvFilter, fmt};

/// Installs the global subscriber once; later calls are no-ops, so tests may call it freely.
pub fn init_logging() {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,async_nats=warn,h2=warn,tower=warn"));
    let builder = fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let result = if std::io::stderr().is_terminal() {
        builder.compact().try_init()
    } else {
        builder.json().flatten_event(true).with_current_span(true).try_init()
    };
    let _ = result;
}
