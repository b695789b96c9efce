//! The `bash` tool: one persistent interactive bash on a pseudo-terminal.
//!
//! Why a pty and not pipes: programs behave as they do for a person (line-buffered
//! output, job control, `isatty` checks), and the terminal's foreground process group
//! tells the server exactly which processes a timeout should interrupt without touching
//! the shell. Why not tmux: completion is detected from a marker the shell itself prints
//! after the command, `\x1e<session token>:<sequence>:<status>\x1e`, so the server never
//! polls a screen and a command costs one write and the reads of its own output.
//!
//! The marker is the shell's word, and the shell runs the agent's code: a `trap … DEBUG`
//! (which sees each command line before it runs, the marker's included) or a function
//! named `printf` learns the token and can print a marker of its own, so a command can
//! fake the status and the end of output its own call reports. That only misleads the
//! agent about its own step; graders never read it (they use `exec`, whose status comes
//! from the kernel).
//!
//! Each command is typed as one line (`eval '<command>'; printf marker "$?"`), or, when it
//! has several lines or is long, written to a file in the server's control directory and
//! sourced by such a line (`. file; printf marker "$?"`): the shell reads only that line
//! from the terminal, so a program that waits for input finds nothing to read and blocks
//! until the timeout interrupts it, instead of swallowing the marker. Terminal echo and
//! `\n` → `\r\n` translation are turned off, so the output is exactly what the command
//! wrote.
//!
//! After a timeout the server escalates: SIGINT to the foreground process group (or the
//! shell, when a builtin is running), then SIGKILL to that group, then a new shell; each
//! step waits a short grace for the shell to answer a fresh marker, and the result says
//! which step was needed.

use super::output::{CappedOutput, DEFAULT_MAX_OUTPUT};
use super::stream::{MarkedStream, Until, reset_signals, write_all};
use crate::protocol::{BashArgs, BashResult, Escalation};
use nix::sys::signal::{Signal, kill, killpg};
use nix::sys::termios::{self, LocalFlags, OutputFlags, SetArg};
use nix::unistd::Pid;
use rollout_core::domain::duration_us;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::sync::Mutex;

/// Output printed between calls (by background jobs) kept for the next call.
pub const BETWEEN_CALLS_KEEP: usize = 256 * 1024;
/// How long each escalation step waits for the shell to answer.
const GRACE: Duration = Duration::from_millis(1000);
/// How long a new shell may take to answer its first marker.
const START_TIMEOUT: Duration = Duration::from_secs(10);

/// How to start the shell.
#[derive(Debug, Clone)]
pub struct ShellOptions {
    /// The shell executable (`bash` from `PATH` by default).
    pub program: String,
    /// Its starting working directory: the workspace.
    pub workdir: PathBuf,
    /// A private directory for command files.
    pub ctl_dir: PathBuf,
}

/// The tool: a shell that is started once and replaced when it dies.
pub struct BashTool {
    opts: ShellOptions,
    session: Mutex<Option<Session>>,
    ready: std::sync::atomic::AtomicBool,
}

impl BashTool {
    /// Starts the shell and waits for its first marker.
    pub async fn start(opts: ShellOptions) -> io::Result<Self> {
        let session = Session::spawn(&opts).await?;
        Ok(BashTool {
            opts,
            session: Mutex::new(Some(session)),
            ready: true.into(),
        })
    }

    /// Whether a shell is up (false only after a failed restart).
    pub fn is_ready(&self) -> bool {
        self.ready.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Runs one command. Calls are serialised: there is one shell.
    pub async fn run(&self, args: &BashArgs, timeout: Duration) -> io::Result<BashResult> {
        let started = Instant::now();
        let mut guard = self.session.lock().await;
        let mut restarted_before = false;
        if guard.is_none() {
            *guard = Some(self.respawn().await?);
            restarted_before = true;
        }
        let session = guard.as_mut().expect("session present");
        let max = args.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT);
        let outcome = session.exec(&args.command, timeout, max).await;
        let (mut result, replace) = match outcome {
            Ok(r) => r,
            Err(e) => {
                // The terminal broke under us: report it and start afresh next time.
                if let Some(broken) = guard.take() {
                    broken.kill().await;
                }
                self.ready
                    .store(false, std::sync::atomic::Ordering::Relaxed);
                return Err(e);
            }
        };
        if replace {
            let old = guard.take().expect("session present");
            old.kill().await;
            match self.respawn().await {
                Ok(s) => *guard = Some(s),
                Err(e) => {
                    self.ready
                        .store(false, std::sync::atomic::Ordering::Relaxed);
                    let note = format!(
                        "{} Starting a new shell failed: {e}.",
                        result.note.unwrap_or_default()
                    );
                    result.note = Some(note.trim().to_string());
                }
            }
        }
        result.shell_restarted |= restarted_before;
        result.elapsed_us = duration_us(started.elapsed());
        Ok(result)
    }

    async fn respawn(&self) -> io::Result<Session> {
        let s = Session::spawn(&self.opts).await?;
        self.ready.store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(s)
    }

    /// Reads the terminal while no call does, forever: background jobs keep running
    /// instead of blocking on a full terminal, and what they print (the newest
    /// [`BETWEEN_CALLS_KEEP`] bytes) opens the next call's output.
    pub async fn drain_between_calls(&self) {
        loop {
            let fd = match self.session.lock().await.as_ref() {
                Some(s) => s.stream.shared_fd(),
                None => {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            // Wait for output without holding the session (a call may take it meanwhile
            // and read the output itself; then there is nothing left to drain).
            if fd.readable().await.is_err() {
                return;
            }
            let mut guard = self.session.lock().await;
            let open = match guard.as_mut() {
                Some(s) if std::sync::Arc::ptr_eq(&s.stream.shared_fd(), &fd) => s
                    .stream
                    .drain_available(BETWEEN_CALLS_KEEP)
                    .unwrap_or(false),
                // Replaced meanwhile: start over with the new shell.
                _ => true,
            };
            drop(guard);
            if !open {
                // The shell is gone; the next call finds out and replaces it.
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }

    /// Kills the shell and everything in its session (server shutdown).
    pub async fn shutdown(&self) {
        if let Some(s) = self.session.lock().await.take() {
            s.kill().await;
        }
    }
}

/// One live shell.
struct Session {
    stream: MarkedStream,
    child: tokio::process::Child,
    pid: i32,
    token: String,
    seq: u64,
    cmd_file: PathBuf,
    workdir: PathBuf,
}

impl Session {
    async fn spawn(opts: &ShellOptions) -> io::Result<Session> {
        std::fs::create_dir_all(&opts.ctl_dir)?;
        let winsize = nix::pty::Winsize {
            ws_row: 50,
            ws_col: 200,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = nix::pty::openpty(Some(&winsize), None).map_err(io::Error::from)?;
        // Neither end may leak into later children (the interpreter, the agent's
        // programs): a leaked slave keeps the terminal open after the shell exits.
        for fd in [&pty.master, &pty.slave] {
            nix::fcntl::fcntl(
                fd,
                nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
            )
            .map_err(io::Error::from)?;
        }
        let mut t = termios::tcgetattr(&pty.slave).map_err(io::Error::from)?;
        t.local_flags.remove(
            LocalFlags::ECHO
                | LocalFlags::ECHOE
                | LocalFlags::ECHOK
                | LocalFlags::ECHONL
                | LocalFlags::ECHOCTL,
        );
        t.output_flags.remove(OutputFlags::ONLCR);
        termios::tcsetattr(&pty.slave, SetArg::TCSANOW, &t).map_err(io::Error::from)?;

        let mut cmd = tokio::process::Command::new(&opts.program);
        cmd.args(["--noprofile", "--norc", "--noediting", "-i"])
            .current_dir(&opts.workdir)
            .env("TERM", "dumb")
            .env("PAGER", "cat")
            .env("GIT_PAGER", "cat")
            .env("HISTFILE", "/dev/null")
            .env("PS1", "")
            .env("PS2", "")
            .env_remove("PROMPT_COMMAND")
            .stdin(Stdio::from(pty.slave.try_clone()?))
            .stdout(Stdio::from(pty.slave.try_clone()?))
            .stderr(Stdio::from(pty.slave))
            .kill_on_drop(true);
        // SAFETY: only async-signal-safe calls (signal, setsid, ioctl) between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                reset_signals()?;
                nix::unistd::setsid().map_err(io::Error::from)?;
                if libc::ioctl(0, libc::TIOCSCTTY, 0) != 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        // The command's copies of the slave go with it, so a shell that dies at once
        // shows as end of stream instead of a silent terminal.
        let (child, pid) = super::spawn(cmd, &opts.program)?;
        let token = uuid::Uuid::new_v4().simple().to_string();
        let mut session = Session {
            stream: MarkedStream::new(pty.master, &token, 64)?,
            child,
            pid,
            token,
            seq: 0,
            cmd_file: opts.ctl_dir.join("cmd"),
            workdir: opts.workdir.clone(),
        };
        let hello = format!(
            " set +o history; unset PROMPT_COMMAND; PS1=''; PS2=''; {}\n",
            session.marker_command(0)
        );
        write_all(session.stream.fd(), hello.as_bytes()).await?;
        let mut said = CappedOutput::new(4096);
        match session
            .stream
            .read_until(&mut said, 0, Instant::now() + START_TIMEOUT)
            .await?
        {
            Until::Marker(_) => Ok(session),
            Until::Eof | Until::Deadline => {
                session.stream.flush(&mut said);
                session.kill().await;
                Err(io::Error::other(format!(
                    "the shell did not start: {}",
                    said.finish().0.trim()
                )))
            }
        }
    }

    /// The shell code that prints the end marker for call `seq` with the last status,
    /// then clears the prompts again (a sourced `activate` script sets PS1, which would
    /// otherwise be printed after every marker and open the next call's output).
    fn marker_command(&self, seq: u64) -> String {
        format!(
            "printf '\\036%s:%s:%s\\036' {} {seq} \"$?\"; PS1= PS2=; unset PROMPT_COMMAND",
            self.token
        )
    }

    /// Runs `command`; the flag says whether the shell must be replaced afterwards.
    async fn exec(
        &mut self,
        command: &str,
        timeout: Duration,
        max: usize,
    ) -> io::Result<(BashResult, bool)> {
        self.seq += 1;
        let seq = self.seq;
        let deadline = Instant::now() + timeout;
        let line = match inline(command) {
            // A short one-line command travels in the typed line itself (no file to
            // write and read back), quoted so nothing in it can reach the marker.
            Some(quoted) => format!(" eval {quoted}; {}\n", self.marker_command(seq)),
            None => {
                std::fs::write(&self.cmd_file, command)?;
                format!(
                    " . '{}'; {}\n",
                    self.cmd_file.display(),
                    self.marker_command(seq)
                )
            }
        };
        let mut out = CappedOutput::new(max);
        write_all(self.stream.fd(), line.as_bytes()).await?;
        let first = self.read(&mut out, seq, deadline).await?;
        let mut result = BashResult {
            output: String::new(),
            exit_code: None,
            omitted_bytes: 0,
            timed_out: false,
            escalation: None,
            shell_restarted: false,
            note: None,
            elapsed_us: 0,
        };
        let mut replace = false;
        match first {
            Until::Marker(status) => result.exit_code = status.parse().ok(),
            Until::Eof => {
                let status = super::exit_code(&mut self.child, GRACE).await;
                result.shell_restarted = true;
                replace = true;
                result.note = Some(format!(
                    "The shell exited{}; a new shell was started in {}, so variables, functions and the working directory were reset.",
                    status
                        .map(|s| format!(" with status {s}"))
                        .unwrap_or_default(),
                    self.workdir.display()
                ));
                result.exit_code = status;
            }
            Until::Deadline => {
                result.timed_out = true;
                let (escalation, status) = self.escalate(&mut out, seq).await?;
                result.escalation = Some(escalation);
                result.exit_code = status;
                let secs = timeout.as_secs_f64();
                result.note = Some(match escalation {
                    Escalation::Interrupted => {
                        format!("The command timed out after {secs}s and was interrupted (SIGINT).")
                    }
                    Escalation::Killed => format!(
                        "The command timed out after {secs}s, ignored SIGINT and was killed (SIGKILL)."
                    ),
                    Escalation::Restarted => {
                        replace = true;
                        result.shell_restarted = true;
                        format!(
                            "The command timed out after {secs}s and could not be stopped, so the shell was replaced: variables, functions, background jobs and the working directory were reset to a fresh shell in {}.",
                            self.workdir.display()
                        )
                    }
                });
            }
        }
        self.stream.flush(&mut out);
        let (text, omitted) = out.finish();
        result.output = text;
        result.omitted_bytes = omitted;
        Ok((result, replace))
    }

    /// Interrupt, then kill, then give up on the shell.
    async fn escalate(
        &mut self,
        out: &mut CappedOutput,
        seq: u64,
    ) -> io::Result<(Escalation, Option<i32>)> {
        for step in [Escalation::Interrupted, Escalation::Killed] {
            if !self.alive() {
                return Ok((Escalation::Restarted, None));
            }
            let fg = self.foreground();
            let shell_busy = fg.is_none_or(|g| g == self.pid);
            let signal = match step {
                Escalation::Interrupted => Signal::SIGINT,
                _ => Signal::SIGKILL,
            };
            if shell_busy && signal == Signal::SIGKILL {
                // A builtin loop that ignores SIGINT cannot be killed without the shell.
                break;
            }
            if shell_busy {
                let _ = kill(Pid::from_raw(self.pid), signal);
            } else if let Some(group) = fg {
                let _ = killpg(Pid::from_raw(group), signal);
            }
            let deadline = Instant::now() + GRACE;
            loop {
                // Wait for the shell to take the terminal back, reading output meanwhile
                // (the command's own marker may still come if it handled the signal).
                match self.wait_for_shell(out, seq, deadline).await? {
                    Some(Until::Marker(status)) => return Ok((step, status.parse().ok())),
                    Some(Until::Eof) => return Ok((Escalation::Restarted, None)),
                    Some(Until::Deadline) => break,
                    None => {}
                }
                // The shell has the terminal: ask it for a marker. A shell still
                // unwinding from the signal may discard what it had read, so ask again
                // until the grace runs out (late answers are dropped as stale).
                self.seq += 1;
                let sync = format!(" {}\n", self.marker_command(self.seq));
                write_all(self.stream.fd(), sync.as_bytes()).await?;
                let retry = (Instant::now() + Duration::from_millis(100)).min(deadline);
                match self.read(out, seq, retry).await? {
                    Until::Marker(status) => return Ok((step, status.parse().ok())),
                    Until::Eof => return Ok((Escalation::Restarted, None)),
                    Until::Deadline if Instant::now() >= deadline => break,
                    Until::Deadline => {}
                }
            }
        }
        Ok((Escalation::Restarted, None))
    }

    /// Reads until the shell owns the terminal's foreground again (`None`) or a marker
    /// or end of stream arrives.
    async fn wait_for_shell(
        &mut self,
        out: &mut CappedOutput,
        seq: u64,
        deadline: Instant,
    ) -> io::Result<Option<Until>> {
        loop {
            if self.foreground().is_none_or(|g| g == self.pid) {
                return Ok(None);
            }
            if Instant::now() >= deadline {
                return Ok(Some(Until::Deadline));
            }
            let step = (Instant::now() + Duration::from_millis(5)).min(deadline);
            match self.read(out, seq, step).await? {
                Until::Deadline => {}
                other => return Ok(Some(other)),
            }
        }
    }

    /// The terminal's foreground process group; `None` when there is none (the kernel
    /// reports 0 once the shell, the session leader, is gone).
    fn foreground(&self) -> Option<i32> {
        nix::unistd::tcgetpgrp(self.stream.fd().get_ref())
            .ok()
            .map(|p| p.as_raw())
            .filter(|&g| g > 1)
    }

    /// Whether the shell process is still running.
    fn alive(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Reads towards a marker like [`MarkedStream::read_until`], but also notices the
    /// shell exiting: a background job may hold the terminal open, so its end of stream
    /// would never come.
    async fn read(
        &mut self,
        out: &mut CappedOutput,
        seq: u64,
        deadline: Instant,
    ) -> io::Result<Until> {
        self.stream
            .read_until_exit(&mut self.child, out, seq, deadline)
            .await
    }

    /// Kills the shell and every process still in its session.
    async fn kill(mut self) {
        kill_session(self.pid);
        let _ = self.child.start_kill();
        let _ = tokio::time::timeout(GRACE, self.child.wait()).await;
    }
}

/// SIGKILLs every process whose session id is `sid` (the shell is its session's leader,
/// so this is the shell, its jobs and their children, but nothing that called `setsid`).
pub fn kill_session(sid: i32) {
    if sid <= 0 {
        return;
    }
    for row in crate::label::process_table() {
        if row.session == sid {
            let _ = kill(Pid::from_raw(row.pid), Signal::SIGKILL);
        }
    }
}

/// The longest typed line: the terminal's line discipline holds at most 4095 bytes.
const MAX_INLINE: usize = 2048;

/// `command` single-quoted for the shell, if it can be typed on one line: no newline or
/// other control character (the terminal would act on them) and short enough.
fn inline(command: &str) -> Option<String> {
    if command.len() > MAX_INLINE / 2 || command.chars().any(|c| c.is_control() && c != '\t') {
        return None;
    }
    let quoted = format!("'{}'", command.replace('\'', r"'\''"));
    (quoted.len() <= MAX_INLINE).then_some(quoted)
}

#[cfg(test)]
mod tests {
    use super::inline;

    #[test]
    fn only_short_single_lines_are_typed_inline() {
        assert_eq!(inline("echo hi").as_deref(), Some("'echo hi'"));
        assert_eq!(inline("echo 'a b'").as_deref(), Some(r"'echo '\''a b'\'''"));
        assert_eq!(inline("echo a\nb"), None);
        assert_eq!(inline("printf '\x03'"), None);
        assert_eq!(inline(&"x".repeat(5000)), None);
    }
}
