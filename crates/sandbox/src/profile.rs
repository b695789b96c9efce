//! Where a sandbox's start spends its time, step by step.
//!
//! A start is work in two processes: the launcher (directories, the cgroup, the
//! workspace's ownership, spawning bwrap, reading its report) and the sandbox server
//! (its own start, the shell's, the workspace's baseline). Both take their marks on the
//! same clock, `CLOCK_MONOTONIC`, which bwrap's namespaces do not change, so the server's
//! marks (sent back in its first ping, see [`crate::protocol::ServerStartup`])
//! fall into the launcher's timeline. The sandbox benchmark prints the steps; they are
//! how the start was profiled, and how a change to it is checked.

use std::time::Duration;

/// Now on `CLOCK_MONOTONIC`, in nanoseconds: comparable between processes on one host.
pub fn monotonic_ns() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a pointer to a timespec this function owns.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut t) };
    // Seconds since boot and a sub-second part: both non-negative.
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// The marks of one start: when each step ended, from the start call on.
#[derive(Debug, Clone, Default)]
pub struct StartProfile {
    origin: u64,
    marks: Vec<(&'static str, u64)>,
}

impl StartProfile {
    /// A profile whose clock starts now.
    pub fn begin() -> Self {
        StartProfile {
            origin: monotonic_ns(),
            marks: Vec::new(),
        }
    }

    /// Step `step` ended now.
    pub fn mark(&mut self, step: &'static str) {
        self.marks.push((step, monotonic_ns()));
    }

    /// Step `step` ended at `at_ns` (on [`monotonic_ns`]'s clock, another process's mark).
    pub fn mark_at(&mut self, step: &'static str, at_ns: u64) {
        if at_ns > 0 {
            self.marks.push((step, at_ns));
        }
    }

    /// Adds the marks the sandbox server reported in its first ping.
    pub fn add_server(&mut self, s: &crate::protocol::ServerStartup) {
        self.mark_at("server: exec until main", s.main_ns);
        self.mark_at("server: shell up", s.shell_ns);
        self.mark_at("server: baseline recorded", s.baseline_ns);
        self.mark_at("server: serving", s.serving_ns);
    }

    /// Each step in the order they ended, with the time since the step before (the first
    /// since the start call). Launcher and server steps interleave where they overlap.
    pub fn steps(&self) -> Vec<(&'static str, Duration)> {
        let mut marks = self.marks.clone();
        marks.sort_by_key(|&(_, at)| at);
        let mut last = self.origin;
        marks
            .into_iter()
            .map(|(name, at)| {
                let d = Duration::from_nanos(at.saturating_sub(last));
                last = last.max(at);
                (name, d)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_ordered_by_when_they_ended() {
        let mut p = StartProfile {
            origin: 100,
            marks: Vec::new(),
        };
        p.mark_at("b", 400);
        p.mark_at("a", 150);
        p.mark_at("never", 0);
        assert_eq!(
            p.steps(),
            vec![
                ("a", Duration::from_nanos(50)),
                ("b", Duration::from_nanos(250))
            ]
        );
    }
}
