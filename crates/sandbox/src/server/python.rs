//! The `python` tool: one persistent interpreter, restarted when it dies.
//!
//! The interpreter runs a small driver (`python_driver.py`, embedded in the binary) that
//! reads cells from a private pipe on fd 3 and reports each result as an end marker on
//! its stdout, after the cell's own output (see [`super::stream`]). Standard input is
//! `/dev/null`, so `input()` fails fast instead of hanging. A timeout sends SIGINT, which
//! Python turns into `KeyboardInterrupt` inside the cell; an interpreter that does not
//! answer within a grace period is killed with its process group and replaced, and the
//! result says its variables are gone.

use super::output::{CappedOutput, DEFAULT_MAX_OUTPUT};
use super::stream::{MarkedStream, Until, nonblocking, reset_signals, write_all};
use crate::protocol::{Escalation, PythonArgs, PythonResult};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use rollout_core::domain::duration_us;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::unix::AsyncFd;
use tokio::sync::Mutex;

const DRIVER: &str = include_str!("python_driver.py");
/// How long an interrupted cell may take to unwind before the interpreter is replaced.
const GRACE: Duration = Duration::from_millis(1000);
/// How long an interpreter may take to import its engine (IPython takes a few hundred ms).
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Results carry tracebacks and reprs; the output cap applies to them separately.
const MAX_RESULT: usize = 4 << 20;

/// How to start the interpreter.
#[derive(Debug, Clone)]
pub struct PythonOptions {
    /// The interpreter (`python3` from `PATH` by default).
    pub program: String,
    /// `auto` (IPython when importable), `ipython` or `cpython`.
    pub engine: String,
    /// The workspace: the cells' working directory, and first on their `sys.path`.
    pub workdir: PathBuf,
    /// The server's private directory: where the interpreter starts, so nothing in the
    /// workspace can shadow a module the driver imports.
    pub ctl_dir: PathBuf,
}

/// The tool: an interpreter started on first use (or by [`PythonTool::warm_up`]).
pub struct PythonTool {
    opts: PythonOptions,
    interp: Mutex<Option<Interp>>,
    engine: std::sync::Mutex<Option<String>>,
}

impl PythonTool {
    /// A tool whose interpreter is not started yet.
    pub fn new(opts: PythonOptions) -> Self {
        PythonTool {
            opts,
            interp: Mutex::new(None),
            engine: std::sync::Mutex::new(None),
        }
    }

    /// Starts the interpreter ahead of the first call, so that call does not pay for it.
    pub async fn warm_up(&self) -> io::Result<()> {
        let mut guard = self.interp.lock().await;
        if guard.is_none() {
            *guard = Some(self.spawn().await?);
        }
        Ok(())
    }

    /// The running engine's name, once one has started.
    pub fn engine(&self) -> Option<String> {
        self.engine.lock().expect("engine lock").clone()
    }

    /// Runs one cell. Calls are serialised: there is one interpreter.
    pub async fn run(&self, args: &PythonArgs, timeout: Duration) -> io::Result<PythonResult> {
        let started = Instant::now();
        let mut guard = self.interp.lock().await;
        let mut notes = Vec::new();
        let mut restarted = false;
        if guard.is_none() {
            *guard = Some(self.spawn().await?);
        }
        let interp = guard.as_mut().expect("interpreter present");
        let max = args.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT);
        let mut out = CappedOutput::new(max);
        interp.seq += 1;
        let seq = interp.seq;
        let request = serde_json::json!({"seq": seq, "code": args.code}).to_string() + "\n";
        let mut result = PythonResult {
            output: String::new(),
            value: None,
            error: None,
            omitted_bytes: 0,
            timed_out: false,
            escalation: None,
            restarted: false,
            note: None,
            engine: interp.engine.clone(),
            elapsed_us: 0,
        };
        let written = write_all(&interp.requests, request.as_bytes()).await;
        let mut ended = match written {
            Ok(()) => {
                let deadline = Instant::now() + timeout;
                interp
                    .output
                    .read_until_exit(&mut interp.child, &mut out, seq, deadline)
                    .await?
            }
            // The interpreter is gone (broken pipe): treat like a crash.
            Err(_) => Until::Eof,
        };
        if let Until::Deadline = ended {
            result.timed_out = true;
            let _ = kill(Pid::from_raw(interp.pid), Signal::SIGINT);
            ended = interp
                .output
                .read_until(&mut out, seq, Instant::now() + GRACE)
                .await?;
            match ended {
                Until::Marker(_) => {
                    result.escalation = Some(Escalation::Interrupted);
                    notes.push(format!(
                        "The cell timed out after {}s and was interrupted (KeyboardInterrupt).",
                        timeout.as_secs_f64()
                    ));
                }
                _ => {
                    result.escalation = Some(Escalation::Restarted);
                    notes.push(format!(
                        "The cell timed out after {}s and did not stop on KeyboardInterrupt, so the interpreter was restarted: all variables and imports are gone.",
                        timeout.as_secs_f64()
                    ));
                    restarted = true;
                }
            }
        }
        match ended {
            Until::Marker(payload) => {
                let parsed: serde_json::Value =
                    serde_json::from_str(&payload).unwrap_or_else(|e| {
                        serde_json::json!({"error": format!("unreadable result from the interpreter: {e}")})
                    });
                result.value = parsed["value"].as_str().map(str::to_string);
                result.error = parsed["error"].as_str().map(str::to_string);
            }
            Until::Eof if !restarted => {
                let status = super::exit_code(&mut interp.child, GRACE).await;
                notes.push(format!(
                    "The Python interpreter exited{} while running this cell and was restarted: all variables and imports are gone.",
                    status.map(|s| format!(" with status {s}")).unwrap_or_default()
                ));
                restarted = true;
            }
            _ => {}
        }
        interp.output.flush(&mut out);
        if restarted {
            self.restart(&mut guard, &mut notes).await;
        }
        let (text, omitted) = out.finish();
        result.output = text;
        result.omitted_bytes = omitted;
        result.restarted = restarted;
        if !notes.is_empty() {
            result.note = Some(notes.join(" "));
        }
        result.elapsed_us = duration_us(started.elapsed());
        Ok(result)
    }

    /// Replaces the interpreter in `slot` (one that crashed or would not stop) with a
    /// fresh one; when that cannot start, the slot stays empty for the next call to try
    /// again, and `notes` tells the model.
    async fn restart(&self, slot: &mut Option<Interp>, notes: &mut Vec<String>) {
        if let Some(old) = slot.take() {
            old.kill().await;
        }
        match self.spawn().await {
            Ok(new) => *slot = Some(new),
            Err(e) => notes.push(format!("Starting a new interpreter failed: {e}.")),
        }
    }

    async fn spawn(&self) -> io::Result<Interp> {
        let interp = Interp::spawn(&self.opts).await?;
        *self.engine.lock().expect("engine lock") = Some(interp.engine.clone());
        Ok(interp)
    }

    /// Kills the interpreter (server shutdown).
    pub async fn shutdown(&self) {
        if let Some(i) = self.interp.lock().await.take() {
            i.kill().await;
        }
    }
}

/// One live interpreter.
struct Interp {
    child: tokio::process::Child,
    pid: i32,
    requests: AsyncFd<OwnedFd>,
    output: MarkedStream,
    seq: u64,
    engine: String,
}

impl Interp {
    async fn spawn(opts: &PythonOptions) -> io::Result<Interp> {
        use nix::fcntl::OFlag;
        let (req_read, req_write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let (out_read, out_write) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(io::Error::from)?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut cmd = tokio::process::Command::new(&opts.program);
        // Isolated (-I): neither the working directory nor PYTHON* variables nor the
        // user's site-packages reach the driver's own imports. It moves to the workspace
        // once its modules are loaded. The marker token travels on the request pipe, not
        // in the environment, which other processes of the user could read.
        cmd.arg("-I")
            .arg("-u")
            .arg("-c")
            .arg(DRIVER)
            .current_dir(&opts.ctl_dir)
            .env("ROLLOUT_PY_WORKDIR", &opts.workdir)
            .env("ROLLOUT_PY_ENGINE", &opts.engine)
            .env("PYTHONUNBUFFERED", "1")
            .env("MPLBACKEND", "Agg")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out_write.try_clone()?))
            .stderr(Stdio::from(out_write))
            .process_group(0)
            .kill_on_drop(true);
        let req_fd = req_read.as_raw_fd();
        // SAFETY: signal and dup2 are async-signal-safe; dup2 also clears close-on-exec on fd 3.
        unsafe {
            cmd.pre_exec(move || {
                reset_signals()?;
                if libc::dup2(req_fd, 3) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // Our copies of the child's ends go with the command: an interpreter that dies at
        // once must show as end of stream.
        let (child, pid) = super::spawn(cmd, &opts.program)?;
        drop(req_read);
        let requests = nonblocking(req_write)?;
        write_all(&requests, format!("{token}\n").as_bytes()).await?;
        let mut interp = Interp {
            child,
            pid,
            requests,
            output: MarkedStream::new(out_read, &token, MAX_RESULT)?,
            seq: 0,
            engine: String::new(),
        };
        let mut said = CappedOutput::new(8192);
        match interp
            .output
            .read_until(&mut said, 0, Instant::now() + START_TIMEOUT)
            .await?
        {
            Until::Marker(payload) => {
                let hello: serde_json::Value = serde_json::from_str(&payload).unwrap_or_default();
                interp.engine = hello["engine"].as_str().unwrap_or("cpython").to_string();
                Ok(interp)
            }
            _ => {
                interp.output.flush(&mut said);
                interp.kill().await;
                Err(io::Error::other(format!(
                    "the Python interpreter did not start: {}",
                    said.finish().0.trim()
                )))
            }
        }
    }

    async fn kill(mut self) {
        let _ = killpg(Pid::from_raw(self.pid), Signal::SIGKILL);
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(GRACE, self.child.wait()).await;
    }
}
