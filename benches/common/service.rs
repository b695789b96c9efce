//! The whole service in the benchmark's process, as `rollout up` runs it: a private
//! nats-server, SQLite in a temp dir, the gateway and one worker of each stage. The
//! benchmarks that drive it through its HTTP API include this module with
//! `#[path = "common/service.rs"] mod service;`.

use std::sync::Arc;
use std::time::Duration;

use rollout::client::Client;
use rollout::config::Settings;
use rollout::domain::Stage;
use rollout::natsd::NatsServer;
use tokio_util::sync::CancellationToken;

/// A running service; dropping it stops nats-server and removes the temp dir.
pub struct Env {
    /// A client of its gateway.
    pub client: Client,
    /// Its connections (store, queue), for benchmarks that go below the API.
    #[allow(dead_code)]
    pub deps: rollout::wiring::Services,
    /// Cancel to stop the gateway and the workers.
    pub shutdown: CancellationToken,
    _nats: NatsServer,
    _dir: tempfile::TempDir,
}

/// Starts the service with the default settings changed by `tweak` (the reconciler is
/// off, as nothing in a benchmark is lost).
pub async fn start(tweak: impl FnOnce(&mut Settings)) -> Env {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start(&dir.path().join("nats"), "127.0.0.1:0".parse().unwrap())
        .expect("nats-server on PATH (see README)");
    let mut s = Settings::default();
    s.nats.url = nats.url();
    s.database.url = format!("sqlite://{}", dir.path().join("bench.db").display());
    s.node.name = "bench".into();
    s.reconciler.enabled = false;
    tweak(&mut s);
    let deps = rollout::wiring::connect(Arc::new(s), "bench", false)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client = Client::new(&format!("http://{}", listener.local_addr().unwrap()));
    let shutdown = CancellationToken::new();
    tokio::spawn(rollout::wiring::run_gateway(
        deps.clone(),
        listener,
        shutdown.clone(),
    ));
    for stage in Stage::ALL {
        tokio::spawn(rollout::wiring::run_workers(
            deps.clone(),
            stage,
            1,
            shutdown.clone(),
        ));
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    Env {
        client,
        deps,
        shutdown,
        _nats: nats,
        _dir: dir,
    }
}
