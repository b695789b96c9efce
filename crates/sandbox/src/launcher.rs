//! Launchers started ahead of time: a bwrap sandbox's first process, already in a cgroup
//! of its own before the sandbox is asked for.
//!
//! Two steps of a bwrap start were the worker's own and no defence's: forking the big,
//! many-threaded worker (the steps between fork and exec need a fork, not
//! `posix_spawn`), and moving the new process into the sandbox's cgroups, which on a
//! cgroup v1 host waits for an RCU grace period on the first move after a quiet spell
//! (9–14 ms on a loaded virtual machine). A launcher does both before any start needs
//! them: a small process (`rollout-sandbox launch`, no runtime, no threads) spawned by
//! the worker, put from outside into a fresh, not yet limited cgroup
//! (`rollout-launcher-<worker pid>-<its start time>-<n>`), then waiting on a Unix
//! socket pair. A start takes one from the node's [`LauncherPool`], writes the
//! sandbox's memory and process limits into its cgroup (plain writes, not moves), and
//! sends it an [`Order`]: bwrap's program and arguments, the rlimits, the user to
//! become, and (as `SCM_RIGHTS`) the server log and the descriptors bwrap is passed.
//! The launcher sets the rlimits, places the descriptors at the numbers the
//! [`super::bwrap::Descriptors`] plan gives, becomes the sandbox's user, asks again for
//! its death signal (a change of user clears it) and execs bwrap, which so keeps the
//! launcher's pid: the label names it as the sandbox's root process. Everything bwrap
//! forks is born in the cgroup, so no `--block-fd` hold is needed.
//!
//! An unused launcher ends with the worker, however the worker ends: it asked for
//! SIGKILL when its parent ends, and a read of its socket returns end-of-file once the
//! worker's end is closed (that end is close-on-exec, so no other program holds it). A
//! launcher dropped before its order (a start that failed or was cancelled, a pool
//! closed) is killed and its cgroup removed; the cgroups of launchers whose worker was
//! killed are removed by the next pool made on the node ([`LauncherPool`]'s first
//! refill). A used launcher is replaced in the background once the start that used it
//! is done, so that making it does not slow that start.

use super::cgroup::{Cgroups, SandboxCgroup};
use super::{SandboxError, SandboxLimits};
use std::ffi::{OsStr, OsString};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, Weak};

/// The first word of every order, so a launcher never execs on a stray message.
const MAGIC: &[u8] = b"rollout-launch-1";
/// The largest order a launcher reads (bwrap's arguments are a few kilobytes).
const MAX_ORDER: usize = 256 << 10;
/// At most this many descriptors travel with an order (the log and bwrap's).
const MAX_ORDER_FDS: usize = 16;
/// The prefix of launcher cgroups (after the `rollout-` every sandbox cgroup has).
const CGROUP_PREFIX: &str = "launcher-";

/// What a launcher is told to do: exec `program` with `args` (and an empty
/// environment), with these limits, as this user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Order {
    /// The program, an absolute path (the launcher has no `PATH`).
    pub program: PathBuf,
    /// Its arguments, without the program's own name.
    pub args: Vec<OsString>,
    /// The rlimits (a 0 leaves one unset, as for a spawned sandbox).
    pub rlimits: SandboxLimits,
    /// The user and group to become (a root worker's per-sandbox user).
    pub become_user: Option<(u32, u32)>,
    /// Whether the program gets SIGKILL when the worker ends; without it, a death signal
    /// the launcher had is cleared.
    pub die_with_parent: bool,
}

/// A field of an order that cannot be sent.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OrderError {
    /// An argument holds a NUL byte, which no program's argument can.
    #[error("an argument holds a NUL byte: {0:?}")]
    Nul(OsString),
    /// The message is not an order.
    #[error("not a launcher order: {0}")]
    Malformed(&'static str),
}

impl Order {
    /// The order as sent: NUL-terminated fields, numbers in decimal.
    pub fn encode(&self) -> Result<Vec<u8>, OrderError> {
        let mut out = Vec::new();
        let mut push = |b: &[u8]| -> Result<(), OrderError> {
            if b.contains(&0) {
                return Err(OrderError::Nul(OsStr::from_bytes(b).to_os_string()));
            }
            out.extend_from_slice(b);
            out.push(0);
            Ok(())
        };
        push(MAGIC)?;
        let (uid, gid) = match self.become_user {
            Some((u, g)) => (u.to_string(), g.to_string()),
            None => (String::new(), String::new()),
        };
        push(uid.as_bytes())?;
        push(gid.as_bytes())?;
        push(if self.die_with_parent { b"1" } else { b"0" })?;
        let l = &self.rlimits;
        for n in [
            l.processes,
            l.memory_bytes,
            l.file_size_bytes,
            l.cpu_seconds,
        ] {
            push(n.to_string().as_bytes())?;
        }
        push(self.program.as_os_str().as_bytes())?;
        for a in &self.args {
            push(a.as_bytes())?;
        }
        Ok(out)
    }

    /// Reads an order [`Order::encode`] made.
    pub fn decode(bytes: &[u8]) -> Result<Order, OrderError> {
        let body = bytes
            .strip_suffix(&[0])
            .ok_or(OrderError::Malformed("unterminated"))?;
        let mut fields = body.split(|b| *b == 0);
        let mut next = || fields.next().ok_or(OrderError::Malformed("too short"));
        if next()? != MAGIC {
            return Err(OrderError::Malformed("wrong first word"));
        }
        let number = |b: &[u8]| -> Result<u64, OrderError> {
            std::str::from_utf8(b)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or(OrderError::Malformed("not a number"))
        };
        let (uid, gid) = (next()?, next()?);
        let become_user = if uid.is_empty() {
            None
        } else {
            let id = |b| {
                number(b).and_then(|n| u32::try_from(n).map_err(|_| OrderError::Malformed("id")))
            };
            Some((id(uid)?, id(gid)?))
        };
        let die_with_parent = next()? == b"1";
        let rlimits = SandboxLimits {
            processes: number(next()?)?,
            memory_bytes: number(next()?)?,
            file_size_bytes: number(next()?)?,
            cpu_seconds: number(next()?)?,
            ..SandboxLimits::default()
        };
        let program = PathBuf::from(OsStr::from_bytes(next()?));
        let args = fields
            .map(|a| OsStr::from_bytes(a).to_os_string())
            .collect();
        Ok(Order {
            program,
            args,
            rlimits,
            become_user,
            die_with_parent,
        })
    }
}

/// `program` as an absolute path: as given when it names a directory, else the first
/// match on this process's `PATH` (the launcher, which execs it, has an empty
/// environment).
pub fn resolve_program(program: &Path) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.as_os_str().as_bytes().contains(&b'/') {
        return Some(program.to_path_buf());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(program))
        .find(|p| {
            std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        })
}

// ---------------------------------------------------------------------------------
// The launcher's side.

/// Runs a launcher (`rollout-sandbox launch`): its socket is descriptor 0, `parent` the
/// worker that spawned it. Waits for one order and execs it, so it returns only when
/// the worker went away first (`Ok`: nothing to do) or the order cannot be carried out
/// (the error, which the caller prints: by then its standard error is the sandbox's
/// server log).
pub fn run(parent: i32) -> std::io::Result<()> {
    use nix::sys::signal::{SigHandler, SigSet, SigmaskHow, Signal, signal, sigprocmask};
    // A session of its own, so a signal to the worker's process group does not reach
    // the sandbox.
    nix::unistd::setsid().map_err(std::io::Error::from)?;
    if !super::lifeline::die_with(nix::unistd::Pid::from_raw(parent))? {
        return Ok(());
    }
    // The Rust runtime ignores SIGPIPE; what bwrap starts must find it as programs
    // expect it, as a child the worker spawns would.
    // SAFETY: restoring a default disposition installs no handler.
    unsafe { signal(Signal::SIGPIPE, SigHandler::SigDfl) }.map_err(std::io::Error::from)?;
    sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
        .map_err(std::io::Error::from)?;
    let Some((bytes, fds)) = receive(0)? else {
        return Ok(());
    };
    let order = Order::decode(&bytes).map_err(std::io::Error::other)?;
    let mut fds = fds.into_iter();
    let log = fds
        .next()
        .ok_or_else(|| std::io::Error::other("the order came without its log"))?;
    carry_out(&order, &log, &fds.collect::<Vec<_>>(), parent)
}

/// Reads one message and its descriptors (close-on-exec) from `sock`; `None` at
/// end-of-file.
fn receive(sock: RawFd) -> std::io::Result<Option<(Vec<u8>, Vec<OwnedFd>)>> {
    use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
    use std::os::fd::FromRawFd;
    let mut buf = vec![0u8; MAX_ORDER];
    let mut space = nix::cmsg_space!([RawFd; MAX_ORDER_FDS]);
    loop {
        let mut iov = [std::io::IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(
            sock,
            &mut iov,
            Some(space.as_mut_slice()),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        };
        let mut fds = Vec::new();
        for c in msg.cmsgs().map_err(std::io::Error::from)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                // SAFETY: the kernel just installed these descriptors for this process.
                fds.extend(
                    raw.into_iter()
                        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                );
            }
        }
        if msg
            .flags
            .intersects(MsgFlags::MSG_TRUNC | MsgFlags::MSG_CTRUNC)
        {
            return Err(std::io::Error::other("the order was cut short"));
        }
        let n = msg.bytes;
        if n == 0 && fds.is_empty() {
            return Ok(None);
        }
        buf.truncate(n);
        return Ok(Some((buf, fds)));
    }
}

/// Sets up this process as `order` says, with `log` as its standard output and error
/// and `pass` at [`super::FIRST_PASSED_FD`] onwards, and execs the program. Returns only
/// on failure.
fn carry_out(order: &Order, log: &OwnedFd, pass: &[OwnedFd], parent: i32) -> std::io::Result<()> {
    let io = std::io::Error::from;
    // Replaces descriptor `target` with a copy of `fd` (not close-on-exec).
    let place = |fd: RawFd, target: RawFd| -> std::io::Result<()> {
        // SAFETY: dup2 on descriptors this process owns; what held `target` (nothing this
        // process still needs) is replaced on purpose.
        if unsafe { libc::dup2(fd, target) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    };
    // The socket (descriptor 0) goes: nothing is read from it again.
    let null = nix::fcntl::open(
        "/dev/null",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(io)?;
    place(null.as_raw_fd(), 0)?;
    place(log.as_raw_fd(), 1)?;
    place(log.as_raw_fd(), 2)?;
    super::apply_rlimits(&order.rlimits)?;
    // Out of the way of the targets first, so a source numbered like a target is not
    // overwritten before it is copied; then into place.
    let high: Vec<OwnedFd> = pass
        .iter()
        .map(|fd| {
            nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_DUPFD_CLOEXEC(64))
                .map(|raw| {
                    use std::os::fd::FromRawFd;
                    // SAFETY: fcntl just made this descriptor.
                    unsafe { OwnedFd::from_raw_fd(raw) }
                })
                .map_err(io)
        })
        .collect::<Result<_, _>>()?;
    for (target, fd) in (super::FIRST_PASSED_FD..).zip(&high) {
        place(fd.as_raw_fd(), target)?;
    }
    if let Some((uid, gid)) = order.become_user {
        // SAFETY: plain system calls on this single-threaded process.
        let failed = unsafe {
            libc::setgroups(0, std::ptr::null()) != 0
                || libc::setresgid(gid, gid, gid) != 0
                || libc::setresuid(uid, uid, uid) != 0
        };
        if failed {
            return Err(std::io::Error::last_os_error());
        }
    }
    if order.die_with_parent {
        if !super::lifeline::die_with(nix::unistd::Pid::from_raw(parent))? {
            return Err(std::io::Error::other(
                "the worker ended before the sandbox started",
            ));
        }
    } else {
        // A sandbox that outlives its worker (another stage's work on this node).
        nix::sys::prctl::set_pdeathsig(None).map_err(io)?;
    }
    let c = |s: &OsStr| std::ffi::CString::new(s.as_bytes()).map_err(std::io::Error::other);
    let program = c(order.program.as_os_str())?;
    let mut argv = vec![program.clone()];
    for a in &order.args {
        argv.push(c(a)?);
    }
    let env: [&std::ffi::CStr; 0] = [];
    let e = nix::unistd::execve(&program, &argv, &env).unwrap_err();
    Err(std::io::Error::new(
        std::io::Error::from(e).kind(),
        format!("cannot run {}: {e}", order.program.display()),
    ))
}

// ---------------------------------------------------------------------------------
// The worker's side.

/// Where a launcher's cgroup is while it is being made: the maker puts it here, and a
/// launcher dropped first marks it abandoned, so whichever comes second removes it.
#[derive(Default)]
struct CgroupSlot {
    cgroup: Option<SandboxCgroup>,
    abandoned: bool,
}

/// A launcher waiting for its order. Dropped without [`Launcher::exec`], it is killed
/// and its cgroup removed.
pub struct Launcher {
    child: Option<tokio::process::Child>,
    pid: i32,
    sock: OwnedFd,
    slot: Arc<Mutex<CgroupSlot>>,
}

impl std::fmt::Debug for Launcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Launcher")
            .field("pid", &self.pid)
            .field("cgroup", &self.cgroup())
            .finish()
    }
}

impl Launcher {
    /// Spawns a launcher from `bin` (`rollout-sandbox`) and, where `cgroups` are
    /// enforced, moves it into a fresh cgroup of its own named `name` (no limits yet).
    pub async fn spawn(
        bin: &Path,
        cgroups: &Cgroups,
        name: &str,
    ) -> Result<Launcher, SandboxError> {
        use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
        let (mine, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(std::io::Error::from)?;
        // No steps between fork and exec: the launcher takes its own session and death
        // signal, so this can be a `posix_spawn`, cheap even for a big worker.
        let mut cmd = tokio::process::Command::new(bin);
        cmd.arg("launch")
            .arg("--parent")
            .arg(nix::unistd::getpid().as_raw().to_string())
            .env_clear()
            .stdin(std::process::Stdio::from(theirs))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null());
        let child = cmd.spawn().map_err(|e| SandboxError::Start {
            backend: "bwrap",
            message: format!("cannot run the launcher {}: {e}", bin.display()),
        })?;
        let pid = super::server::child_pid(&child);
        let launcher = Launcher {
            child: Some(child),
            pid,
            sock: mine,
            slot: Arc::default(),
        };
        if cgroups.enforced() {
            let (slot, cgroups, name) = (launcher.slot.clone(), cgroups.clone(), name.to_string());
            tokio::task::spawn_blocking(move || -> Result<(), SandboxError> {
                let unlimited = SandboxLimits {
                    processes: 0,
                    memory_bytes: 0,
                    ..SandboxLimits::default()
                };
                let Some(cg) = cgroups.create(&name, &unlimited)? else {
                    return Ok(());
                };
                {
                    let mut s = slot.lock().expect("launcher cgroup lock");
                    if s.abandoned {
                        drop(s);
                        cg.remove();
                        return Ok(());
                    }
                    s.cgroup = Some(cg.clone());
                }
                cg.join(&[pid]).map_err(|e| SandboxError::Start {
                    backend: "bwrap",
                    message: format!("cannot put the launcher in its cgroup: {e}"),
                })
            })
            .await
            .map_err(|e| SandboxError::Io(std::io::Error::other(e)))??;
        }
        Ok(launcher)
    }

    /// The launcher's pid, which the sandbox's root process keeps.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// The cgroup it is in, if the node gives sandboxes cgroups.
    pub fn cgroup(&self) -> Option<SandboxCgroup> {
        self.slot
            .lock()
            .expect("launcher cgroup lock")
            .cgroup
            .clone()
    }

    /// Whether it has ended (killed, or its worker's end of the socket closed).
    fn ended(&mut self) -> bool {
        self.child
            .as_mut()
            .is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// Sends `order` with `log` (its standard output and error) and `pass` (the
    /// descriptors it places from [`super::FIRST_PASSED_FD`] on). The launcher then
    /// becomes the program; its process, returned, and its cgroup are the caller's,
    /// who must already have recorded both in the sandbox's label.
    pub fn exec(
        mut self,
        order: &Order,
        log: &OwnedFd,
        pass: &[OwnedFd],
    ) -> Result<tokio::process::Child, SandboxError> {
        use nix::sys::socket::{ControlMessage, MsgFlags, sendmsg};
        let bytes = order
            .encode()
            .map_err(|e| SandboxError::Config(e.to_string()))?;
        if bytes.len() > MAX_ORDER || pass.len() + 1 > MAX_ORDER_FDS {
            return Err(SandboxError::Config(
                "the sandbox's arguments are too long for its launcher".into(),
            ));
        }
        let mut raw = vec![log.as_raw_fd()];
        raw.extend(pass.iter().map(AsRawFd::as_raw_fd));
        let iov = [std::io::IoSlice::new(&bytes)];
        let cmsg = [ControlMessage::ScmRights(&raw)];
        loop {
            match sendmsg::<()>(
                self.sock.as_raw_fd(),
                &iov,
                &cmsg,
                MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
                None,
            ) {
                Ok(_) => break,
                Err(nix::errno::Errno::EINTR) => continue,
                Err(e) => {
                    return Err(SandboxError::Start {
                        backend: "bwrap",
                        message: format!("cannot reach the sandbox's launcher: {e}"),
                    });
                }
            }
        }
        // From here the label's owner ends it: nothing of it is killed on drop.
        self.slot.lock().expect("launcher cgroup lock").cgroup = None;
        Ok(self.child.take().expect("a launcher is used once"))
    }
}

impl Drop for Launcher {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            let _ = child.start_kill();
        }
        let cgroup = {
            let mut s = self.slot.lock().expect("launcher cgroup lock");
            s.abandoned = true;
            s.cgroup.take()
        };
        if let Some(cg) = cgroup {
            cg.remove();
        }
    }
}

/// A node's launchers made ahead of time (see the module documentation): up to `depth`
/// ready at once, none before the first bwrap start asks for one (which names the
/// `rollout-sandbox` binary). Depth 0 turns launchers off: every start spawns bwrap
/// itself and moves it into its cgroup while bwrap waits (see [`super::Hold`]).
///
/// The pool is shared by the clones of a runtime; when the last goes, or at
/// [`LauncherPool::close`], its launchers are killed and their cgroups removed.
#[derive(Clone)]
pub struct LauncherPool {
    inner: Arc<PoolInner>,
}

struct PoolInner {
    depth: usize,
    /// `launcher-<pid>-<start time>` of this process: names its launchers' cgroups.
    tag: String,
    state: Mutex<PoolState>,
}

#[derive(Default)]
struct PoolState {
    ready: Vec<Launcher>,
    /// Launchers being made.
    filling: usize,
    /// Set by [`LauncherPool::close`].
    closed: bool,
    /// The cgroups dead workers' launchers left have been looked for.
    swept: bool,
    /// Starts that found no launcher ready.
    misses: u64,
}

impl std::fmt::Debug for LauncherPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.inner.state.lock().expect("launcher pool lock");
        f.debug_struct("LauncherPool")
            .field("depth", &self.inner.depth)
            .field("ready", &st.ready.len())
            .field("filling", &st.filling)
            .finish()
    }
}

impl Default for LauncherPool {
    fn default() -> Self {
        LauncherPool::new(rollout_core::config::SandboxSettings::default().launcher_pool)
    }
}

impl LauncherPool {
    /// A pool of up to `depth` launchers (0: off).
    pub fn new(depth: usize) -> Self {
        let me = std::process::id();
        let start = super::label::process_start(i32::try_from(me).unwrap_or(-1)).unwrap_or(0);
        LauncherPool {
            inner: Arc::new(PoolInner {
                depth,
                tag: format!("{CGROUP_PREFIX}{me}-{start}"),
                state: Mutex::default(),
            }),
        }
    }

    /// How many launchers it keeps ready (0: off).
    pub fn depth(&self) -> usize {
        self.inner.depth
    }

    /// How many are ready now.
    pub fn ready(&self) -> usize {
        self.inner
            .state
            .lock()
            .expect("launcher pool lock")
            .ready
            .len()
    }

    /// How many starts found none ready (and spawned one on their path).
    pub fn misses(&self) -> u64 {
        self.inner.state.lock().expect("launcher pool lock").misses
    }

    /// The launchers ready now: each one's pid and cgroup directories (none without
    /// cgroups), for a check that what the pool holds goes when it should.
    pub fn ready_launchers(&self) -> Vec<(i32, Vec<PathBuf>)> {
        let st = self.inner.state.lock().expect("launcher pool lock");
        st.ready
            .iter()
            .map(|l| (l.pid(), l.cgroup().map(|c| c.dirs).unwrap_or_default()))
            .collect()
    }

    /// How many launchers are being made now.
    pub fn filling(&self) -> usize {
        self.inner.state.lock().expect("launcher pool lock").filling
    }

    /// A launcher for a start: one made ahead of time, or (none ready) one made now.
    /// `None` when the pool is off or closed. The pool is not topped up here: the start
    /// calls [`LauncherPool::refill`] once it is done, so that making the next launcher
    /// does not compete with it.
    pub async fn take(
        &self,
        bin: &Path,
        cgroups: &Cgroups,
    ) -> Option<Result<Launcher, SandboxError>> {
        if self.inner.depth == 0 {
            return None;
        }
        let (ready, name) = {
            let mut st = self.inner.state.lock().expect("launcher pool lock");
            if st.closed {
                return None;
            }
            let mut found = None;
            while let Some(mut l) = st.ready.pop() {
                if !l.ended() {
                    found = Some(l);
                    break;
                }
            }
            if found.is_none() {
                st.misses += 1;
            }
            (found, self.next_name())
        };
        Some(match ready {
            Some(l) => Ok(l),
            None => Launcher::spawn(bin, cgroups, &name).await,
        })
    }

    /// A name for the next launcher's cgroup.
    fn next_name(&self) -> String {
        // Numbered across every pool of this process (a test makes many), so no two
        // launchers ever share a cgroup: removing one's would kill the other.
        static MADE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = MADE.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        format!("{}-{n}", self.inner.tag)
    }

    /// Makes launchers from `bin` in the background until `depth` are ready or being
    /// made, unless the pool is off or closed (or there is no runtime to make them on).
    pub fn refill(&self, bin: &Path, cgroups: &Cgroups) {
        if self.inner.depth == 0 || tokio::runtime::Handle::try_current().is_err() {
            return;
        }
        let mut st = self.inner.state.lock().expect("launcher pool lock");
        if st.closed {
            return;
        }
        if !st.swept && cgroups.enforced() {
            st.swept = true;
            let cgroups = cgroups.clone();
            tokio::task::spawn_blocking(move || remove_dead_launcher_cgroups(&cgroups));
        }
        while st.ready.len() + st.filling < self.inner.depth {
            st.filling += 1;
            let name = self.next_name();
            let pool: Weak<PoolInner> = Arc::downgrade(&self.inner);
            let (bin, cgroups) = (bin.to_path_buf(), cgroups.clone());
            // Spawned from a runtime thread, which lives as long as the runtime: a
            // parent-death signal follows the thread that spawned the process.
            tokio::spawn(async move {
                let made = Launcher::spawn(&bin, &cgroups, &name).await;
                // Gone: the launcher is dropped, so killed.
                let Some(pool) = pool.upgrade() else { return };
                let unused = {
                    let mut st = pool.state.lock().expect("launcher pool lock");
                    st.filling -= 1;
                    match made {
                        Ok(l) if !st.closed => {
                            st.ready.push(l);
                            None
                        }
                        Ok(l) => Some(l),
                        Err(e) => {
                            tracing::warn!(error = %e, "cannot make a sandbox launcher ahead of time");
                            None
                        }
                    }
                };
                drop(unused);
            });
        }
    }

    /// Kills the launchers ready and removes their cgroups; no more are made (those
    /// being made are killed when they are ready). For a node that is stopping.
    pub fn close(&self) {
        let ready = {
            let mut st = self.inner.state.lock().expect("launcher pool lock");
            st.closed = true;
            std::mem::take(&mut st.ready)
        };
        drop(ready);
    }
}

/// Removes the launcher cgroups whose worker (by pid and start time) is gone; one still
/// holding processes (a sandbox that outlives its worker) cannot be removed and stays.
fn remove_dead_launcher_cgroups(cgroups: &Cgroups) {
    let parents: Vec<&Path> = match cgroups {
        Cgroups::V2 { parent } => vec![parent],
        Cgroups::V1 { memory, pids } => vec![memory, pids],
        Cgroups::Unavailable { .. } => return,
    };
    let prefix = format!("rollout-{CGROUP_PREFIX}");
    for parent in parents {
        let Ok(entries) = std::fs::read_dir(parent) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(rest) = name.strip_prefix(&prefix) else {
                continue;
            };
            let mut parts = rest.split('-');
            let owner = parts.next().and_then(|p| p.parse::<i32>().ok());
            let start = parts.next().and_then(|s| s.parse::<u64>().ok());
            let (Some(owner), Some(start)) = (owner, start) else {
                continue;
            };
            if super::label::process_start(owner) != Some(start) {
                // Fails on a cgroup with processes in it, which is what should happen.
                let _ = std::fs::remove_dir(e.path());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_order_reads_back_as_sent() {
        let rlimits = SandboxLimits {
            processes: 7,
            cpu_seconds: 0,
            ..SandboxLimits::default()
        };
        let order = Order {
            program: PathBuf::from("/usr/bin/bwrap"),
            args: vec!["--ro-bind".into(), "/usr".into(), "".into(), "é x".into()],
            rlimits,
            become_user: Some((1_000_000_007, 65534)),
            die_with_parent: true,
        };
        let back = Order::decode(&order.encode().unwrap()).unwrap();
        assert_eq!(back.program, order.program);
        assert_eq!(back.args, order.args);
        assert_eq!(back.become_user, order.become_user);
        assert!(back.die_with_parent);
        assert_eq!(
            (
                back.rlimits.processes,
                back.rlimits.memory_bytes,
                back.rlimits.cpu_seconds
            ),
            (7, rlimits.memory_bytes, 0)
        );
        let plain = Order {
            become_user: None,
            die_with_parent: false,
            ..order
        };
        let back = Order::decode(&plain.encode().unwrap()).unwrap();
        assert_eq!((back.become_user, back.die_with_parent), (None, false));
    }

    #[test]
    fn an_argument_with_a_nul_is_refused_and_a_stray_message_is_not_an_order() {
        let order = Order {
            program: PathBuf::from("/bin/true"),
            args: vec![std::os::unix::ffi::OsStringExt::from_vec(b"a\0b".to_vec())],
            rlimits: SandboxLimits::default(),
            become_user: None,
            die_with_parent: false,
        };
        assert!(matches!(order.encode(), Err(OrderError::Nul(_))));
        assert!(Order::decode(b"hello\0").is_err());
        assert!(Order::decode(b"").is_err());
    }

    #[test]
    fn a_program_is_found_on_the_path_unless_it_names_a_directory() {
        assert_eq!(
            resolve_program(Path::new("./x")),
            Some(PathBuf::from("./x"))
        );
        let sh = resolve_program(Path::new("sh")).expect("sh is on the PATH");
        assert!(sh.is_absolute(), "{}", sh.display());
        assert_eq!(resolve_program(Path::new("no-such-program-here")), None);
    }
}
