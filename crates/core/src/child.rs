//! Children that end with the process that started them.
//!
//! A SIGKILLed parent runs no destructor, so a child it started (the `nats-server` of
//! `rollout up` or of a test, a sandbox's launcher) would run on unowned, holding its
//! port, its store or its workspace. The kernel's parent-death signal closes that: the
//! child asks for SIGKILL when its parent ends, between fork and exec. This is the one
//! module of the crate that needs `unsafe` (`pre_exec`).

/// Asks for SIGKILL when this process's parent ends (`PR_SET_PDEATHSIG`), and says
/// whether `parent` is still its parent: one that ended before the request took hold
/// sends nothing, so on `false` the caller must end or give up by itself. Only `prctl`
/// and `getppid`, so it may run between fork and exec.
pub fn die_with(parent: nix::unistd::Pid) -> std::io::Result<bool> {
    nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)
        .map_err(std::io::Error::from)?;
    Ok(nix::unistd::getppid() == parent)
}

/// Has the child started by `cmd` receive SIGKILL when its parent ends, however it ends
/// ([`die_with`]): a child of `rollout up` (its `nats-server`), or of a test, must not
/// outlive it. The kernel ties this to the *thread* that starts the child, so start such
/// children from a thread that lives as long as they should (the main thread, a
/// runtime's worker thread). If the parent is already gone when the child gets there,
/// the child ends at once rather than run unowned.
pub fn die_with_parent(cmd: &mut std::process::Command) {
    use std::os::unix::process::CommandExt;
    let parent = nix::unistd::getpid();
    // SAFETY: prctl, getppid and _exit are async-signal-safe; nothing allocates.
    unsafe {
        cmd.pre_exec(move || {
            if !die_with(parent)? {
                libc::_exit(1);
            }
            Ok(())
        });
    }
}
