//! The sandbox server: the first process inside every sandbox (`rollout-sandbox serve`).
//!
//! It starts the persistent shell, binds the Unix socket (so a socket that exists means a
//! shell that answers), warms up the Python interpreter in the background, and serves
//! [`protocol`](crate::sandbox::protocol) requests: each request runs in its own task, so
//! a long `bash` call does not hold up a `file` view or a `ping`. The shell and the
//! interpreter each serialise their own calls. It is built to stay small (a single-threaded
//! runtime, no state beyond the tools') because one runs in every sandbox on a node.

pub mod bash;
pub mod export;
pub mod files;
pub mod output;
pub mod python;
pub mod stream;

use crate::sandbox::protocol::{
    self, BashArgs, ErrorCode, ExportArgs, FileArgs, PROTOCOL_VERSION, PingResult, PythonArgs,
    Request, Response,
};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
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
/// The longest timeout a request may ask for (one day).
pub const MAX_TOOL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);

/// Where and how to serve.
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// The Unix socket to bind (a stale file there is replaced).
    pub socket: PathBuf,
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
}

struct Tools {
    bash: bash::BashTool,
    python: python::PythonTool,
    files: files::FileTool,
    export: export::Exporter,
    workdir: PathBuf,
    started: Instant,
}

/// Serves until `shutdown` fires, then kills the shell and the interpreter.
pub async fn serve(opts: ServerOptions, shutdown: CancellationToken) -> std::io::Result<()> {
    std::fs::create_dir_all(&opts.ctl_dir)?;
    let bash = bash::BashTool::start(bash::ShellOptions {
        program: opts.shell.clone(),
        workdir: opts.workdir.clone(),
        ctl_dir: opts.ctl_dir.clone(),
    })
    .await?;
    let python = python::PythonTool::new(python::PythonOptions {
        program: opts.python.clone(),
        engine: opts.python_engine.clone(),
        workdir: opts.workdir.clone(),
    });
    let tools = Arc::new(Tools {
        bash,
        python,
        files: files::FileTool::new(opts.workdir.clone()),
        export: export::Exporter::start(opts.workdir.clone(), opts.ctl_dir.clone()).await,
        workdir: opts.workdir.clone(),
        started: Instant::now(),
    });
    let _ = std::fs::remove_file(&opts.socket);
    let listener = UnixListener::bind(&opts.socket)?;
    tracing::info!(socket = %opts.socket.display(), "sandbox server ready");
    let drain = tools.clone();
    tokio::spawn(async move { drain.bash.drain_between_calls().await });
    let warm = tools.clone();
    tokio::spawn(async move {
        if let Err(e) = warm.python.warm_up().await {
            tracing::warn!(error = %e, "python interpreter did not start; python calls will retry");
        }
    });
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    tokio::spawn(connection(stream, tools.clone(), shutdown.clone()));
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
    let _ = std::fs::remove_file(&opts.socket);
    tools.bash.shutdown().await;
    tools.python.shutdown().await;
    Ok(())
}

async fn connection(stream: UnixStream, tools: Arc<Tools>, shutdown: CancellationToken) {
    let (mut sink, mut frames) = Framed::new(stream, protocol::codec()).split();
    let (tx, mut rx) = mpsc::channel::<Response>(64);
    let writer = tokio::spawn(async move {
        while let Some(resp) = rx.recv().await {
            let body = serde_json::to_vec(&resp).expect("responses serialise");
            if sink.send(Bytes::from(body)).await.is_err() {
                break;
            }
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
            let resp = handle(&tools, request).await;
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

async fn handle(tools: &Tools, req: Request) -> Response {
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
        "file" => {
            let a: FileArgs = match args(id, req.args) {
                Ok(a) => a,
                Err(r) => return r,
            };
            return match tools.files.run(&a) {
                Ok(r) => Response::ok(id, to_value(&r)),
                Err(msg) => Response::err(id, ErrorCode::ToolFailed, msg),
            };
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
            return match tools.export.run(&a).await {
                Ok(r) => Response::ok(id, to_value(&r)),
                Err(msg) => Response::err(id, ErrorCode::ToolFailed, msg),
            };
        }
        "ping" => Ok(to_value(&PingResult {
            v: PROTOCOL_VERSION,
            pid: std::process::id(),
            workdir: tools.workdir.display().to_string(),
            bash_ready: tools.bash.is_ready(),
            python_engine: tools.python.engine(),
            uptime_ms: tools.started.elapsed().as_millis() as u64,
        })),
        other => {
            return Response::err(
                id,
                ErrorCode::UnknownTool,
                format!(
                    "no tool named `{other}`; the tools are bash, python, file, export and ping"
                ),
            );
        }
    };
    match result {
        Ok(v) => Response::ok(id, v),
        Err(e) => Response::err(id, ErrorCode::Internal, e.to_string()),
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
    let pid = child.id().map(|p| p as i32).unwrap_or(-1);
    Ok((child, pid))
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
