//! A JetStream cluster of nats-servers on this machine, for tests that take servers
//! away: each member has its own free ports (client, routes, monitoring) and its own
//! store directory, routes to every other member over loopback, and can be killed
//! with SIGKILL and started again on the same ports and store.

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::time::Duration;

use rollout_core::natsd::{ClusterMember, NatsServer};

use crate::eventually::eventually;

/// The running cluster. Dropping it kills every member.
pub struct NatsCluster {
    dir: PathBuf,
    members: Vec<(ClusterMember, SocketAddr)>,
    servers: Vec<Option<NatsServer>>,
}

impl NatsCluster {
    /// Starts `size` members under `dir` (one subdirectory each) and waits until the
    /// cluster has elected its JetStream meta leader with every member a peer, so
    /// streams with `size` replicas can be placed.
    pub async fn start(dir: &Path, size: usize) -> NatsCluster {
        // Every port is held until all are chosen, so no two members get the same one.
        let held: Vec<TcpListener> = (0..3 * size)
            .map(|_| TcpListener::bind("127.0.0.1:0").expect("bind a free port"))
            .collect();
        let addrs: Vec<SocketAddr> = held.iter().map(|l| l.local_addr().unwrap()).collect();
        drop(held);
        let routes: Vec<SocketAddr> = addrs[size..2 * size].to_vec();
        let members = (0..size)
            .map(|i| {
                let member = ClusterMember {
                    cluster: "rollout-test".into(),
                    name: format!("n{}", i + 1),
                    routes_listen: routes[i],
                    routes: routes.clone(),
                    monitor: addrs[2 * size + i],
                };
                (member, addrs[i])
            })
            .collect();
        let mut cluster = NatsCluster {
            dir: dir.to_path_buf(),
            members,
            servers: (0..size).map(|_| None).collect(),
        };
        for i in 0..size {
            cluster.restart(i);
        }
        cluster.wait_for_meta_leader(size).await;
        cluster
    }

    /// The client URLs of every member, comma-separated (what `nats.url` takes).
    pub fn url(&self) -> String {
        self.members
            .iter()
            .map(|(_, addr)| format!("nats://{addr}"))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The index of the member called `name`.
    pub fn index_of(&self, name: &str) -> usize {
        self.members
            .iter()
            .position(|(m, _)| m.name == name)
            .unwrap_or_else(|| panic!("no cluster member is called {name}"))
    }

    /// Kills member `i` with SIGKILL (no lame-duck mode, no clean shutdown: as a
    /// crashed machine would go) and waits until the process is gone.
    pub fn kill(&mut self, i: usize) {
        let server = self.servers[i]
            .take()
            .unwrap_or_else(|| panic!("member {i} is not running"));
        // Dropping the handle sends SIGKILL and reaps the process.
        drop(server);
    }

    /// Starts member `i` (again), on its ports and store.
    pub fn restart(&mut self, i: usize) {
        let (member, addr) = &self.members[i];
        let server = NatsServer::start_in_cluster(&self.dir.join(&member.name), *addr, member)
            .expect("start a cluster nats-server (is it installed? see README)");
        self.servers[i] = Some(server);
    }

    /// Waits until some running member reports a JetStream meta leader and a meta group
    /// of `peers` servers (its `/jsz` monitoring endpoint).
    async fn wait_for_meta_leader(&self, peers: usize) {
        let http = reqwest::Client::new();
        let monitors: Vec<SocketAddr> = self.members.iter().map(|(m, _)| m.monitor).collect();
        let http = &http;
        let monitors = &monitors;
        eventually(
            "the NATS cluster elected a JetStream meta leader",
            Duration::from_secs(60),
            || async move {
                let mut seen = Vec::new();
                for monitor in monitors {
                    let jsz: serde_json::Value =
                        match http.get(format!("http://{monitor}/jsz")).send().await {
                            Ok(r) => r.json().await.unwrap_or_default(),
                            Err(e) => {
                                seen.push(format!("{monitor}: {e}"));
                                continue;
                            }
                        };
                    let meta = &jsz["meta_cluster"];
                    let leader = meta["leader"].as_str().unwrap_or_default();
                    let size = meta["cluster_size"].as_u64().unwrap_or_default();
                    if !leader.is_empty() && usize::try_from(size).ok() == Some(peers) {
                        return Ok(());
                    }
                    seen.push(format!("{monitor}: {meta}"));
                }
                Err(seen)
            },
        )
        .await;
    }
}
