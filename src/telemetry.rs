//! Logging setup: `tracing` to stderr, or to a file with only warnings on screen;
//! human-readable or JSON lines.
//!
//! Every line of a job's work carries its `job_id` (workers open a span per stage
//! message), so `grep job_id=…` or a JSON query follows one rollout across processes.
//! `rollout up` keeps its terminal for the progress bar and the summary: its log goes
//! to a file under the state directory ([`init_to_file`]).

use std::path::Path;

use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer, Registry};

use crate::config::LogSettings;

/// The configured filter; `RUST_LOG` overrides it.
fn filter(log: &LogSettings) -> EnvFilter {
    EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&log.level))
}

/// Whether text lines on stderr get colour: only on a terminal (a batch job's output
/// file, a pipe or a collector gets plain text), and not under `NO_COLOR`.
fn colour_on_stderr() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

/// Installs the global subscriber: everything at the configured level to stderr. Safe
/// to call twice (the second call does nothing).
pub fn init(log: &LogSettings) {
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter(log))
        .with_writer(std::io::stderr);
    let _ = if log.json {
        builder.json().flatten_event(true).try_init()
    } else {
        builder.compact().with_ansi(colour_on_stderr()).try_init()
    };
}

/// Installs the global subscriber for a command that owns the terminal: everything at
/// the configured level is appended to `file` (created with its directory), and only
/// warnings and errors also reach stderr, so they are not missed. Safe to call twice.
pub fn init_to_file(log: &LogSettings, file: &Path) -> std::io::Result<()> {
    if let Some(dir) = file.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let out = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(file)?;
    let to_file = layer(log.json, false, std::sync::Mutex::new(out), filter(log));
    let to_screen = layer(
        log.json,
        colour_on_stderr(),
        std::io::stderr,
        LevelFilter::WARN,
    );
    let _ = tracing_subscriber::registry()
        .with(vec![to_file, to_screen])
        .try_init();
    Ok(())
}

/// One output of [`init_to_file`]: JSON lines or compact text (colour only where
/// `ansi`), written to `writer`, of the events `filter` lets through.
fn layer<W, F>(
    json: bool,
    ansi: bool,
    writer: W,
    filter: F,
) -> Box<dyn Layer<Registry> + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
    F: tracing_subscriber::layer::Filter<Registry> + Send + Sync + 'static,
{
    let fmt = tracing_subscriber::fmt::layer().with_writer(writer);
    if json {
        fmt.json().flatten_event(true).with_filter(filter).boxed()
    } else {
        fmt.compact().with_ansi(ansi).with_filter(filter).boxed()
    }
}

/// The `--log-format` of the command-line programs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line (for a cluster's log collector).
    Json,
}

impl LogFormat {
    /// Applies the format to the log settings.
    pub fn apply(self, log: &mut LogSettings) {
        log.json = self == LogFormat::Json;
    }
}
