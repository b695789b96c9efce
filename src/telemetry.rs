//! Logging setup: `tracing` to stderr, human-readable or JSON lines.
//!
//! Every line of a job's work carries its `job_id` (workers open a span per stage
//! message), so `grep job_id=…` or a JSON query follows one rollout across processes.

use crate::config::LogSettings;

/// Installs the global subscriber. `RUST_LOG` overrides the configured level. Safe to call
/// twice (the second call does nothing).
pub fn init(log: &LogSettings) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(&log.level));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = if log.json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.compact().try_init()
    };
}
