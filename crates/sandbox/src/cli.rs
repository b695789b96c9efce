//! The `rollout-sandbox` command: the server that runs inside every sandbox, and a small
//! client to talk to one by hand.
//!
//! `rollout-sandbox serve` is started by the sandbox backends as the sandbox's first
//! process; `rollout-sandbox launch` is a launcher the worker starts ahead of time,
//! which waits for a sandbox's bwrap arguments and becomes bwrap (see
//! [`crate::launcher`]); `rollout-sandbox call` sends one request to a running server
//! and prints the response, which is how to poke at a live sandbox while debugging.
//!
//! The command lives here, not in the service, so that the binary every sandbox runs
//! links this crate alone (no database driver, no NATS client, no tokenizer): the
//! service's `rollout-sandbox` binary target only calls [`main`].

use crate::SandboxClient;
use crate::server::{Listen, ServerOptions, serve};
use anyhow::Context;
use clap::{Parser, Subcommand};
use std::path::PathBuf;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "rollout-sandbox",
    version,
    about = "The rollout sandbox server (bash, python, exec, file and export tools over a Unix socket)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the tools on a Unix socket until SIGTERM.
    Serve {
        /// The socket to bind.
        #[arg(
            long,
            required_unless_present = "listen_fd",
            conflicts_with = "listen_fd"
        )]
        socket: Option<PathBuf>,
        /// Serve on this already listening socket descriptor instead (the launcher bound
        /// it where the sandbox cannot reach the socket file).
        #[arg(long)]
        listen_fd: Option<i32>,
        /// The workspace (starting directory of the shell and the interpreter).
        #[arg(long)]
        workdir: PathBuf,
        /// A private directory for the server's own files.
        #[arg(long)]
        ctl_dir: PathBuf,
        /// The shell.
        #[arg(long, default_value = "bash")]
        shell: String,
        /// The Python interpreter.
        #[arg(long, default_value = "python3")]
        python: String,
        /// `auto` (IPython when importable), `ipython` or `cpython`.
        #[arg(long, env = "ROLLOUT_SANDBOX_PYTHON_ENGINE", default_value = "auto")]
        python_engine: String,
        /// The server has the sandbox's PID namespace to itself: every process in /proc
        /// is the sandbox's, so exec ends whatever its command left behind, in any
        /// session. Never on a host's own namespace.
        #[arg(long)]
        own_pid_namespace: bool,
        /// Stop when this inherited pipe descriptor reads end-of-file: the worker that
        /// started the sandbox holds its only write end, so that is when the worker has
        /// ended, however it ended.
        #[arg(long)]
        lifeline_fd: Option<i32>,
    },
    /// Wait on descriptor 0 (a socket the worker holds the other end of) for one
    /// order, then carry it out: exec the sandbox's bwrap. Started by the worker ahead
    /// of time, never by hand.
    Launch {
        /// The worker's pid: the launcher ends if it is not its parent.
        #[arg(long)]
        parent: i32,
    },
    /// Send one request to a running server and print its response as JSON.
    Call {
        /// The server's socket.
        #[arg(long)]
        socket: PathBuf,
        /// The tool: bash, python, file, export or ping.
        tool: String,
        /// The tool's arguments as JSON, e.g. '{"command": "ls"}'.
        #[arg(default_value = "null")]
        args: String,
        /// Timeout in milliseconds.
        #[arg(long)]
        timeout_ms: Option<u64>,
    },
}

/// Runs the command line this process was started with (`serve`, `launch` or `call`);
/// an error is for the binary to print before it exits non-zero.
pub fn main() -> anyhow::Result<()> {
    let main_ns = crate::profile::monotonic_ns();
    let cli = Cli::parse();
    if let Command::Launch { parent } = cli.command {
        // No runtime and no threads: this process becomes bwrap.
        return match crate::launcher::run(parent) {
            Ok(()) => Ok(()),
            Err(e) => {
                eprintln!("the sandbox's launcher failed: {e}");
                std::process::exit(127)
            }
        };
    }
    // One thread: a server per sandbox, many sandboxes per node.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    rt.block_on(async move {
        match cli.command {
            Command::Serve {
                socket,
                listen_fd,
                workdir,
                ctl_dir,
                shell,
                python,
                python_engine,
                own_pid_namespace,
                lifeline_fd,
            } => {
                tracing_subscriber::fmt()
                    .with_writer(std::io::stderr)
                    .with_env_filter(
                        tracing_subscriber::EnvFilter::try_from_env("ROLLOUT_SANDBOX_LOG")
                            .unwrap_or_else(|_| "info".into()),
                    )
                    .init();
                let shutdown = tokio_util::sync::CancellationToken::new();
                let stop = shutdown.clone();
                tokio::spawn(async move {
                    use tokio::signal::unix::{SignalKind, signal};
                    if let Ok(mut term) = signal(SignalKind::terminate()) {
                        term.recv().await;
                        stop.cancel();
                    }
                });
                if let Some(fd) = lifeline_fd {
                    // SAFETY: the launcher passed this descriptor for exactly this use.
                    let broken = unsafe { crate::lifeline::wait_broken(fd) };
                    let stop = shutdown.clone();
                    tokio::spawn(async move {
                        match broken.await {
                            Ok(()) => tracing::warn!(
                                "the worker that started this sandbox has ended: stopping"
                            ),
                            Err(e) => tracing::warn!(
                                error = %e,
                                "the worker's lifeline cannot be read: stopping"
                            ),
                        }
                        stop.cancel();
                    });
                }
                serve(
                    ServerOptions {
                        listen: match (listen_fd, socket) {
                            (Some(fd), _) => Listen::Fd(fd),
                            (None, Some(path)) => Listen::Path(path),
                            (None, None) => anyhow::bail!("give --socket or --listen-fd"),
                        },
                        workdir,
                        ctl_dir,
                        shell,
                        python,
                        python_engine,
                        own_pid_namespace,
                        main_ns,
                    },
                    shutdown,
                )
                .await
                .context("the sandbox server failed")
            }
            Command::Launch { .. } => unreachable!("handled before the runtime"),
            Command::Call {
                socket,
                tool,
                args,
                timeout_ms,
            } => {
                let args: serde_json::Value =
                    serde_json::from_str(&args).context("args must be JSON")?;
                let client = SandboxClient::connect(&socket).await?;
                let resp = client
                    .call(&tool, args, timeout_ms.map(Duration::from_millis))
                    .await?;
                println!("{}", serde_json::to_string_pretty(&resp)?);
                Ok(())
            }
        }
    })
}
