//! The `exec` tool: one command as a process of its own, its status from the kernel.
//!
//! The persistent shell learns a command's status from a marker printed into its
//! terminal; that is fine for the agent's own tools, but a score must not depend on
//! anything a process in the sandbox can print. `exec` starts `bash -c <command>` in a
//! process group of its own with standard input closed and stdout and stderr on one pipe,
//! and takes the status from `waitpid`. At the end (exit or timeout) the whole group is
//! killed, so nothing the command left behind outlives the call.

use super::output::{CappedOutput, DEFAULT_MAX_OUTPUT};
use super::stream::{nonblocking, read, reset_signals};
use crate::domain::duration_us;
use crate::sandbox::protocol::{ExecArgs, ExecResult};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
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
        .process_group(0)
        .kill_on_drop(true);
    if let Some(env) = &start.env {
        cmd.env_clear().envs(env);
    }
    // SAFETY: only async-signal-safe calls (signal) between fork and exec.
    unsafe {
        cmd.pre_exec(reset_signals);
    }
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
    let (output, omitted_bytes) = out.finish();
    Ok(ExecResult {
        output,
        exit_code: status.and_then(|s| s.code()),
        signal: status.and_then(|s| s.signal()),
        omitted_bytes,
        timed_out,
        elapsed_us: duration_us(started.elapsed()),
    })
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

    #[test]
    fn env_dumps_parse() {
        let m = parse_env(b"A=1\0B=x=y\0\0");
        assert_eq!(m["A"], "1");
        assert_eq!(m["B"], "x=y");
    }
}
