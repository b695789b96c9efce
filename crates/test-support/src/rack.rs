//! Nodes on one machine: a bridge and a network namespace per node, `rollout node`
//! processes in them, and a TCP proxy that puts the host's loopback-only database on the
//! bridge. Used by the many-nodes test and the scaling benchmark; needs root and `ip` (iproute2).

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use rollout_core::config::Settings;
use tokio::net::{TcpListener, TcpStream};

use crate::eventually::eventually;

/// A bridge and one network namespace per node, attached to it; removed when dropped.
pub struct Rack {
    /// The bridge's name.
    bridge: String,
    /// The host side's address on the bridge (NATS and the database proxy listen here).
    pub host_ip: Ipv4Addr,
    /// The nodes' namespaces, in order.
    pub namespaces: Vec<String>,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

impl Rack {
    /// A bridge with `nodes` namespaces on a /24 of its own (the subnet picked from the
    /// process id, so concurrent test runs do not collide).
    pub fn new(nodes: usize) -> Rack {
        assert!(
            nix::unistd::geteuid().is_root(),
            "network namespaces need root"
        );
        #[allow(clippy::cast_possible_truncation)] // modulo 200
        let subnet = (std::process::id() % 200) as u8 + 20;
        let bridge = format!("rk{subnet}br");
        // Leftovers of an earlier run that was killed.
        let _ = Command::new("ip")
            .args(["link", "delete", &bridge])
            .output();
        let host_ip = Ipv4Addr::new(10, 79, subnet, 1);
        ip(&["link", "add", &bridge, "type", "bridge"]);
        let mut rack = Rack {
            bridge: bridge.clone(),
            host_ip,
            namespaces: Vec::new(),
        };
        ip(&["addr", "add", &format!("{host_ip}/24"), "dev", &bridge]);
        ip(&["link", "set", &bridge, "up"]);
        for i in 0..nodes {
            let ns = format!("rk{subnet}n{i}");
            let _ = Command::new("ip").args(["netns", "delete", &ns]).output();
            let (outer, inner) = (format!("rk{subnet}v{i}"), format!("rk{subnet}p{i}"));
            ip(&["netns", "add", &ns]);
            rack.namespaces.push(ns.clone());
            ip(&[
                "link", "add", &outer, "type", "veth", "peer", "name", &inner,
            ]);
            ip(&["link", "set", &inner, "netns", &ns]);
            ip(&["link", "set", &outer, "master", &bridge]);
            ip(&["link", "set", &outer, "up"]);
            let addr = format!("10.79.{subnet}.{}/24", 10 + i);
            ip(&["-n", &ns, "addr", "add", &addr, "dev", &inner]);
            ip(&["-n", &ns, "link", "set", &inner, "up"]);
            ip(&["-n", &ns, "link", "set", "lo", "up"]);
            ip(&[
                "-n",
                &ns,
                "route",
                "add",
                "default",
                "via",
                &host_ip.to_string(),
            ]);
        }
        rack
    }

    /// Removes node `i`'s namespace (its veth goes with it).
    pub fn unplug(&mut self, i: usize) {
        let _ = Command::new("ip")
            .args(["netns", "delete", &self.namespaces[i]])
            .output();
    }
}

impl Drop for Rack {
    fn drop(&mut self) {
        for ns in &self.namespaces {
            let _ = Command::new("ip").args(["netns", "delete", ns]).output();
        }
        let _ = Command::new("ip")
            .args(["link", "delete", &self.bridge])
            .output();
    }
}

/// Forwards connections to `listen` on to `to` (the database, which listens on the
/// host's loopback only), until the runtime stops.
pub async fn tcp_proxy(listen: SocketAddr, to: SocketAddr) -> SocketAddr {
    let listener = TcpListener::bind(listen).await.expect("bind the proxy");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut inbound, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut outbound) = TcpStream::connect(to).await {
                    // Both ends carry small request/response messages: without this,
                    // Nagle holds a write behind the peer's delayed ACK (tens of ms).
                    let _ = inbound.set_nodelay(true);
                    let _ = outbound.set_nodelay(true);
                    let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                }
            });
        }
    });
    addr
}

/// The database URL as the nodes reach it: a Postgres URL through a proxy on the
/// bridge; SQLite's file as it is (the namespaces share the file system).
pub async fn database_for_nodes(url: &str, host_ip: Ipv4Addr) -> String {
    let Some(rest) = url.strip_prefix("postgres://") else {
        return url.to_string();
    };
    let (auth, tail) = rest.split_once('@').unwrap_or(("", rest));
    let (hostport, path) = tail.split_once('/').unwrap_or((tail, ""));
    let target: SocketAddr = tokio::net::lookup_host(hostport)
        .await
        .unwrap()
        .next()
        .unwrap();
    let proxy = tcp_proxy(SocketAddr::from((host_ip, 0)), target).await;
    let auth = if auth.is_empty() {
        String::new()
    } else {
        format!("{auth}@")
    };
    format!("postgres://{auth}{proxy}/{path}")
}

/// A `rollout node` process in a namespace, killed (with everything it started) when
/// dropped.
pub struct NodeProc {
    child: Child,
    /// Its node name.
    pub name: String,
    /// Its log file.
    pub log: PathBuf,
}

impl NodeProc {
    /// Starts `rollout` (`bin`) as node `name` in namespace `ns`, with `settings`
    /// (NATS and the database as the nodes reach them) and its state, config and log
    /// under `dir`.
    pub fn start(bin: &Path, settings: &Settings, dir: &Path, ns: &str, name: &str) -> NodeProc {
        let mut s = settings.clone();
        s.node.name = name.to_string();
        s.state_dir = dir.join(format!("node-{name}"));
        let config = dir.join(format!("node-{name}.toml"));
        std::fs::write(&config, toml::to_string(&s).unwrap()).unwrap();
        let log = dir.join(format!("node-{name}.log"));
        let child = Command::new("ip")
            .args(["netns", "exec", ns])
            .arg(bin)
            .arg("--config")
            .arg(&config)
            .arg("node")
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start rollout node");
        NodeProc {
            child,
            name: name.to_string(),
            log,
        }
    }

    /// Waits until the node's three stages take work.
    pub async fn started(&self) {
        eventually(
            &format!("node {} started", self.name),
            Duration::from_secs(60),
            || async {
                let log = std::fs::read_to_string(&self.log).unwrap_or_default();
                match log.matches("worker started").count() {
                    3 => Ok(()),
                    n => Err(format!("{n} stages started: {log}")),
                }
            },
        )
        .await;
    }

    /// Kills the node at once, as a power cut would: every process it started
    /// (sandboxes included), then itself.
    pub fn kill(&mut self) {
        let pid = i32::try_from(self.child.id()).unwrap();
        let mut all = descendants(pid);
        all.push(pid);
        for p in all {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(p),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.child.wait();
    }
}

impl NodeProc {
    /// Stops the node as an operator would: SIGTERM, then waiting for it to hand its
    /// work back and remove its sandboxes (SIGKILL, with everything it started, only
    /// if it outstays two minutes).
    pub fn stop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let pid = i32::try_from(self.child.id()).unwrap();
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        let deadline = std::time::Instant::now() + Duration::from_secs(120);
        while matches!(self.child.try_wait(), Ok(None)) && std::time::Instant::now() < deadline {
            #[allow(clippy::disallowed_methods, reason = "a test's teardown")]
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
    }
}

impl Drop for NodeProc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Every process below `pid`, read from /proc (children before the parents' siblings).
fn descendants(pid: i32) -> Vec<i32> {
    let mut parents: Vec<(i32, i32)> = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = entry.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // The parent is the second field after the command's closing parenthesis.
        if let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|v| v.parse::<i32>().ok())
        {
            parents.push((p, ppid));
        }
    }
    let mut out = Vec::new();
    let mut frontier = vec![pid];
    while let Some(p) = frontier.pop() {
        for &(child, parent) in &parents {
            if parent == p {
                out.push(child);
                frontier.push(child);
            }
        }
    }
    out
}
