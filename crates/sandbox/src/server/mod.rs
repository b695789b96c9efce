//! The sandbox server: the first process inside every sandbox (`rollout-sandbox serve`).
//!
//! It starts the persistent shell, binds the Unix socket (so a socket that exists means a
//! shell that answers), warms up the Python interpreter in the background, and serves
//! [`protocol`] requests: each request runs in its own task, so
//! a long `bash` call does not hold up a `file` view or a `ping`. The shell and the
//! interpreter each serialise their own calls. It is built to stay small (a single-threaded
//! runtime, no state beyond the tools') because one runs in every sandbox on a node.

pub mod bash;
pub mod endpoint;
pub mod exec;
pub mod export;
pub mod files;
pub mod leftovers;
pub mod output;
pub mod python;
pub mod stream;

use crate::protocol::{
    self, ApplyArgs, BashArgs, EndpointOpenArgs, EndpointOpenResult, EndpointReplyArgs,
    EndpointReplyResult, ErrorCode, ExecArgs, ExportArgs, FileArgs, MAX_FRAME_BYTES,
    PROTOCOL_VERSION, PingResult, PythonArgs, Request, Response,
};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use rollout_core::domain::duration_ms;
use serde::de::DeserializeOwned;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::{UnixListener, UnixStream};
use tokio::sync::mpsc;
use tokio_util::codec::Framed;
use tokio_util::sync::CancellationToken;

/// Default timeout of `bash` and `python` calls that set none.
pub const DEFAULT_TOOL_TIMEOUT: Duration = Duration::from_secs(180);
/// The shell `exec` runs commands with.
const EXEC_SHELL: &str = "bash";
/// The longest timeout a request may ask for (one day).
pub const MAX_TOOL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Where the server takes connections.
#[derive(Debug, Clone)]
pub enum Listen {
    /// Bind this Unix socket path (a stale file there is replaced).
    Path(PathBuf),
    /// A listening Unix socket the launcher bound and passed as this descriptor. The
    /// socket file then lives where the sandbox cannot reach it, so nothing inside can
    /// replace it (with a symlink to another sandbox's socket, say).
    Fd(i32),
}

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Where to take connections.
    pub listen: Listen,
    /// The workspace: the shell's and interpreter's starting directory.
    pub workdir: PathBuf,
    /// A private directory for the server's own files (command files, export index).
    pub ctl_dir: PathBuf,
    /// The shell executable.
    pub shell: String,
    /// The Python executable.
    pub python: String,
    /// `auto`, `ipython` or `cpython`.
    pub python_engine: String,
    /// Whether the server has the sandbox's PID namespace to itself (every process in
    /// `/proc` is the sandbox's), so `exec` may end whatever its command left behind.
    pub own_pid_namespace: bool,
    /// When the server's `main` began ([`crate::profile::monotonic_ns`]), for
    /// the start profile; 0 if unknown.
    pub main_ns: u64,
}

struct Tools {
    bash: bash::BashTool,
    ctl_dir: PathBuf,
    python: python::PythonTool,
    files: files::FileTool,
    export: export::Exporter,
    /// The model endpoint an agent program calls (opened on the host's first
    /// `endpoint_open`).
    endpoint: Arc<endpoint::ModelEndpoint>,
    workdir: PathBuf,
    started: Instant,
    own_pid_namespace: bool,
    startup: protocol::ServerStartup,
    /// When the first connection was taken (the last mark of [`Tools::startup`]).
    serving_ns: std::sync::atomic::AtomicU64,
    /// Cancelled once the first answer has been sent (the interpreter's warm-up waits
    /// for it).
    answered: CancellationToken,
}

/// Makes this process undumpable: processes of the same user (the agent's) can then
/// neither ptrace it nor read its memory or environment through `/proc`. Children get
/// the flag back when they exec. (Code the shell or the interpreter runs in-process can
/// still learn their marker tokens; nothing scored relies on those markers, see
/// [`exec`].)
pub fn make_undumpable() -> std::io::Result<()> {
    // SAFETY: prctl with PR_SET_DUMPABLE takes plain integers.
    if unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

fn listener(listen: &Listen) -> std::io::Result<UnixListener> {
    match listen {
        Listen::Path(path) => {
            let _ = std::fs::remove_file(path);
            UnixListener::bind(path)
        }
        Listen::Fd(fd) => {
            use std::os::fd::FromRawFd;
            // SAFETY: the launcher passed this descriptor for exactly this use; nothing
            // else in the process owns it.
            let std = unsafe { std::os::unix::net::UnixListener::from_raw_fd(*fd) };
            // Not inherited by the shell, the interpreter or anything they start.
            nix::fcntl::fcntl(
                &std,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(std::io::Error::from)?;
            std.set_nonblocking(true)?;
            UnixListener::from_std(std)
        }
    }
}

/// Serves until `shutdown` fires, then kills the shell and the interpreter.
pub async fn serve(opts: ServerOptions, shutdown: CancellationToken) -> std::io::Result<()> {
    make_undumpable()?;
    std::fs::create_dir_all(&opts.ctl_dir)?;
    let listener = listener(&opts.listen)?;
    let mut startup = protocol::ServerStartup {
        main_ns: opts.main_ns,
        ..Default::default()
    };
    // The shell's start and the baseline (a `git` process for a repository) are each
    // mostly waiting for a child process: done side by side, a start waits for the
    // longer of the two, not both.
    let shell = async {
        let bash = bash::BashTool::start(bash::ShellOptions {
            program: opts.shell.clone(),
            workdir: opts.workdir.clone(),
            ctl_dir: opts.ctl_dir.clone(),
        })
        .await;
        (bash, crate::profile::monotonic_ns())
    };
    let baseline = async {
        let export = export::Exporter::start(opts.workdir.clone(), opts.ctl_dir.clone()).await;
        (export, crate::profile::monotonic_ns())
    };
    let ((bash, shell_ns), (export, baseline_ns)) = tokio::join!(shell, baseline);
    let bash = bash?;
    startup.shell_ns = shell_ns;
    startup.baseline_ns = baseline_ns;
    let python = python::PythonTool::new(python::PythonOptions {
        program: opts.python.clone(),
        engine: opts.python_engine.clone(),
        workdir: opts.workdir.clone(),
        ctl_dir: opts.ctl_dir.clone(),
    });
    let tools = Arc::new(Tools {
        bash,
        ctl_dir: opts.ctl_dir.clone(),
        python,
        files: files::FileTool::new(opts.workdir.clone()),
        export,
        endpoint: Arc::default(),
        workdir: opts.workdir.clone(),
        started: Instant::now(),
        own_pid_namespace: opts.own_pid_namespace,
        startup,
        serving_ns: 0.into(),
        answered: CancellationToken::new(),
    });
    tracing::info!(listen = ?opts.listen, "sandbox server ready");
    let drain = tools.clone();
    tokio::spawn(async move { drain.bash.drain_between_calls().await });
    let warm = tools.clone();
    let stop_warming = shutdown.clone();
    tokio::spawn(async move {
        // Only once the first answer is out: the interpreter's start (IPython's imports
        // keep a core busy for a good part of a second) must not hold up the answer
        // that tells the launcher the sandbox is ready. A python call before then
        // starts the interpreter itself.
        tokio::select! {
            _ = warm.answered.cancelled() => {}
            _ = stop_warming.cancelled() => return,
        }
        if let Err(e) = warm.python.warm_up().await {
            tracing::warn!(error = %e, "python interpreter did not start; python calls will retry");
        }
    });
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    if tools.serving_ns.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                        tools.serving_ns.store(
                            crate::profile::monotonic_ns(),
                            std::sync::atomic::Ordering::Relaxed,
                        );
                    }
                    tokio::spawn(connection(stream, tools.clone(), shutdown.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    if let Listen::Path(path) = &opts.listen {
        let _ = std::fs::remove_file(path);
    }
    tools.bash.shutdown().await;
    tools.python.shutdown().await;
    Ok(())
}

async fn connection(stream: UnixStream, tools: Arc<Tools>, shutdown: CancellationToken) {
    let (mut sink, mut frames) = Framed::new(stream, protocol::codec()).split();
    let (tx, mut rx) = mpsc::channel::<Response>(64);
    let answered = tools.answered.clone();
    let writer = tokio::spawn(async move {
        while let Some(resp) = rx.recv().await {
            let body = frame_of(&resp);
            if sink.send(Bytes::from(body)).await.is_err() {
                break;
            }
            answered.cancel();
        }
    });
    loop {
        let frame = tokio::select! {
            _ = shutdown.cancelled() => break,
            f = frames.next() => f,
        };
        let frame = match frame {
            Some(Ok(f)) => f,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "bad frame; closing the connection");
                let _ = tx
                    .send(Response::err(
                        0,
                        ErrorCode::BadRequest,
                        format!("bad frame: {e}"),
                    ))
                    .await;
                break;
            }
            None => break,
        };
        let request: Request = match serde_json::from_slice(&frame) {
            Ok(r) => r,
            Err(e) => {
                let _ = tx
                    .send(Response::err(
                        0,
                        ErrorCode::BadRequest,
                        format!("the frame is not a request: {e}"),
                    ))
                    .await;
                continue;
            }
        };
        let tools = tools.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let resp = handle(tools, request).await;
            let _ = tx.send(resp).await;
        });
    }
    drop(tx);
    let _ = writer.await;
}

fn args<T: DeserializeOwned>(id: u64, value: serde_json::Value) -> Result<T, Response> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        Response::err(
            id,
            ErrorCode::BadRequest,
            format!("invalid args (at `{path}`): {}", e.inner()),
        )
    })
}

/// The frame for `resp`; one that would exceed the frame limit becomes an error answer
/// to the same request, so the client learns why instead of losing the connection.
fn frame_of(resp: &Response) -> Vec<u8> {
    let body = serde_json::to_vec(resp).expect("responses serialise");
    if body.len() <= MAX_FRAME_BYTES {
        return body;
    }
    let err = Response::err(
        resp.id,
        ErrorCode::TooLarge,
        format!(
            "the answer is {} bytes, over the {MAX_FRAME_BYTES}-byte frame limit; ask for less (a smaller output cap, a narrower view)",
            body.len()
        ),
    );
    serde_json::to_vec(&err).expect("responses serialise")
}

/// Asks the persistent shell for its exported variables and working directory. Only
/// meaningful while nothing but trusted commands have run in it (EVAL after setup).
async fn shell_state(tools: &Tools) -> std::io::Result<exec::Start> {
    let env_file = tools.ctl_dir.join("shell-env");
    let cwd_file = tools.ctl_dir.join("shell-cwd");
    let cmd = format!(
        "env -0 > '{}'; pwd > '{}'",
        env_file.display(),
        cwd_file.display()
    );
    let r = tools
        .bash
        .run(
            &BashArgs {
                command: cmd,
                max_output_bytes: None,
            },
            Duration::from_secs(30),
        )
        .await?;
    if r.exit_code != Some(0) {
        return Err(std::io::Error::other(format!(
            "cannot read the shell's state: {}",
            r.output
        )));
    }
    let env = exec::parse_env(&std::fs::read(&env_file)?);
    let cwd = std::fs::read_to_string(&cwd_file)?.trim_end().to_string();
    let _ = std::fs::remove_file(&env_file);
    let _ = std::fs::remove_file(&cwd_file);
    Ok(exec::Start {
        cwd: PathBuf::from(cwd),
        env: Some(env),
        end_leftovers: tools.own_pid_namespace,
    })
}

async fn handle(tools: Arc<Tools>, req: Request) -> Response {
    let id = req.id;
    if req.v != PROTOCOL_VERSION {
        return Response::err(
            id,
            ErrorCode::UnsupportedVersion,
            format!(
                "this server speaks protocol version {PROTOCOL_VERSION}, the request is version {}",
                req.v
            ),
        );
    }
    let timeout = req
        .timeout_ms
        .map(Duration::from_millis)
        .unwrap_or(DEFAULT_TOOL_TIMEOUT)
        .min(MAX_TOOL_TIMEOUT);
    let result = match req.tool.as_str() {
        "bash" => {
            let a: BashArgs = match args(id, req.args) {
                Ok(a) => a,
                Err(r) => return r,
            };
            tools.bash.run(&a, timeout).await.map(|r| to_value(&r))
        }
        "python" => {
            let a: PythonArgs = match args(id, req.args) {
                Ok(a) => a,
                Err(r) => return r,
            };
            tools.python.run(&a, timeout).await.map(|r| to_value(&r))
        }
        "exec" => {
            let a: ExecArgs = match args(id, req.args) {
                Ok(a) => a,
                Err(r) => return r,
            };
            return run_exec(&tools, id, &a, timeout).await;
        }
        "file" => {
            let a: FileArgs = match args(id, req.args) {
                Ok(a) => a,
                Err(r) => return r,
            };
            return run_file(tools, id, a).await;
        }
        "baseline" => {
            return tool_response(id, tools.export.baseline().await);
        }
        "apply" => {
            let a: ApplyArgs = match args(id, req.args) {
                Ok(a) => a,
                Err(r) => return r,
            };
            return tool_response(id, tools.export.apply(&a).await);
        }
        "export" => {
            let a: ExportArgs = if req.args.is_null() {
                ExportArgs::default()
            } else {
                match args(id, req.args) {
                    Ok(a) => a,
                    Err(r) => return r,
                }
            };
            return tool_response(id, tools.export.run(&a).await);
        }
        "endpoint_open" | "endpoint_next" | "endpoint_reply" => {
            return endpoint_tool(&tools, id, &req.tool, req.args, timeout).await;
        }
        "ping" => Ok(to_value(&PingResult {
            v: PROTOCOL_VERSION,
            pid: std::process::id(),
            workdir: tools.workdir.display().to_string(),
            bash_ready: tools.bash.is_ready(),
            python_engine: tools.python.engine(),
            uptime_ms: duration_ms(tools.started.elapsed()),
            startup: Some(protocol::ServerStartup {
                serving_ns: tools.serving_ns.load(std::sync::atomic::Ordering::Relaxed),
                ..tools.startup
            }),
        })),
        other => {
            return Response::err(
                id,
                ErrorCode::UnknownTool,
                format!(
                    "no tool named `{other}`; the tools are bash, python, exec, file, export, baseline, apply, endpoint_open, endpoint_next, endpoint_reply and ping"
                ),
            );
        }
    };
    match result {
        Ok(v) => Response::ok(id, v),
        Err(e) => Response::err(id, ErrorCode::Internal, e.to_string()),
    }
}

/// The model endpoint's tools (see [`endpoint`]).
async fn endpoint_tool(
    tools: &Tools,
    id: u64,
    tool: &str,
    raw: serde_json::Value,
    timeout: Duration,
) -> Response {
    match tool {
        "endpoint_open" => {
            let a: EndpointOpenArgs = match args(id, raw) {
                Ok(a) => a,
                Err(r) => return r,
            };
            match tools.endpoint.open(&a).await {
                Ok(port) => Response::ok(id, to_value(&EndpointOpenResult { port })),
                Err(msg) => Response::err(id, ErrorCode::ToolFailed, msg),
            }
        }
        "endpoint_next" => Response::ok(id, to_value(&tools.endpoint.next(timeout).await)),
        _ => {
            let a: EndpointReplyArgs = match args(id, raw) {
                Ok(a) => a,
                Err(r) => return r,
            };
            let delivered = tools.endpoint.reply(a);
            Response::ok(id, to_value(&EndpointReplyResult { delivered }))
        }
    }
}

/// `exec`: a command of its own, started in the workspace or, with `shell_state`, in
/// the persistent shell's directory and environment.
async fn run_exec(tools: &Tools, id: u64, a: &ExecArgs, timeout: Duration) -> Response {
    let start = if a.shell_state {
        match shell_state(tools).await {
            Ok(s) => s,
            Err(e) => return Response::err(id, ErrorCode::Internal, e.to_string()),
        }
    } else {
        exec::Start {
            cwd: tools.workdir.clone(),
            env: None,
            end_leftovers: tools.own_pid_namespace,
        }
    };
    match exec::run(EXEC_SHELL, a, &start, timeout).await {
        Ok(r) => Response::ok(id, to_value(&r)),
        Err(e) => Response::err(id, ErrorCode::Internal, e.to_string()),
    }
}

/// `file`, on a blocking thread: a slow disk or a huge directory must not stall the
/// other calls on this single-threaded server.
async fn run_file(tools: Arc<Tools>, id: u64, a: FileArgs) -> Response {
    let done = tokio::task::spawn_blocking(move || tools.files.run(&a)).await;
    match done {
        Ok(Ok(r)) => Response::ok(id, to_value(&r)),
        Ok(Err(msg)) => Response::err(id, ErrorCode::ToolFailed, msg),
        Err(e) => Response::err(id, ErrorCode::Internal, format!("file tool: {e}")),
    }
}

/// The answer for a tool that reports its own failures (`baseline`, `apply`,
/// `export`), with the code and message it gave.
fn tool_response<T: serde::Serialize>(id: u64, r: Result<T, protocol::ToolError>) -> Response {
    match r {
        Ok(r) => Response::ok(id, to_value(&r)),
        Err(e) => Response::err(id, e.code, e.message),
    }
}

/// Spawns `cmd` and drops it, closing the parent's copies of the descriptors it gave the
/// child; returns the child and its pid.
pub(crate) fn spawn(
    mut cmd: tokio::process::Command,
    program: &str,
) -> std::io::Result<(tokio::process::Child, i32)> {
    let child = cmd
        .spawn()
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot start `{program}`: {e}")))?;
    let pid = child_pid(&child);
    Ok((child, pid))
}

/// `child`'s pid as the `i32` that signals and labels take, or -1 once it has been
/// reaped (Linux pids stay far below `i32::MAX`, so none is lost).
pub(crate) fn child_pid(child: &tokio::process::Child) -> i32 {
    child.id().and_then(|p| i32::try_from(p).ok()).unwrap_or(-1)
}

/// Waits up to `within` for `child` to exit and returns its status the way a shell
/// reports it (128 + the signal number for a process killed by a signal).
pub(crate) async fn exit_code(child: &mut tokio::process::Child, within: Duration) -> Option<i32> {
    use std::os::unix::process::ExitStatusExt;
    match tokio::time::timeout(within, child.wait()).await {
        Ok(Ok(st)) => st.code().or_else(|| st.signal().map(|s| 128 + s)),
        _ => None,
    }
}

fn to_value<T: serde::Serialize>(v: &T) -> serde_json::Value {
    serde_json::to_value(v).expect("results serialise")
}
