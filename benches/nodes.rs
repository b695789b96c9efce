//! Scaling benchmark (not a test): run with `cargo bench --bench nodes` (as root: it
//! makes network namespaces).
//!
//! 1 to 4 nodes, each a `rollout node` process (release build) in a network namespace of
//! its own on a bridge, the gateway and NATS in this process on the host side, SQLite (or
//! the Postgres `ROLLOUT_BENCH_DATABASE_URL` names, reached through a proxy on the bridge)
//! as the database. The jobs are I/O-bound synthetic ones (each stage waits, RUN 200 ms),
//! so a node's capacity is its slots: every node has the same RUN slots, and perfect
//! scaling is n times the one-node rate. Each node count's throughput is measured in the
//! same run; scaling efficiency is rate(n) / (n × rate(1)) (goal ≥ 0.9).
//! `BENCH_QUICK=1` runs fewer jobs.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use rollout::config::Settings;
use rollout::domain::Task;
use rollout::natsd::NatsServer;
use tokio_util::sync::CancellationToken;

#[allow(dead_code)] // each benchmark uses part of these
mod common;
use rack::{NodeProc, Rack, database_for_nodes};
use rollout_test_support::database::FreshPostgres;
use rollout_test_support::rack;

/// RUN slots per node (INIT and EVAL get as many).
const SLOTS: usize = 32;
/// RUN time of a job (ms); INIT and EVAL take 20 ms each.
const RUN_MS: u64 = 200;

/// Jobs per second through `nodes` nodes, from first submit to last result, on a
/// fresh SQLite file or (when `pg_admin` names a server) a fresh Postgres database.
async fn rate(rack: &Rack, nodes: usize, jobs: usize, pg_admin: &str) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    let nats = NatsServer::start(
        &dir.path().join("nats"),
        SocketAddr::from((rack.host_ip, 0)),
    )
    .expect("nats-server on PATH (see README)");
    let mut s = Settings::default();
    s.nats.url = nats.url();
    s.nats.prefix = format!("scale{nodes}");
    let pg = if pg_admin.is_empty() {
        None
    } else {
        Some(
            FreshPostgres::create(pg_admin)
                .await
                .expect("a database of its own on the ROLLOUT_BENCH_DATABASE_URL server"),
        )
    };
    s.database.url = match &pg {
        None => format!("sqlite://{}", dir.path().join("bench.db").display()),
        Some(db) => db.url.clone(),
    };
    s.node.name = "gateway".into();
    s.reconciler.enabled = false;
    for st in [&mut s.stages.init, &mut s.stages.run, &mut s.stages.eval] {
        st.concurrency = SLOTS;
    }
    let deps = rollout::wiring::connect(Arc::new(s.clone()), "bench", false)
        .await
        .unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let client =
        rollout::client::Client::new(&format!("http://{}", listener.local_addr().unwrap()));
    let shutdown = CancellationToken::new();
    tokio::spawn(rollout::wiring::run_gateway(
        deps.clone(),
        listener,
        shutdown.clone(),
    ));
    let mut for_nodes = s.clone();
    for_nodes.database.url = database_for_nodes(&s.database.url, rack.host_ip).await;
    let bin = Path::new(env!("CARGO_BIN_EXE_rollout"));
    let procs: Vec<NodeProc> = (0..nodes)
        .map(|i| {
            NodeProc::start(
                bin,
                &for_nodes,
                dir.path(),
                &rack.namespaces[i],
                &format!("n{i}"),
            )
        })
        .collect();
    for p in &procs {
        p.started().await;
    }
    let tasks: Vec<Task> = (0..jobs)
        .map(|_| {
            Task::new(
                "synthetic",
                serde_json::json!({"init_ms": 20, "run_ms": RUN_MS, "eval_ms": 20}),
            )
        })
        .collect();
    let t = Instant::now();
    let batch = format!("scale-{nodes}");
    for chunk in tasks.chunks(1000) {
        client.submit(chunk, Some(&batch)).await.unwrap();
    }
    client.collect_results(&batch, jobs).await.unwrap();
    let secs = t.elapsed().as_secs_f64();
    shutdown.cancel();
    drop(procs);
    tokio::time::sleep(Duration::from_millis(200)).await;
    if let Some(db) = pg {
        db.remove().await;
    }
    #[allow(clippy::cast_precision_loss)]
    let r = jobs as f64 / secs;
    r
}

#[tokio::main]
async fn main() {
    if !common::started_by_cargo_bench("nodes") {
        return;
    }
    let quick = common::quick();
    let db_url = std::env::var("ROLLOUT_BENCH_DATABASE_URL").unwrap_or_default();
    let rack = Rack::new(4);
    // Per node, enough jobs for several rounds of every slot.
    let per_node = if quick { 200 } else { 1_000 };
    let mut rows = Vec::new();
    let mut one = 0.0;
    for nodes in 1..=4 {
        let r = rate(&rack, nodes, per_node * nodes, &db_url).await;
        if nodes == 1 {
            one = r;
        }
        #[allow(clippy::cast_precision_loss)]
        let efficiency = r / (nodes as f64 * one);
        eprintln!("{nodes} node(s): {r:.1} jobs/s, efficiency {efficiency:.2}");
        rows.push((nodes, r, efficiency));
    }
    // RUN has its own slots: a node finishes at most SLOTS jobs per RUN time.
    #[allow(clippy::cast_precision_loss)]
    let ideal = (SLOTS as f64) * 1000.0 / (RUN_MS as f64);
    println!(
        "\n{} database, {SLOTS} slots per stage per node, RUN {RUN_MS} ms (a node's ceiling ≈ {ideal:.0} jobs/s)\n",
        if db_url.is_empty() {
            "SQLite"
        } else {
            "Postgres"
        }
    );
    println!("| nodes | jobs | jobs/s | vs 1 node | scaling efficiency | goal ≥ 0.9 |");
    println!("|---|---|---|---|---|---|");
    for (nodes, r, e) in rows {
        println!(
            "| {nodes} | {} | {r:.1} | {:.2}× | {e:.2} | {} |",
            per_node * nodes,
            r / one,
            if e >= 0.9 { "met" } else { "not met" }
        );
    }
}
