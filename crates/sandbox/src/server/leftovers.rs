//! Ending what an `exec` command left behind, wherever it went.
//!
//! Killing the command's process group at its end misses a process that left the group:
//! one that called `setsid` (or `setsid cmd &`, a daemon's double fork) and was
//! re-parented to the namespace's init when its parent exited. A code grader's case
//! could then still be running while the next case runs, and change what it sees.
//!
//! Where the server has the sandbox's PID namespace to itself (bwrap), every process in
//! `/proc` is the sandbox's, and the tree tells them apart: the server and what descends
//! from it (the persistent shell, the Python driver, git, a call still running), and the
//! sessions those lead, are the tools'; a process that is neither, and was not there
//! when the command started (a daemon a setup command started stays), is one the
//! command left behind. Those are stopped (so none forks away while the table is read
//! again), then killed, and the call returns once they are gone.
//!
//! A process a concurrent `bash` or `python` call detached while the command ran is
//! indistinguishable from the command's own and goes too; the stages never run those
//! beside an `exec`.

use crate::label::{ProcessRow, is_zombie, process_table};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

/// How long the call waits for the killed processes to be gone.
const GONE_WITHIN: Duration = Duration::from_secs(5);
/// At most this many passes find processes forked while the others were being stopped.
const PASSES: usize = 64;

/// The sandbox's processes at one moment, by pid and start time (a reused pid is another
/// process).
#[derive(Debug, Clone, Default)]
pub struct Snapshot(HashSet<(i32, u64)>);

impl Snapshot {
    /// The processes running now.
    pub fn now() -> Snapshot {
        Snapshot(process_table().iter().map(|r| (r.pid, r.start)).collect())
    }

    fn has(&self, r: &ProcessRow) -> bool {
        self.0.contains(&(r.pid, r.start))
    }
}

/// Kills every process that is not the tools' and was not running at `before`, and
/// waits (a few seconds at most) until they are gone.
pub async fn end(before: &Snapshot) {
    let server = i32::try_from(std::process::id()).unwrap_or(i32::MAX);
    let mut stopped: Vec<i32> = Vec::new();
    for _ in 0..PASSES {
        let new: Vec<i32> = left_behind(&process_table(), server, before)
            .into_iter()
            .filter(|p| !stopped.contains(p))
            .collect();
        if new.is_empty() {
            break;
        }
        for p in &new {
            let _ = kill(Pid::from_raw(*p), Signal::SIGSTOP);
        }
        stopped.extend(new);
    }
    for p in &stopped {
        let _ = kill(Pid::from_raw(*p), Signal::SIGKILL);
    }
    if !stopped.is_empty() {
        tracing::info!(
            processes = stopped.len(),
            "ended processes the command left behind"
        );
    }
    let deadline = Instant::now() + GONE_WITHIN;
    while stopped.iter().any(|p| !is_zombie(*p)) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// The processes of `table` that `server`'s tools do not own and `before` did not have.
fn left_behind(table: &[ProcessRow], server: i32, before: &Snapshot) -> Vec<i32> {
    let parent: HashMap<i32, i32> = table.iter().map(|r| (r.pid, r.ppid)).collect();
    // Whether `pid` is the server or one of its descendants.
    let tools = |mut pid: i32| {
        for _ in 0..table.len() + 1 {
            if pid == server {
                return true;
            }
            match parent.get(&pid) {
                Some(&p) if p > 0 && p != pid => pid = p,
                _ => return false,
            }
        }
        false
    };
    table
        .iter()
        // Pid 1 is the namespace's init, which holds the sandbox up.
        .filter(|r| r.pid > 1 && r.pid != server && !before.has(r))
        .filter(|r| !tools(r.pid) && !tools(r.session))
        .map(|r| r.pid)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(pid: i32, ppid: i32, session: i32, start: u64) -> ProcessRow {
        ProcessRow {
            pid,
            ppid,
            session,
            threads: 1,
            uid: 0,
            start,
        }
    }

    #[test]
    fn only_new_processes_outside_the_tools_and_their_sessions_are_left_behind() {
        let server = 2;
        let table = [
            row(1, 0, 1, 1),   // the namespace's init
            row(2, 1, 2, 2),   // the server
            row(3, 2, 3, 3),   // the persistent shell
            row(4, 3, 3, 9),   // a job of the shell
            row(5, 1, 3, 9),   // a job of the shell whose parent exited
            row(6, 2, 2, 4),   // the Python driver
            row(7, 1, 7, 5),   // a daemon setup started: there before the command
            row(8, 1, 8, 9),   // detached by the command (its own session)
            row(9, 8, 8, 9),   // and its child
            row(10, 1, 44, 9), // the command's, its session leader gone
            row(11, 2, 11, 9), // another call still running
            row(12, 1, 11, 9), // that call's background job, orphaned
            row(13, 1, 13, 5), // pid 13 was there, but this one is newer
        ];
        let before = Snapshot([(1, 1), (2, 2), (3, 3), (6, 4), (7, 5), (13, 4)].into());
        let mut left = left_behind(&table, server, &before);
        left.sort();
        assert_eq!(left, vec![8, 9, 10, 13]);
    }
}
