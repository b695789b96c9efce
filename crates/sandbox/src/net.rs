//! Outbound-only networking for `network: true` sandboxes.
//!
//! Sharing the host's network namespace would hand the agent the host's loopback (the
//! gateway, NATS, a database, none of which ask a local caller for much) and every
//! private service of the cluster. Instead such a sandbox keeps a network namespace of
//! its own, and `slirp4netns` (a user-mode network stack, rootless) connects it to the
//! outside through the host's sockets:
//!
//! - the sandbox sees `tap0` with 10.0.2.100/24, its gateway 10.0.2.2 and a DNS
//!   forwarder at 10.0.2.3 (its `/etc/resolv.conf` names only that);
//! - `--disable-host-loopback` refuses connections to the host's loopback through the
//!   gateway;
//! - `prohibit` routes in the namespace (added by the worker before the sandbox is handed
//!   over; the agent has no capability to change them) make private, link-local,
//!   carrier-grade NAT, multicast and reserved ranges, every network the host itself is
//!   on (its addresses and their subnets), and whatever `sandbox.network_deny` lists
//!   unreachable;
//! - there is no IPv6 at all.
//!
//! slirp4netns runs with its own sandboxing and seccomp filter, exits when the sandbox
//! does (it watches a pipe whose other end only bwrap holds), and is recorded in the
//! sandbox's label so a stop kills it too.

use super::SandboxError;
use rollout_core::domain::sandbox::Ipv4Net;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The sandbox's side of the user-mode network.
pub const SANDBOX_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 100);
/// The user-mode network's DNS forwarder, the only name server a sandbox is given.
pub const DNS_ADDR: Ipv4Addr = Ipv4Addr::new(10, 0, 2, 3);
/// slirp4netns's own network, which the deny routes must leave reachable.
const SLIRP_NET: Ipv4Net = Ipv4Net {
    addr: Ipv4Addr::new(10, 0, 2, 0),
    prefix: 24,
};

/// Ranges no sandbox may reach: the private, shared, link-local (cloud metadata
/// services live there), benchmarking, multicast and reserved ones.
const ALWAYS_DENIED: &[(Ipv4Addr, u8)] = &[
    (Ipv4Addr::new(0, 0, 0, 0), 8),
    (Ipv4Addr::new(10, 0, 0, 0), 8),
    (Ipv4Addr::new(100, 64, 0, 0), 10),
    (Ipv4Addr::new(169, 254, 0, 0), 16),
    (Ipv4Addr::new(172, 16, 0, 0), 12),
    (Ipv4Addr::new(192, 0, 0, 0), 24),
    (Ipv4Addr::new(192, 168, 0, 0), 16),
    (Ipv4Addr::new(198, 18, 0, 0), 15),
    (Ipv4Addr::new(224, 0, 0, 0), 4),
    (Ipv4Addr::new(240, 0, 0, 0), 4),
];

/// How this node gives sandboxes their network.
#[derive(Debug, Clone)]
pub struct NetSettings {
    /// The `slirp4netns` executable.
    pub slirp4netns: PathBuf,
    /// The `ip` executable (iproute2), run inside the namespace to add the deny routes.
    pub ip: PathBuf,
    /// Networks to deny beyond the built-in ones and the host's own.
    pub deny: Vec<Ipv4Net>,
}

impl Default for NetSettings {
    fn default() -> Self {
        NetSettings {
            slirp4netns: PathBuf::from("slirp4netns"),
            ip: PathBuf::from("ip"),
            deny: Vec::new(),
        }
    }
}

/// The networks a sandbox may not reach: the built-in list, every network of the
/// host's own interfaces (as addresses and as subnets), and `extra`.
pub fn denied(extra: &[Ipv4Net]) -> Vec<Ipv4Net> {
    let mut nets: Vec<Ipv4Net> = ALWAYS_DENIED
        .iter()
        .map(|(a, p)| Ipv4Net::new(*a, *p))
        .collect();
    if let Ok(addrs) = nix::ifaddrs::getifaddrs() {
        for ifa in addrs {
            let Some(addr) = ifa.address.as_ref().and_then(|a| a.as_sockaddr_in()) else {
                continue;
            };
            let ip = addr.ip();
            if ip.is_loopback() {
                continue;
            }
            nets.push(Ipv4Net::new(ip, 32));
            if let Some(mask) = ifa.netmask.as_ref().and_then(|m| m.as_sockaddr_in()) {
                let prefix = u8::try_from(u32::from(mask.ip()).leading_ones())
                    .expect("a u32 has at most 32 leading ones");
                nets.push(Ipv4Net::new(ip, prefix));
            }
        }
    }
    nets.extend_from_slice(extra);
    // Never the default route, and nothing within slirp4netns's own /24 (its gateway and
    // DNS forwarder); wider ones such as 10/8 are fine, the kernel prefers the
    // namespace's more specific route to the /24.
    nets.retain(|n| n.prefix > 0 && !SLIRP_NET.contains(n));
    nets.sort();
    nets.dedup();
    nets
}

/// A running slirp4netns for one sandbox.
#[derive(Debug, Clone, Copy)]
pub struct Helper {
    /// Its host pid.
    pub pid: i32,
}

/// The `resolv.conf` a networked sandbox gets.
pub fn resolv_conf() -> String {
    format!("nameserver {DNS_ADDR}\noptions edns0\n")
}

/// Waits until the user namespace of process `pid` has its uid and gid maps.
async fn wait_for_id_maps(pid: i32, deadline: Instant) -> Result<(), String> {
    let mapped =
        |f: &str| std::fs::read_to_string(format!("/proc/{pid}/{f}")).map(|s| !s.trim().is_empty());
    let mut wait = Duration::from_micros(100);
    loop {
        match (mapped("uid_map"), mapped("gid_map")) {
            (Ok(true), Ok(true)) => return Ok(()),
            (Err(e), _) | (_, Err(e)) => {
                return Err(format!("the sandbox's process {pid} is gone: {e}"));
            }
            _ if Instant::now() >= deadline => {
                return Err("the sandbox's user namespace got no id maps in time".into());
            }
            _ => {
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_millis(5));
            }
        }
    }
}

/// A bwrap sandbox's start failing for `message`, a reason about its network.
fn fail(message: String) -> SandboxError {
    SandboxError::Start {
        backend: "bwrap",
        message,
    }
}

/// How many times slirp4netns is started before a sandbox's network is given up on.
const SLIRP_ATTEMPTS: u32 = 3;

/// Connects the network namespace of `ns_pid` (the sandbox's init, on the host) to the
/// outside and adds the deny routes. `exit_fd` is the read end of a pipe whose write end
/// the sandbox holds: slirp4netns exits when the sandbox is gone.
///
/// slirp4netns is started again (up to [`SLIRP_ATTEMPTS`] times, within `deadline`)
/// when it fails before it is ready: as an unprivileged worker, about one start in ten
/// under load failed in its `setegid(0)` in the sandbox's user namespace although that
/// namespace's maps were written, and a second start succeeded. A sandbox whose network
/// cannot be brought up still fails its start, with the last error.
pub async fn attach(
    settings: &NetSettings,
    ns_pid: i32,
    exit_fd: OwnedFd,
    deadline: Instant,
) -> Result<Helper, SandboxError> {
    // slirp4netns becomes root of that user namespace (setegid(0)), which fails until
    // bwrap has written its id maps, and bwrap may report the pid before it has.
    wait_for_id_maps(ns_pid, deadline).await.map_err(fail)?;
    let mut attempt = 1;
    let pid = loop {
        let exit = exit_fd.try_clone()?;
        match start_slirp(settings, ns_pid, exit, deadline).await {
            Ok(pid) => break pid,
            Err(e) if attempt < SLIRP_ATTEMPTS && Instant::now() < deadline => {
                tracing::warn!(ns_pid, attempt, error = %e, "slirp4netns failed to start; starting it again");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(10 * u64::from(attempt))).await;
            }
            Err(e) => return Err(e),
        }
    };
    drop(exit_fd);
    if let Err(e) = deny_routes(settings, ns_pid).await {
        super::label::kill_tree(pid);
        return Err(fail(e));
    }
    Ok(Helper { pid })
}

/// Starts one slirp4netns for the network namespace of `ns_pid` and waits until it
/// says it is ready; returns its pid. On failure it is killed, and the error has what
/// it wrote.
async fn start_slirp(
    settings: &NetSettings,
    ns_pid: i32,
    exit_fd: OwnedFd,
    deadline: Instant,
) -> Result<i32, SandboxError> {
    let (ready_read, ready_write) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
    let owner = owning_userns(ns_pid).map_err(fail)?;
    let mut cmd = tokio::process::Command::new(&settings.slirp4netns);
    // The network namespace belongs to bwrap's outer user namespace, not to the one its
    // processes end up in (`--disable-userns` nests another): join that owner.
    cmd.env_clear()
        .args(["--configure", "--mtu=65520", "--disable-host-loopback"])
        .args([
            "--ready-fd=3",
            "--exit-fd=4",
            "--userns-path=/proc/self/fd/5",
        ])
        .args(["--enable-sandbox", "--enable-seccomp"]);
    cmd.arg(ns_pid.to_string())
        .arg("tap0")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped());
    let fds = [
        ready_write.as_raw_fd(),
        exit_fd.as_raw_fd(),
        owner.as_raw_fd(),
    ];
    // SAFETY: setsid, fcntl and dup2 are async-signal-safe.
    unsafe {
        cmd.pre_exec(move || {
            nix::unistd::setsid().map_err(std::io::Error::from)?;
            let high: Vec<i32> = fds
                .iter()
                .map(|fd| libc::fcntl(*fd, libc::F_DUPFD_CLOEXEC, 64))
                .collect();
            for (target, fd) in (3..).zip(&high) {
                if *fd < 0 || libc::dup2(*fd, target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        fail(format!(
            "network: true needs slirp4netns, which could not run ({}: {e}); install it (Debian: apt-get install slirp4netns)",
            settings.slirp4netns.display()
        ))
    })?;
    drop(ready_write);
    drop(exit_fd);
    drop(owner);
    let pid = super::server::child_pid(&child);
    let ready = super::server::stream::nonblocking(ready_read)?;
    let mut buf = [0u8; 8];
    let said = tokio::time::timeout_at(
        deadline.into(),
        super::server::stream::read(&ready, &mut buf),
    )
    .await;
    if !matches!(said, Ok(Ok(n)) if n > 0) {
        let _ = child.start_kill();
        let err = match child.stderr.take() {
            Some(mut e) => {
                use tokio::io::AsyncReadExt;
                let mut s = String::new();
                let _ =
                    tokio::time::timeout(Duration::from_secs(1), e.read_to_string(&mut s)).await;
                s
            }
            None => String::new(),
        };
        // Reaped, so a failed attempt leaves no zombie behind.
        let _ = tokio::time::timeout(Duration::from_secs(1), child.wait()).await;
        return Err(fail(format!(
            "slirp4netns did not bring the sandbox's network up: {}",
            err.trim()
        )));
    }
    // Reap it whenever it ends; it outlives this call.
    tokio::spawn(async move {
        let _ = child.wait().await;
    });
    Ok(pid)
}

/// The user namespace that owns the network namespace of `pid` (`NS_GET_USERNS`).
fn owning_userns(pid: i32) -> Result<OwnedFd, String> {
    use std::os::fd::FromRawFd;
    const NS_GET_USERNS: libc::c_ulong = 0xb701;
    let net = std::fs::File::open(format!("/proc/{pid}/ns/net"))
        .map_err(|e| format!("cannot open the sandbox's network namespace: {e}"))?;
    // SAFETY: NS_GET_USERNS takes no argument and returns a new descriptor or -1.
    let fd = unsafe { libc::ioctl(net.as_raw_fd(), NS_GET_USERNS as _) };
    if fd < 0 {
        return Err(format!(
            "cannot find the owner of the sandbox's network namespace: {}",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the ioctl returned a fresh descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds a `prohibit` route for every denied network inside the namespace of `ns_pid`.
async fn deny_routes(settings: &NetSettings, ns_pid: i32) -> Result<(), String> {
    use tokio::io::AsyncWriteExt;
    // Root may configure any namespace as it is; joining the sandbox's user namespace
    // would make it an unmapped user there, whose capabilities `exec` drops. Any other
    // worker is the namespace's root (bwrap mapped it to 0) once it joins.
    let user = if nix::unistd::geteuid().is_root() {
        None
    } else {
        Some(owning_userns(ns_pid)?)
    };
    let net = std::fs::File::open(format!("/proc/{ns_pid}/ns/net"))
        .map(OwnedFd::from)
        .map_err(|e| format!("cannot open the sandbox's network namespace: {e}"))?;
    let (user_fd, net_fd) = (user.as_ref().map(|u| u.as_raw_fd()), net.as_raw_fd());
    let mut cmd = tokio::process::Command::new(&settings.ip);
    cmd.env_clear()
        .args(["-batch", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true);
    // SAFETY: setns is async-signal-safe; the child is single-threaded after fork, as
    // joining a user namespace requires.
    unsafe {
        cmd.pre_exec(move || {
            if let Some(fd) = user_fd
                && libc::setns(fd, libc::CLONE_NEWUSER) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            if libc::setns(net_fd, libc::CLONE_NEWNET) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| {
        format!(
            "cannot run {} to restrict the sandbox's network: {e}; install iproute2",
            settings.ip.display()
        )
    })?;
    drop(user);
    drop(net);
    let mut batch = String::new();
    for n in denied(&settings.deny) {
        batch.push_str(&format!("route add prohibit {n}\n"));
    }
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(batch.as_bytes())
            .await
            .map_err(|e| format!("cannot give ip its routes: {e}"))?;
    }
    let out = tokio::time::timeout(Duration::from_secs(10), child.wait_with_output())
        .await
        .map_err(|_| "ip did not finish adding the deny routes within 10 s".to_string())?
        .map_err(|e| format!("ip failed: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "ip could not add the deny routes ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    Ok(())
}

/// Whether this host can give sandboxes their own network, and if not, why.
pub fn probe(settings: &NetSettings) -> Result<(), String> {
    let found = |p: &Path| -> bool {
        if p.components().count() > 1 {
            return p.is_file();
        }
        std::env::var_os("PATH")
            .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(p).is_file()))
    };
    if !found(&settings.slirp4netns) {
        return Err(format!(
            "{} is not installed (Debian: apt-get install slirp4netns); tasks with network: true will fail to start",
            settings.slirp4netns.display()
        ));
    }
    if !found(&settings.ip) {
        return Err(format!(
            "{} is not installed (Debian: apt-get install iproute2); tasks with network: true will fail to start",
            settings.ip.display()
        ));
    }
    // slirp4netns opens the TUN device inside the sandbox's namespaces, as the worker's
    // user: a device only root may open (mode 0600, as some hosts and containers have
    // it) leaves an unprivileged worker without a way to connect a sandbox.
    let tun = Path::new("/dev/net/tun");
    if let Err(e) = nix::unistd::access(
        tun,
        nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
    ) {
        return Err(format!(
            "{} cannot be opened by this worker's user ({e}); it is mode 0666 on most distributions, so ask the administrator to make it so (or run the worker as root); tasks with network: true will fail to start",
            tun.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn networks_parse_and_contain() {
        let n = Ipv4Net::parse("10.1.2.3/8").unwrap();
        assert_eq!(n.to_string(), "10.0.0.0/8");
        assert!(n.contains(&SLIRP_NET));
        assert_eq!(
            Ipv4Net::parse("192.0.2.7").unwrap().to_string(),
            "192.0.2.7/32"
        );
        assert!(Ipv4Net::parse("1.2.3.4/33").is_none());
        assert!(Ipv4Net::parse("nope").is_none());
    }

    #[test]
    fn the_deny_list_covers_private_ranges_and_spares_the_user_mode_network() {
        let d = denied(&[Ipv4Net::parse("203.0.113.0/24").unwrap()]);
        let has = |s: &str| d.contains(&Ipv4Net::parse(s).unwrap());
        assert!(has("10.0.0.0/8") && has("169.254.0.0/16") && has("203.0.113.0/24"));
        assert!(!d.iter().any(|n| n.prefix == 0));
        // 10/8 stays: the kernel prefers the namespace's own 10.0.2.0/24 route over it.
        assert!(!d.iter().any(|n| n.prefix >= 24 && n.contains(&SLIRP_NET)));
    }
}
