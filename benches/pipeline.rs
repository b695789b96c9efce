//! Pipeline benchmarks (not tests): run with `cargo bench --bench pipeline`.
//!
//! Everything runs in this process on this machine — a private nats-server, a SQLite file
//! in a temp dir, the gateway and the workers — the way `rollout up` runs them. Each
//! figure is printed beside a baseline measured in the same run:
//!
//! 1. **latency**: submit→done of one zero-work synthetic job at a time (submit over
//!    HTTP, result by long-poll), p50/p99, beside the floor of one JetStream
//!    publish→pull→ack round trip (a job makes four such hops).
//! 2. **throughput**: zero-work jobs per second end to end with SQLite, and with Postgres
//!    (a fresh database on the server `ROLLOUT_BENCH_DATABASE_URL` names, default the
//!    local one when it answers), each beside the rate of bare JetStream work-queue hops
//!    on the same server.
//! 3. **pipelined vs coupled**: the same number of RUN slots, once as this design runs
//!    them (separate INIT, RUN and EVAL workers) and once with each slot doing
//!    init+run+eval of a job in sequence (as in-trainer rollout loops do), with stage
//!    times 0.2 s / 1.0 s / 0.8 s.
//!
//! 4. **dashboard**: one read of the status page's dashboard (as `GET /v1/dashboard`
//!    makes it, at a fixed time) after 1,000,000 finished jobs of history, beside the
//!    same read after 20,000, on SQLite and on Postgres. The last 15 minutes hold the
//!    same jobs in both (20 a second); only older history grows. A refreshing status
//!    page must not cost more as a training run goes on.
//!
//! Set `BENCH_QUICK=1` for a short smoke run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::StreamExt;
use rollout::domain::{Stage, Task};
use rollout::kinds::synthetic::Synthetic;
use rollout::stage::{StageContext, TaskKind};
use tokio_util::sync::CancellationToken;

mod common;
#[path = "common/dashboard.rs"]
mod dashboard;
#[path = "common/service.rs"]
mod service;
use rollout_test_support::database::FreshPostgres;
use service::{Env, start};

fn task(spec: serde_json::Value) -> Task {
    Task::new("synthetic", spec)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    sorted[common::rank(sorted.len(), p)]
}

/// One JetStream publish→pull→ack round trip on a work-queue stream, `n` times.
async fn jetstream_hop_floor(env: &Env, n: usize) -> Vec<f64> {
    let js = env.deps.queue.jetstream();
    let stream = js
        .create_or_update_stream(async_nats::jetstream::stream::Config {
            name: "FLOOR".into(),
            subjects: vec!["floor".into()],
            retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
            ..Default::default()
        })
        .await
        .unwrap();
    let _ = stream;
    let consumer: async_nats::jetstream::consumer::PullConsumer = js
        .get_stream("FLOOR")
        .await
        .unwrap()
        .create_consumer(async_nats::jetstream::consumer::pull::Config {
            durable_name: Some("floor".into()),
            ..Default::default()
        })
        .await
        .unwrap();
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        let mut batch = consumer
            .batch()
            .max_messages(1)
            .expires(Duration::from_secs(2))
            .messages()
            .await
            .unwrap();
        js.publish("floor", format!("{i}").into())
            .await
            .unwrap()
            .await
            .unwrap();
        let m = batch.next().await.unwrap().unwrap();
        m.ack().await.unwrap();
        out.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    out.sort_by(f64::total_cmp);
    out
}

async fn latency(quick: bool) -> String {
    let env = start(|_| {}).await;
    let n = if quick { 50 } else { 500 };
    // Warm up connections and statement caches.
    for _ in 0..20 {
        let r = env
            .client
            .submit(&[task(serde_json::json!({}))], Some("warm"))
            .await
            .unwrap();
        let _ = r;
    }
    let _ = env.client.results(Some("warm"), 0, 0).await;
    let mut lat = Vec::with_capacity(n);
    let mut after = 0;
    for _ in 0..n {
        let t = Instant::now();
        env.client
            .submit(&[task(serde_json::json!({}))], Some("lat"))
            .await
            .unwrap();
        loop {
            let page = env.client.results(Some("lat"), after, 5000).await.unwrap();
            if let Some(last) = page.results.last() {
                after = last.seq;
                break;
            }
        }
        lat.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    lat.sort_by(f64::total_cmp);
    let floor = jetstream_hop_floor(&env, n).await;
    env.shutdown.cancel();
    let (p50, p99, f50) = (pct(&lat, 0.5), pct(&lat, 0.99), pct(&floor, 0.5));
    format!(
        "| submit→done latency, zero-work job, one at a time ({n} jobs) | p50 {p50:.2} ms, p99 {p99:.2} ms | one JetStream publish→pull→ack hop: p50 {f50:.3} ms | p50 = {:.1} hops | p50 ≤ 5 ms: {} |",
        p50 / f50,
        if p50 <= 5.0 { "met" } else { "NOT met" }
    )
}

/// Throughput on SQLite (`db` = None) or on the Postgres database `db` names.
async fn throughput(quick: bool, db: Option<&str>) -> String {
    let env = start(|s| {
        for st in [&mut s.stages.init, &mut s.stages.run, &mut s.stages.eval] {
            st.concurrency = 256;
        }
        if let Some(url) = db {
            s.database.url = url.to_string();
        }
    })
    .await;
    let n: usize = if quick { 2_000 } else { 20_000 };
    let chunk = 2_000;
    let t = Instant::now();
    let client = env.client.clone();
    let submitter = tokio::spawn(async move {
        for _ in 0..n / chunk {
            let tasks: Vec<Task> = (0..chunk).map(|_| task(serde_json::json!({}))).collect();
            client.submit(&tasks, Some("tput")).await.unwrap();
        }
    });
    env.client.collect_results("tput", n).await.unwrap();
    let secs = t.elapsed().as_secs_f64();
    submitter.await.unwrap();
    let rate = n as f64 / secs;

    // Baseline: the same number of bare work-queue hops (publish, pull, ack) per job.
    let js = env.deps.queue.jetstream();
    js.create_or_update_stream(async_nats::jetstream::stream::Config {
        name: "HOPS".into(),
        subjects: vec!["hops.>".into()],
        retention: async_nats::jetstream::stream::RetentionPolicy::WorkQueue,
        ..Default::default()
    })
    .await
    .unwrap();
    let hops = 4; // init, run, eval, done
    let stream = js.get_stream("HOPS").await.unwrap();
    let mut consumers = Vec::new();
    for h in 0..hops - 1 {
        consumers.push(
            stream
                .create_consumer(async_nats::jetstream::consumer::pull::Config {
                    durable_name: Some(format!("h{h}")),
                    filter_subject: format!("hops.{h}"),
                    ..Default::default()
                })
                .await
                .unwrap(),
        );
    }
    let t = Instant::now();
    let mut relays = Vec::new();
    for (h, c) in consumers.into_iter().enumerate() {
        let js = js.clone();
        relays.push(tokio::spawn(async move {
            let mut msgs = c.messages().await.unwrap();
            let mut seen = 0;
            while seen < n {
                let m = msgs.next().await.unwrap().unwrap();
                js.publish(format!("hops.{}", h + 1), m.payload.clone())
                    .await
                    .unwrap()
                    .await
                    .unwrap();
                m.ack().await.unwrap();
                seen += 1;
            }
        }));
    }
    let mut pending = Vec::new();
    for i in 0..n {
        pending.push(js.publish("hops.0", format!("{i}").into()).await.unwrap());
        if pending.len() >= 1000 {
            for p in pending.drain(..) {
                p.await.unwrap();
            }
        }
    }
    for p in pending {
        p.await.unwrap();
    }
    for r in relays {
        r.await.unwrap();
    }
    let base = n as f64 / t.elapsed().as_secs_f64();
    env.shutdown.cancel();
    format!(
        "| end-to-end throughput, zero-work jobs, {} ({n} jobs) | {rate:.0} jobs/s | bare JetStream, 3 relayed work-queue hops per message: {base:.0} msgs/s | {:.2}× of bare | ≥ 2,000 jobs/s: {} |",
        if db.is_some() { "Postgres" } else { "SQLite" },
        rate / base,
        if rate >= 2000.0 { "met" } else { "NOT met" }
    )
}

async fn pipelined_vs_coupled(quick: bool) -> String {
    let slots = 16usize;
    let per_slot = if quick { 4 } else { 20 };
    let n = slots * per_slot;
    let spec = serde_json::json!({"init_ms": 200, "run_ms": 1000, "eval_ms": 800});

    // Pipelined: this design; RUN has `slots` slots, INIT and EVAL their own workers.
    let env = start(|s| {
        s.stages.run.concurrency = slots;
        s.stages.init.concurrency = 64;
        s.stages.eval.concurrency = 64;
    })
    .await;
    let tasks: Vec<Task> = (0..n).map(|_| task(spec.clone())).collect();
    let t = Instant::now();
    env.client.submit(&tasks, Some("pipe")).await.unwrap();
    env.client.collect_results("pipe", n).await.unwrap();
    let pipelined = n as f64 / t.elapsed().as_secs_f64();
    env.shutdown.cancel();

    // Coupled: `slots` loops, each running a job's three stages back to back with the
    // same task kind code.
    let next = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let t = Instant::now();
    let mut loops = Vec::new();
    for _ in 0..slots {
        let next = next.clone();
        let spec = spec.clone();
        loops.push(tokio::spawn(async move {
            while next.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < n {
                let ctx = StageContext {
                    job: fake_job(&spec),
                    node: "bench".into(),
                    cancel: CancellationToken::new(),
                };
                Synthetic.init(&ctx).await.unwrap();
                Synthetic.run(&ctx).await.unwrap();
                Synthetic.eval(&ctx).await.unwrap();
            }
        }));
    }
    for l in loops {
        l.await.unwrap();
    }
    let coupled = n as f64 / t.elapsed().as_secs_f64();
    let ratio = pipelined / coupled;
    format!(
        "| pipelined vs coupled, {slots} RUN slots, {n} jobs, stages 0.2/1.0/0.8 s | pipelined {pipelined:.2} jobs/s | coupled {coupled:.2} jobs/s | {ratio:.2}× (theory 2.0) | ≥ 1.8×: {} |",
        if ratio >= 1.8 { "met" } else { "NOT met" }
    )
}

fn fake_job(spec: &serde_json::Value) -> rollout::domain::Job {
    rollout::domain::Job {
        id: "coupled".into(),
        batch_id: "coupled".into(),
        group_id: None,
        client_id: None,
        kind: "synthetic".into(),
        task: serde_json::json!({"kind": "synthetic", "spec": spec}),
        status: rollout::domain::Status::Running,
        stage: Stage::Init,
        epoch: 0,
        attempts: 1,
        stage_attempts: 1,
        restarts: 0,
        node: None,
        route: None,
        lease_until: None,
        init_output: None,
        run_output: None,
        error: None,
        timings: Default::default(),
        created_at: 0,
        updated_at: 0,
        finished_at: None,
        reward: None,
        finish_reason: None,
    }
}

fn main() {
    if !common::started_by_cargo_bench("pipeline") {
        return;
    }
    let quick = common::quick();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let only = std::env::args().nth(1).filter(|a| !a.starts_with('-'));
    let want = |name: &str| only.as_deref().is_none_or(|o| o == name);
    println!("| benchmark | result | baseline (same run) | ratio | goal |");
    println!("|---|---|---|---|---|");
    rt.block_on(async {
        if want("latency") {
            println!("{}", latency(quick).await);
        }
        if want("throughput") {
            println!("{}", throughput(quick, None).await);
            let admin = std::env::var("ROLLOUT_BENCH_DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
            match FreshPostgres::create(&admin).await.ok() {
                Some(db) => {
                    println!("{}", throughput(quick, Some(&db.url)).await);
                    db.remove().await;
                }
                None => eprintln!(
                    "no Postgres answers (set ROLLOUT_BENCH_DATABASE_URL): the Postgres throughput row is skipped"
                ),
            }
        }
        if want("pipeline") {
            println!("{}", pipelined_vs_coupled(quick).await);
        }
        if want("dashboard") {
            let dir = tempfile::tempdir().unwrap();
            let url = format!("sqlite://{}", dir.path().join("dash.db").display());
            println!("{}", dashboard::reads(quick, &url).await);
            let admin = std::env::var("ROLLOUT_BENCH_DATABASE_URL")
                .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/test".into());
            match FreshPostgres::create(&admin).await.ok() {
                Some(db) => {
                    println!("{}", dashboard::reads(quick, &db.url).await);
                    db.remove().await;
                }
                None => eprintln!("no Postgres answers: the Postgres dashboard row is skipped"),
            }
        }
    });
}
