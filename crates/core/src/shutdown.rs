//! Turning SIGINT and SIGTERM into a cancellation token.
//!
//! Slurm (and `kill`) send SIGTERM first and SIGKILL after a grace period; Ctrl-C sends
//! SIGINT. Both mean "stop taking work and hand in-flight work back".

use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

/// A token cancelled on the first SIGINT or SIGTERM. A second SIGINT (an impatient
/// Ctrl-C) calls `on_second_signal` (a binary passes `|| std::process::exit(130)`: the
/// library itself never ends the process). A repeated SIGTERM does not: it is the same
/// request again, and Slurm delivers it twice as a matter of course (to every process of
/// a cancelled job, and once more through the batch script that forwards it), so
/// treating it as "exit now" would skip the hand-back the grace period is for. SIGKILL
/// is what ends a process that ignores the grace period.
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
        loop {
            tokio::select! {
                _ = term.recv() => {
                    tracing::info!("SIGTERM again; still handing work back (SIGINT or SIGKILL ends the process now)");
                }
                _ = int.recv() => break,
            }
        }
        tracing::warn!("second interrupt; exiting now");
        on_second_signal();
    });
    token
}
