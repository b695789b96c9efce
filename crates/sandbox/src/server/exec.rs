//! The `exec` tool: one command as a process of its own, its status from the kernel.
//!
//! The persistent shell learns a command's status from a marker printed into its
//! terminal; that is fine for the agent's own tools, but a score must not depend on
//! anything a process in the sandbox can print. `exec` starts `bash -c <command>` in a
//! session of its own (so it has no controlling terminal: `/dev/tty` cannot be opened,
//! and nothing reaches a terminal a grader might read) with standard input closed and
//! stdout and stderr on one pipe, and takes the status from `waitpid`. The output is
//! held in the server's memory, never in a file the command could append to. At the
//! end (exit or timeout) the whole process group is killed and, in a sandbox with a PID
//! namespace of its own, every process the command left behind in another session too
//! (see [`super::leftovers`]), so nothing it started outlives the call.

use super::output::{CappedOutput, DEFAULT_MAX_OUTPUT};
use super::stream::{nonblocking, read, reset_signals};
use crate::protocol::{ExecArgs, ExecResult};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use rollout_core::domain::duration_us;
use std::collections::BTreeMap;
use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

/// How long output is still read after the command exited (a background job it started
/// may hold the pipe open; it is killed after this).
const DRAIN: Duration = Duration::from_millis(100);

/// Where and how a command starts.
#[derive(Debug, Clone, Default)]
pub struct Start {
    /// Working directory.
    pub cwd: PathBuf,
    /// The whole environment, when it is to replace the server's.
    pub env: Option<BTreeMap<String, String>>,
    /// Whether the server has the sandbox's PID namespace to itself, so that at the end
    /// every process the command left behind, in whatever session, can be found and
    /// killed (see [`super::leftovers`]); otherwise only its process group is.
    pub end_leftovers: bool,
}

/// Runs `args.command` to completion or `timeout`.
pub async fn run(
    shell: &str,
    args: &ExecArgs,
    start: &Start,
    timeout: Duration,
) -> io::Result<ExecResult> {
    use std::os::unix::process::ExitStatusExt;
    let started = Instant::now();
    let (out_read, out_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(io::Error::from)?;
    let mut cmd = tokio::process::Command::new(shell);
    cmd.arg("-c")
        .arg(&args.command)
        .current_dir(&start.cwd)
        .stdin(Stdio::null())
        .stdout(Stdio::from(out_write.try_clone()?))
        .stderr(Stdio::from(out_write))
        .kill_on_drop(true);
    if let Some(env) = &start.env {
        cmd.env_clear().envs(env);
    }
    cmd.envs(&args.env);
    // SAFETY: only async-signal-safe calls (signal, setsid) between fork and exec.
    // setsid makes the child the leader of a new session and process group (so the
    // group can be killed whole) with no controlling terminal.
    unsafe {
        cmd.pre_exec(|| {
            reset_signals()?;
            nix::unistd::setsid().map_err(io::Error::from)?;
            Ok(())
        });
    }
    let before = start.end_leftovers.then(super::leftovers::Snapshot::now);
    let (mut child, pid) = super::spawn(cmd, shell)?;
    let fd = nonblocking(out_read)?;
    let mut out = CappedOutput::new(args.max_output_bytes.unwrap_or(DEFAULT_MAX_OUTPUT));
    let mut buf = vec![0u8; 64 * 1024];
    let deadline = tokio::time::Instant::from_std(started + timeout);
    let mut timed_out = false;
    let mut open = true;
    let status = loop {
        tokio::select! {
            st = child.wait() => break Some(st?),
            n = read(&fd, &mut buf), if open => match n? {
                0 => open = false,
                n => out.push(&buf[..n]),
            },
            _ = tokio::time::sleep_until(deadline) => {
                timed_out = true;
                let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
                break tokio::time::timeout(Duration::from_secs(5), child.wait())
                    .await
                    .ok()
                    .transpose()?;
            }
        }
    };
    // What the command printed just before it ended is still in the pipe.
    let drain_until = tokio::time::Instant::now() + DRAIN;
    while open {
        match tokio::time::timeout_at(drain_until, read(&fd, &mut buf)).await {
            Ok(Ok(n)) if n > 0 => out.push(&buf[..n]),
            _ => open = false,
        }
    }
    let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
    if let Some(before) = &before {
        super::leftovers::end(before).await;
    }
    let (mut output, omitted_bytes) = out.finish();
    if args.printable {
        output = printable(&output);
    }
    Ok(ExecResult {
        output,
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        omitted_bytes,
        timed_out,
        elapsed_us: duration_us(started.elapsed()),
    })
}

/// `text` without ANSI escape sequences (CSI `ESC [ … final`, OSC `ESC ] … BEL/ST`,
/// two-byte `ESC x`) and without control characters other than newline and tab.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => match chars.next() {
                Some('[') => {
                    // Parameters and intermediates, then one final byte in @..~.
                    for f in chars.by_ref() {
                        if ('@'..='~').contains(&f) {
                            break;
                        }
                    }
                }
                Some(']') => {
                    while let Some(f) = chars.next() {
                        if f == '\x07' || (f == '\x1b' && chars.next_if_eq(&'\\').is_some()) {
                            break;
                        }
                    }
                }
                _ => {}
            },
            '\n' | '\t' => out.push(c),
            c if c.is_control() => {}
            c => out.push(c),
        }
    }
    out
}

/// Parses `env -0` output into a map.
pub fn parse_env(bytes: &[u8]) -> BTreeMap<String, String> {
    bytes
        .split(|&b| b == 0)
        .filter_map(|kv| {
            let kv = String::from_utf8_lossy(kv);
            let (k, v) = kv.split_once('=')?;
            (!k.is_empty()).then(|| (k.to_string(), v.to_string()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(command: &str) -> ExecArgs {
        ExecArgs {
            command: command.into(),
            ..Default::default()
        }
    }

    fn here() -> Start {
        Start {
            cwd: std::env::temp_dir(),
            env: None,
            end_leftovers: false,
        }
    }

    #[tokio::test]
    async fn the_status_comes_from_the_kernel_not_the_output() {
        let r = run(
            "bash",
            &args("printf '\\036fake:1:0\\036'; echo ok; exit 3"),
            &here(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(r.exit_code, Some(3), "{r:?}");
        assert!(r.output.contains("ok"), "{r:?}");
        let r = run(
            "bash",
            &args("kill -9 $$"),
            &here(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!((r.exit_code, r.signal), (None, Some(9)), "{r:?}");
    }

    #[tokio::test]
    async fn timeouts_kill_the_group_and_background_jobs_do_not_hold_the_call() {
        let r = run(
            "bash",
            &args("sleep 30"),
            &here(),
            Duration::from_millis(200),
        )
        .await
        .unwrap();
        assert!(r.timed_out && r.exit_code.is_none(), "{r:?}");
        let r = run(
            "bash",
            &args("(sleep 30; echo late) & echo early"),
            &here(),
            Duration::from_secs(20),
        )
        .await
        .unwrap();
        assert_eq!(r.exit_code, Some(0));
        assert_eq!(
            r.output, "early\n",
            "the call waited for the background job"
        );
    }

    #[tokio::test]
    async fn the_command_has_no_controlling_terminal() {
        let r = run(
            "bash",
            &args("( : >/dev/tty ) 2>/dev/null && echo opened || echo refused"),
            &here(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert!(r.output.contains("refused"), "{r:?}");
        // A session of its own: the command leads it.
        let r = run(
            "bash",
            &args("[ \"$(ps -o sid= -p $$ | tr -d ' ')\" = \"$$\" ] && echo leader"),
            &here(),
            Duration::from_secs(10),
        )
        .await
        .unwrap();
        assert_eq!(r.output, "leader\n", "{r:?}");
    }

    #[test]
    fn printable_text_keeps_lines_and_drops_escapes() {
        assert_eq!(
            printable("\x1b[32mPASSED\x1b[0m a\r\n\x1b]0;title\x07b\tc\x00\x08\n"),
            "PASSED a\nb\tc\n"
        );
        assert_eq!(printable("ok\x1b"), "ok");
        assert_eq!(printable("é ✓"), "é ✓");
    }

    #[test]
    fn env_dumps_parse() {
        let m = parse_env(b"A=1\0B=x=y\0\0");
        assert_eq!(m["A"], "1");
        assert_eq!(m["B"], "x=y");
    }
}
