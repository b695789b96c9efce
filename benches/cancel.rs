//! Cancel benchmark (not a test): run with `cargo bench --bench cancel`.
//!
//! How long a trainer's cancel takes to stop a batch under load, and whether anything
//! of the batch is scored after it. The service runs in this process (as `rollout up`
//! runs it, SQLite) with 128 slots per stage; a batch of 512 samples keeps 128 in
//! flight, each carrying 48 KiB of metadata (so every end writes a large result row,
//! and cancels wait behind those writes as they did when the problem was found), RUN
//! log-normal around 300 ms, EVAL 100 ms. Once results flow, the batch is cancelled
//! (`POST /v1/batches/{id}/cancel`), and three
//! things are measured: the answer's latency, the time from the cancel to the last of
//! the batch's jobs ended, and how many jobs were scored (`done`) after the first job
//! the cancel ended (in the order results committed: must be 0).
//!
//! The baseline, in the same run on the same service: the same load stopped the way a
//! trainer had to stop a plain batch before batches could be cancelled, each live job
//! cancelled with its own `POST /v1/jobs/{id}/cancel`, one after another.
//! Three runs of each, interleaved; medians reported.
//!
//! Set `BENCH_QUICK=1` for a short smoke run (one run each, 64 in flight).

use std::time::{Duration, Instant};

use rollout::api::batches::CancelledBatch;
use rollout::domain::{JobResult, Status, Task};

mod common;
#[path = "common/service.rs"]
mod service;
use service::{Env, start};

/// What one cancel measured.
#[derive(Debug, Clone, Copy)]
struct Run {
    /// The cancel's answer (the last answer, for one-by-one cancels).
    answer: Duration,
    /// Cancel sent to the last job of the batch ended.
    all_ended: Duration,
    /// Jobs live at the cancel.
    live: usize,
    /// Jobs scored after the first job the cancel ended.
    late: usize,
}

/// Bytes of metadata each sample carries (and its result row with it).
const PAD: usize = 48 * 1024;
/// One sample: the shared spec and a large metadata payload.
fn sample(i: usize) -> Task {
    let mut t: Task = serde_json::from_value(serde_json::json!({
        "kind": "synthetic",
        "spec": {"run_ms": 300, "run_sigma": 0.5, "eval_ms": 100, "pass_rate": 0.5},
        "metadata": {"prompt": i, "pad": "x".repeat(PAD)},
    }))
    .expect("a synthetic task");
    t.client_id = None;
    t
}

/// Waits until `batch` has at least `n` results (results flowing: the load is on).
async fn warm(env: &Env, batch: &str, n: i64) {
    loop {
        let s = env.client.status(Some(batch)).await.unwrap();
        if s.batch.is_some_and(|b| b.finished >= n) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits until every job of `batch` has ended; when it did, measured from `from`.
async fn all_ended(env: &Env, batch: &str, from: Instant) -> Duration {
    loop {
        let b = env.deps.store.batch(batch).await.unwrap().unwrap();
        if b.finished == b.submitted {
            return from.elapsed();
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Jobs of `results` scored after the first cancelled one, in commit (`seq`) order.
fn late(results: &mut [JobResult]) -> usize {
    results.sort_by_key(|r| r.seq);
    let first = results
        .iter()
        .position(|r| r.status == Status::Cancelled)
        .unwrap_or(results.len());
    results[first..]
        .iter()
        .filter(|r| r.status == Status::Done)
        .count()
}

/// Submits the load: `in_flight` × 4 samples in plain batch `tag` (the slots keep
/// `in_flight` of them running, the rest queued), and waits until results flow.
async fn load(env: &Env, tag: &str, in_flight: usize) -> usize {
    let tasks: Vec<Task> = (0..in_flight * 4).map(sample).collect();
    for chunk in tasks.chunks(64) {
        env.client.submit(chunk, Some(tag)).await.unwrap();
    }
    warm(env, tag, i64::try_from(in_flight).unwrap()).await;
    tasks.len()
}

/// What the run measured once the batch has ended: its results in commit order.
async fn measured(
    env: &Env,
    tag: &str,
    n: usize,
    answer: Duration,
    t: Instant,
    live: usize,
) -> Run {
    let ended = all_ended(env, tag, t).await;
    let mut results = env.client.collect_results(tag, n).await.unwrap();
    Run {
        answer,
        all_ended: ended,
        live,
        late: late(&mut results),
    }
}

/// The service's batch cancel.
async fn batch_cancel(env: &Env, tag: &str, in_flight: usize) -> Run {
    let n = load(env, tag, in_flight).await;
    let t = Instant::now();
    let answer = env.client.cancel_batch(tag).await.unwrap();
    let answered = t.elapsed();
    let live = match answer {
        CancelledBatch::Sampling(v) => v.cancelling.unwrap_or(0),
        CancelledBatch::Plain(p) => p.cancelling,
    };
    measured(env, tag, n, answered, t, usize::try_from(live).unwrap()).await
}

/// The baseline: each live job cancelled on its own, one after another.
async fn one_by_one(env: &Env, tag: &str, in_flight: usize) -> Run {
    let n = load(env, tag, in_flight).await;
    let t = Instant::now();
    let live = env.deps.store.live_jobs(tag, 100_000).await.unwrap();
    let mut answered = Duration::ZERO;
    for id in &live {
        let a = Instant::now();
        // A job that ended meanwhile answers 409; that is fine.
        let _ = env.client.cancel(id).await;
        answered = a.elapsed();
    }
    measured(env, tag, n, answered, t, live.len()).await
}

/// The median of `runs` by `key`.
fn median(runs: &[Run], key: impl Fn(&Run) -> f64) -> f64 {
    let mut v: Vec<f64> = runs.iter().map(key).collect();
    v.sort_by(f64::total_cmp);
    v[common::rank(v.len(), 0.5)]
}

async fn compare(quick: bool) -> Vec<String> {
    let (repeats, in_flight) = if quick { (1, 64) } else { (3, 128) };
    let (mut ours, mut base) = (Vec::new(), Vec::new());
    for rep in 0..repeats {
        for how in ["batch", "one-by-one"] {
            let env = start(|s| {
                for st in [&mut s.stages.init, &mut s.stages.run, &mut s.stages.eval] {
                    st.concurrency = in_flight;
                }
            })
            .await;
            let tag = format!("{how}-{rep}");
            let run = match how {
                "batch" => batch_cancel(&env, &tag, in_flight).await,
                _ => one_by_one(&env, &tag, in_flight).await,
            };
            eprintln!(
                "run {rep} ({how}): answer {:.1} ms, all {} live jobs ended {:.1} ms after the cancel, {} scored after it",
                run.answer.as_secs_f64() * 1e3,
                run.live,
                run.all_ended.as_secs_f64() * 1e3,
                run.late
            );
            match how {
                "batch" => ours.push(run),
                _ => base.push(run),
            }
            env.shutdown.cancel();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let (o_end, b_end) = (
        median(&ours, |r| ms(r.all_ended)),
        median(&base, |r| ms(r.all_ended)),
    );
    let late: usize = ours.iter().map(|r| r.late).sum();
    let base_late: usize = base.iter().map(|r| r.late).sum();
    vec![
        format!(
            "| batch cancel, {in_flight} of {} samples in flight (48 KiB each): cancel to every job ended | {o_end:.0} ms (answer {:.0} ms; {:.0} live) | each live job cancelled on its own: {b_end:.0} ms (last answer {:.0} ms; {:.0} live) | {:.2}× the baseline's time | reported |",
            in_flight * 4,
            median(&ours, |r| ms(r.answer)),
            median(&ours, |r| r.live as f64),
            median(&base, |r| ms(r.answer)),
            median(&base, |r| r.live as f64),
            o_end / b_end,
        ),
        format!(
            "| jobs scored after the cancel (all runs) | {late} | one by one: {base_late} | | 0: {} |",
            if late == 0 { "met" } else { "NOT met" }
        ),
    ]
}

fn main() {
    common::run_table("cancel", compare);
}
