//! The host side of the sandbox protocol: a multiplexing client over the Unix socket.
//!
//! One connection carries many calls: each gets a fresh id and waits on its own channel,
//! while one reader task routes responses by id. So an agent can run a long build in
//! `bash` and still `ping` or view a file meanwhile.

use super::SandboxError;
use crate::protocol::{
    self, ApplyArgs, ApplyResult, BaselineResult, BashArgs, BashResult, EndpointCall, EndpointNext,
    EndpointOpenArgs, EndpointOpenResult, EndpointReplyArgs, EndpointReplyResult, ExecArgs,
    ExecResult, ExportArgs, ExportResult, FileArgs, FileResult, PROTOCOL_VERSION, PingResult,
    PythonArgs, PythonResult, Request, Response, ToolError,
};
use bytes::Bytes;
use futures::stream::SplitSink;
use futures::{SinkExt, StreamExt};
use rollout_core::domain::duration_ms;
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::UnixStream;
use tokio::sync::oneshot;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

/// Added to a call's own timeout before the client stops waiting: the server's
/// escalation after a timeout (interrupt, kill) takes a few seconds, and replacing an
/// interpreter may take its whole start-up allowance (30 s) on top.
const ESCALATION_ALLOWANCE: Duration = Duration::from_secs(60);

/// How often a waiting call looks at whether the server process has been stopped (one
/// read of its `/proc` status).
const STOP_CHECK: Duration = Duration::from_secs(1);

type Pending = Arc<Mutex<HashMap<u64, oneshot::Sender<Response>>>>;

/// A connection to one sandbox server.
pub struct SandboxClient {
    path: PathBuf,
    sink: tokio::sync::Mutex<SplitSink<Framed<UnixStream, LengthDelimitedCodec>, Bytes>>,
    pending: Pending,
    next_id: AtomicU64,
    reader: tokio::task::JoinHandle<()>,
    /// The server's process id in this process's namespace, when the caller knows it
    /// ([`SandboxClient::watch`]), to tell a server that was stopped from a slow one.
    server_pid: Option<i32>,
}

impl Drop for SandboxClient {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl SandboxClient {
    /// Connects to the socket at `path`. A symlink there is refused: the socket is the
    /// server's own file, and a link would let whoever placed it redirect the client to
    /// another sandbox.
    pub async fn connect(path: &Path) -> Result<Self, SandboxError> {
        if let Ok(m) = std::fs::symlink_metadata(path)
            && m.file_type().is_symlink()
        {
            return Err(SandboxError::Connect {
                path: path.to_path_buf(),
                source: std::io::Error::other(
                    "it is a symbolic link, not the sandbox's socket; refusing to follow it",
                ),
            });
        }
        let stream = UnixStream::connect(path)
            .await
            .map_err(|source| SandboxError::Connect {
                path: path.to_path_buf(),
                source,
            })?;
        let (sink, mut frames) = Framed::new(stream, protocol::codec()).split();
        let pending: Pending = Arc::default();
        let routes = pending.clone();
        let reader = tokio::spawn(async move {
            while let Some(Ok(frame)) = frames.next().await {
                let Ok(resp) = serde_json::from_slice::<Response>(&frame) else {
                    continue;
                };
                if let Some(tx) = routes.lock().expect("pending lock").remove(&resp.id) {
                    let _ = tx.send(resp);
                }
            }
            // Closing: every waiting call learns the server is gone.
            routes.lock().expect("pending lock").clear();
        });
        Ok(SandboxClient {
            path: path.to_path_buf(),
            sink: tokio::sync::Mutex::new(sink),
            pending,
            next_id: AtomicU64::new(1),
            reader,
            server_pid: None,
        })
    }

    /// Watches the server process `pid` (in this process's namespace) while calls wait:
    /// a call to a server that was stopped ends at once with
    /// [`SandboxError::Stopped`] rather than after its timeout and escalation allowance.
    pub fn watch(&mut self, pid: Option<i32>) {
        self.server_pid = pid;
    }

    /// The socket this client is connected to.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sends one request and waits for its response.
    pub async fn call(
        &self,
        tool: &str,
        args: serde_json::Value,
        timeout: Option<Duration>,
    ) -> Result<Response, SandboxError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let req = Request {
            v: PROTOCOL_VERSION,
            id,
            tool: tool.to_string(),
            timeout_ms: timeout.map(duration_ms),
            args,
        };
        let (tx, rx) = oneshot::channel();
        self.pending.lock().expect("pending lock").insert(id, tx);
        let body = serde_json::to_vec(&req).expect("requests serialise");
        let sent = self.sink.lock().await.send(Bytes::from(body)).await;
        if let Err(e) = sent {
            self.pending.lock().expect("pending lock").remove(&id);
            return Err(SandboxError::Io(e));
        }
        let wait = timeout.unwrap_or(super::server::DEFAULT_TOOL_TIMEOUT) + ESCALATION_ALLOWANCE;
        let deadline = tokio::time::Instant::now() + wait;
        let mut rx = rx;
        // The first look after one period: a call answered sooner costs no `/proc` read.
        let mut ticks =
            tokio::time::interval_at(tokio::time::Instant::now() + STOP_CHECK, STOP_CHECK);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                answer = &mut rx => {
                    return match answer {
                        Ok(resp) => Ok(resp),
                        Err(_) => Err(SandboxError::Closed),
                    };
                }
                () = tokio::time::sleep_until(deadline) => {
                    self.pending.lock().expect("pending lock").remove(&id);
                    return Err(SandboxError::NoAnswer(wait));
                }
                _ = ticks.tick() => {
                    // A stopped server never answers: no point waiting out the allowance.
                    if let Some(pid) = self.server_pid.filter(|p| is_stopped(*p)) {
                        self.pending.lock().expect("pending lock").remove(&id);
                        return Err(SandboxError::Stopped(pid));
                    }
                }
            }
        }
    }

    async fn typed<T: DeserializeOwned>(
        &self,
        tool: &str,
        args: serde_json::Value,
        timeout: Option<Duration>,
    ) -> Result<Result<T, ToolError>, SandboxError> {
        let resp = self.call(tool, args, timeout).await?;
        match (resp.ok, resp.result, resp.error) {
            (true, Some(v), _) => serde_json::from_value(v)
                .map(Ok)
                .map_err(|e| SandboxError::Protocol(format!("unexpected {tool} result: {e}"))),
            (_, _, Some(err)) => Ok(Err(err)),
            _ => Err(SandboxError::Protocol(format!(
                "{tool} response has neither result nor error"
            ))),
        }
    }

    /// Runs a shell command.
    pub async fn bash(
        &self,
        command: &str,
        timeout: Option<Duration>,
    ) -> Result<BashResult, SandboxError> {
        let args = BashArgs {
            command: command.to_string(),
            max_output_bytes: None,
        };
        self.typed("bash", serde_json::to_value(args).expect("args"), timeout)
            .await?
            .map_err(SandboxError::Tool)
    }

    /// Runs a Python cell.
    pub async fn python(
        &self,
        code: &str,
        timeout: Option<Duration>,
    ) -> Result<PythonResult, SandboxError> {
        let args = PythonArgs {
            code: code.to_string(),
            max_output_bytes: None,
        };
        self.typed("python", serde_json::to_value(args).expect("args"), timeout)
            .await?
            .map_err(SandboxError::Tool)
    }

    /// Runs a file command; the inner `Err` is the tool's refusal (no match, bad range).
    pub async fn file(
        &self,
        args: &FileArgs,
    ) -> Result<Result<FileResult, ToolError>, SandboxError> {
        self.typed("file", serde_json::to_value(args).expect("args"), None)
            .await
    }

    /// Runs one command as a process of its own; its status comes from the kernel.
    pub async fn exec(
        &self,
        args: &ExecArgs,
        timeout: Option<Duration>,
    ) -> Result<ExecResult, SandboxError> {
        self.typed("exec", serde_json::to_value(args).expect("args"), timeout)
            .await?
            .map_err(SandboxError::Tool)
    }

    /// Exports the workspace's changes; the inner `Err` is the tool's refusal (too large,
    /// git failed).
    pub async fn export(
        &self,
        args: &ExportArgs,
    ) -> Result<Result<ExportResult, ToolError>, SandboxError> {
        self.typed("export", serde_json::to_value(args).expect("args"), None)
            .await
    }

    /// Makes the workspace as it is now the baseline of later exports and applies.
    pub async fn baseline(&self) -> Result<BaselineResult, SandboxError> {
        self.typed("baseline", serde_json::Value::Null, None)
            .await?
            .map_err(SandboxError::Tool)
    }

    /// Applies exported changes and restores what they may not change; the inner `Err`
    /// says why they could not be applied.
    pub async fn apply(
        &self,
        args: &ApplyArgs,
    ) -> Result<Result<ApplyResult, ToolError>, SandboxError> {
        self.typed("apply", serde_json::to_value(args).expect("args"), None)
            .await
    }

    /// Opens the sandbox's model endpoint with `key` and returns its port on the
    /// sandbox's loopback (the same port again when it is open already).
    pub async fn endpoint_open(&self, key: &str) -> Result<u16, SandboxError> {
        let args = EndpointOpenArgs {
            key: key.to_string(),
            max_body_bytes: None,
        };
        let r: EndpointOpenResult = self
            .typed(
                "endpoint_open",
                serde_json::to_value(args).expect("args"),
                Some(Duration::from_secs(10)),
            )
            .await?
            .map_err(SandboxError::Tool)?;
        Ok(r.port)
    }

    /// The next request an agent made to the model endpoint, waiting up to `wait`; none
    /// when the wait ran out.
    pub async fn endpoint_next(
        &self,
        wait: Duration,
    ) -> Result<Option<EndpointCall>, SandboxError> {
        let r: EndpointNext = self
            .typed("endpoint_next", serde_json::Value::Null, Some(wait))
            .await?
            .map_err(SandboxError::Tool)?;
        Ok(r.call)
    }

    /// Answers the endpoint request `id`; false when it was no longer waiting.
    pub async fn endpoint_reply(&self, reply: &EndpointReplyArgs) -> Result<bool, SandboxError> {
        let r: EndpointReplyResult = self
            .typed(
                "endpoint_reply",
                serde_json::to_value(reply).expect("args"),
                Some(Duration::from_secs(10)),
            )
            .await?
            .map_err(SandboxError::Tool)?;
        Ok(r.delivered)
    }

    /// Asks whether the tools are up.
    pub async fn ping(&self) -> Result<PingResult, SandboxError> {
        self.typed(
            "ping",
            serde_json::Value::Null,
            Some(Duration::from_secs(5)),
        )
        .await?
        .map_err(SandboxError::Tool)
    }
}

/// Whether process `pid` is stopped (by a signal, or under a tracer): its state in
/// `/proc/<pid>/stat` is `T` or `t`. A process that is gone is not stopped.
pub fn is_stopped(pid: i32) -> bool {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return false;
    };
    // The state follows the command name, which is in parentheses and may hold any
    // character: read after the last `)`.
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .is_some_and(|state| state == "T" || state == "t")
}
