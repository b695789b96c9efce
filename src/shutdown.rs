//! Turning SIGINT and SIGTERM into a cancellation token.
//!
//! Slurm (and `kill`) send SIGTERM first and SIGKILL after a grace period; Ctrl-C sends
//! SIGINT. Both mean "stop taking work and hand in-flight work back".

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGINT or SIGTERM. A second signal calls
/// `on_second_signal` (a binary passes `|| std::process::exit(130)`: the library itself
/// never ends the process).
pub fn on_signals(on_second_signal: impl FnOnce() + Send + 'static) -> CancellationToken {
    let token = CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let mut term = signal(SignalKind::terminate()).expect("install SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("install SIGINT handler");
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received; shutting down"),
            _ = int.recv() => tracing::info!("interrupt received; shutting down"),
        }
        t.cancel();
        tokio::select! {
            _ = term.recv() => {},
            _ = int.recv() => {},
        }
        tracing::warn!("second signal; exiting now");
        on_second_signal();
    });
    token
}
