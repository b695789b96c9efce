//! Dynamic-sampling benchmark (not a test): run with `cargo bench --bench sampling`.
//!
//! How long a trainer waits for K = 32 informative groups of G = 8 samples (groups whose
//! rewards are not all equal, DAPO's dynamic sampling), and how much sandbox time it
//! spends on them. Three strategies run on the same service (as `rollout up` runs it, in
//! this process), with the same stage capacity (K × G slots per stage, so one whole
//! generation batch runs at once) and the same prompt pool in the same order:
//!
//! - **(a) whole-batch regeneration**, as verl's DAPO recipe does: submit K prompts × G
//!   as one batch, wait for all of it, keep its informative groups, repeat until K.
//! - **(b) replenishment without early cancel**: the trainer keeps K groups in flight
//!   and launches the next prompt whenever a group ends, until it has K; the groups
//!   still running then run to their end (nothing cancels them).
//! - **(c) this service's sampling batch** (`POST /v1/batches`): the same replenishment
//!   done by the service, and everything left cancelled the moment the K-th group is
//!   accepted.
//!
//! The workload is the synthetic kind's: each prompt's pass probability is drawn from
//! an arcsine distribution (most prompts are nearly always or nearly never solved, so
//! about 40% of groups of 8 are uniform), and RUN times are log-normal with σ = 1 around
//! a 500 ms median (the slowest of 256 samples takes about 15× the median), with 100 ms
//! INIT and 200 ms EVAL. Sandbox time is a job's INIT start to its end, summed over
//! every job a strategy started. Each strategy runs three times, interleaved; the
//! medians are reported.
//!
//! Set `BENCH_QUICK=1` for a short smoke run.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use rollout::api::batches::BatchRequest;
use rollout::domain::sampling::SamplingStatus;
use rollout::domain::{Job, JobResult, Status, Task};

mod common;
#[path = "common/service.rs"]
mod service;
use service::{Env, start};

/// Samples per prompt.
const G: usize = 8;

/// The prompt pool and the trainer's ask.
struct Workload {
    /// K: informative groups wanted.
    k: usize,
    /// Each prompt's pass probability.
    rates: Vec<f64>,
    /// The synthetic spec every sample shares (all but `pass_rate`).
    spec: serde_json::Value,
}

impl Workload {
    fn new(quick: bool) -> Self {
        let (k, pool, run_ms) = if quick {
            (8, 256, 200)
        } else {
            (32, 1024, 500)
        };
        let mut state = 0x5eed_u64;
        let rates = (0..pool)
            .map(|_| {
                state = splitmix64(state);
                let u = (state >> 11) as f64 / (1u64 << 53) as f64;
                (std::f64::consts::FRAC_PI_2 * u).sin().powi(2)
            })
            .collect();
        Self {
            k,
            rates,
            spec: serde_json::json!({
                "init_ms": 100, "run_ms": run_ms, "run_sigma": 1.0, "eval_ms": 200,
            }),
        }
    }

    /// Prompt `index` as a task (a sample of it).
    fn prompt(&self, index: usize) -> Task {
        assert!(
            index < self.rates.len(),
            "the prompt pool ran out: make it larger"
        );
        let mut spec = self.spec.clone();
        spec["pass_rate"] = self.rates[index].into();
        Task::new("synthetic", spec)
    }

    /// The G samples of prompt `index`, as the group `p<index>`.
    fn group(&self, index: usize) -> Vec<Task> {
        (0..G)
            .map(|_| {
                let mut t = self.prompt(index);
                t.group_id = Some(format!("p{index}"));
                t
            })
            .collect()
    }
}

fn splitmix64(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// What one strategy's run measured.
struct Run {
    /// First submit to the K-th informative group in the trainer's hands.
    to_k: f64,
    /// First submit to the last job of the strategy ended (the slots free again).
    drained: f64,
    /// Groups launched.
    groups: usize,
    /// Sandbox seconds: every started job's INIT start to its end.
    sandbox: f64,
    /// The service's own estimate of the sandbox seconds early cancel saved (c only).
    estimated_saved: f64,
    /// Mean wait between a job's stages (ms).
    handoff_ms: f64,
}

/// A group of G results is informative when every sample ran to its end and the
/// rewards are not all equal (the service's default rule).
fn informative(results: &[JobResult]) -> bool {
    let rewards: Vec<f64> = results
        .iter()
        .filter(|r| r.status == Status::Done)
        .filter_map(|r| r.reward)
        .collect();
    rewards.len() == G && rewards.iter().any(|r| *r != rewards[0])
}

/// The sandbox seconds of `batch`'s jobs (once every one has ended), and the mean wait
/// between one stage's end and the next one's start (ms), for the log.
async fn sandbox_seconds(env: &Env, batch: &str) -> (f64, f64) {
    let jobs: Vec<Job> = env.client.batch_jobs(batch).await.unwrap();
    let sandbox = jobs
        .iter()
        .map(|j| {
            assert!(j.status.is_terminal(), "job {} has not ended", j.id);
            match (j.timings.init.started_at, j.finished_at) {
                (Some(start), Some(end)) => (end - start).max(0) as f64 / 1000.0,
                _ => 0.0,
            }
        })
        .sum();
    let gaps: Vec<i64> = jobs
        .iter()
        .map(|j| &j.timings)
        .flat_map(|t| {
            [
                (t.init.finished_at, t.run.started_at),
                (t.run.finished_at, t.eval.started_at),
            ]
        })
        .filter_map(|(end, start)| Some(start? - end?))
        .collect();
    let handoff = gaps.iter().sum::<i64>() as f64 / gaps.len().max(1) as f64;
    (sandbox, handoff)
}

/// (a): rounds of K prompts, each waited for whole, until K informative groups.
async fn regenerate(env: &Env, w: &Workload, tag: &str) -> Run {
    let t = Instant::now();
    let (mut accepted, mut next, mut rounds) = (0, 0, Vec::new());
    while accepted < w.k {
        let id = format!("{tag}-r{}", rounds.len());
        let tasks: Vec<Task> = (next..next + w.k).flat_map(|p| w.group(p)).collect();
        next += w.k;
        env.client.submit(&tasks, Some(&id)).await.unwrap();
        let results = env.client.collect_results(&id, tasks.len()).await.unwrap();
        let mut groups: HashMap<String, Vec<JobResult>> = HashMap::new();
        for r in results {
            groups
                .entry(r.group_id.clone().unwrap())
                .or_default()
                .push(r);
        }
        accepted += groups.values().filter(|g| informative(g)).count();
        rounds.push(id);
    }
    let to_k = t.elapsed().as_secs_f64();
    let (mut sandbox, mut handoff_ms) = (0.0, 0.0);
    for id in &rounds {
        let (s, h) = sandbox_seconds(env, id).await;
        sandbox += s;
        handoff_ms += h / rounds.len() as f64;
    }
    Run {
        to_k,
        drained: to_k,
        groups: next,
        sandbox,
        estimated_saved: 0.0,
        handoff_ms,
    }
}

/// (b): K groups in flight, the next prompt launched as each group ends, nothing
/// cancelled once K informative groups are in.
async fn replenish(env: &Env, w: &Workload, id: &str) -> Run {
    let t = Instant::now();
    let mut launched = 0;
    for _ in 0..w.k {
        env.client
            .submit(&w.group(launched), Some(id))
            .await
            .unwrap();
        launched += 1;
    }
    let mut groups: HashMap<String, Vec<JobResult>> = HashMap::new();
    let (mut decided, mut accepted, mut to_k, mut after) = (0, 0, None, 0);
    while decided < launched {
        let page = env.client.results(Some(id), after, 5000).await.unwrap();
        after = page.next_cursor;
        for r in page.results {
            let group = groups.entry(r.group_id.clone().unwrap()).or_default();
            group.push(r);
            if group.len() < G {
                continue;
            }
            decided += 1;
            if accepted < w.k && informative(group) {
                accepted += 1;
                if accepted == w.k {
                    to_k = Some(t.elapsed().as_secs_f64());
                }
            }
            if accepted < w.k {
                env.client
                    .submit(&w.group(launched), Some(id))
                    .await
                    .unwrap();
                launched += 1;
            }
        }
    }
    let drained = t.elapsed().as_secs_f64();
    let (sandbox, handoff_ms) = sandbox_seconds(env, id).await;
    Run {
        to_k: to_k.expect("K informative groups"),
        drained,
        groups: launched,
        sandbox,
        estimated_saved: 0.0,
        handoff_ms,
    }
}

/// (c): the service's sampling batch over the whole pool.
async fn sampling_batch(env: &Env, w: &Workload, id: &str) -> Run {
    let req = BatchRequest {
        batch_id: Some(id.to_string()),
        prompts: (0..w.rates.len()).map(|p| w.prompt(p)).collect(),
        group_size: i64::try_from(G).unwrap(),
        target_groups: i64::try_from(w.k).unwrap(),
        max_groups_in_flight: Some(i64::try_from(w.k).unwrap()),
        max_groups: None,
        informative: Default::default(),
        policy_version: Some(1),
        max_staleness: None,
        on_cancel: Default::default(),
        carry_from: None,
    };
    let t = Instant::now();
    env.client.submit_sampling(&req).await.unwrap();
    let (mut got, mut after) = (0, 0);
    while got < w.k {
        let page = env.client.sampling_groups(id, after, 5000).await.unwrap();
        assert!(
            !page.groups.is_empty() || page.status == SamplingStatus::Running,
            "the batch ended {:?} short of K: make the pool larger",
            page.status
        );
        got += page.groups.len();
        after = page.next_cursor;
    }
    let to_k = t.elapsed().as_secs_f64();
    // Every launched sample gets a result (done, or cancelled by the early cancel),
    // and the counters are read once all of them are counted.
    let launched = loop {
        let view = env.client.sampling_batch(id).await.unwrap();
        if view.batch.status != SamplingStatus::Running {
            break usize::try_from(view.batch.counters.groups_launched).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    env.client.collect_results(id, launched * G).await.unwrap();
    let drained = t.elapsed().as_secs_f64();
    let view = env.client.sampling_batch(id).await.unwrap();
    let (sandbox, handoff_ms) = sandbox_seconds(env, id).await;
    Run {
        to_k,
        drained,
        groups: launched,
        sandbox,
        estimated_saved: view.batch.counters.sandbox_ms_saved as f64 / 1000.0,
        handoff_ms,
    }
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[common::rank(xs.len(), 0.5)]
}

/// The medians of one strategy's runs, for the table.
struct Summary {
    to_k: f64,
    drained: f64,
    groups: f64,
    sandbox: f64,
    estimated_saved: f64,
    runs: String,
}

fn summarize(runs: &[Run]) -> Summary {
    let of = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    Summary {
        to_k: of(|r| r.to_k),
        drained: of(|r| r.drained),
        groups: of(|r| r.groups as f64),
        sandbox: of(|r| r.sandbox),
        estimated_saved: of(|r| r.estimated_saved),
        runs: runs
            .iter()
            .map(|r| format!("{:.1}", r.to_k))
            .collect::<Vec<_>>()
            .join(", "),
    }
}

async fn compare(quick: bool) -> Vec<String> {
    let w = Workload::new(quick);
    let repeats = if quick { 1 } else { 3 };
    let slots = w.k * G;
    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 0..repeats {
        for strategy in ["a", "b", "c"] {
            let env = start(|s| {
                for st in [&mut s.stages.init, &mut s.stages.run, &mut s.stages.eval] {
                    st.concurrency = slots;
                }
            })
            .await;
            let tag = format!("{strategy}{rep}");
            let run = match strategy {
                "a" => regenerate(&env, &w, &tag).await,
                "b" => replenish(&env, &w, &tag).await,
                _ => sampling_batch(&env, &w, &tag).await,
            };
            eprintln!(
                "run {rep} ({strategy}): K groups after {:.2} s, drained after {:.2} s, {} groups, {:.1} sandbox-s, {:.0} ms between stages, {:.1} s saved by the service's estimate",
                run.to_k, run.drained, run.groups, run.sandbox, run.handoff_ms, run.estimated_saved
            );
            match strategy {
                "a" => a.push(run),
                "b" => b.push(run),
                _ => c.push(run),
            }
            env.shutdown.cancel();
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let (a, b, c) = (summarize(&a), summarize(&b), summarize(&c));
    let k = w.k;
    let speedup = a.to_k / c.to_k;
    let saved = b.sandbox - c.sandbox;
    vec![
        format!(
            "| time to K = {k} informative groups of G = {G}, sampling batch vs (a) whole-batch regeneration | {:.2} s (runs {}; {:.0} groups launched) | (a) {:.2} s (runs {}; {:.0} groups in {:.1} rounds) | {speedup:.2}× faster | ≥ 1.5×: {} |",
            c.to_k,
            c.runs,
            c.groups,
            a.to_k,
            a.runs,
            a.groups,
            a.groups / k as f64,
            if speedup >= 1.5 { "met" } else { "NOT met" }
        ),
        format!(
            "| the same vs (b) replenishment without early cancel | {:.2} s to K; all ended at {:.2} s; {:.0} sandbox-s | (b) {:.2} s to K; all ended at {:.2} s; {:.0} sandbox-s | early cancel saved {saved:.0} sandbox-s ({:.0}% of (b)); the service's own estimate: {:.0} s | reported |",
            c.to_k,
            c.drained,
            c.sandbox,
            b.to_k,
            b.drained,
            b.sandbox,
            100.0 * saved / b.sandbox,
            c.estimated_saved,
        ),
        format!(
            "| sandbox time per informative group | {:.1} sandbox-s | (a) {:.1}; (b) {:.1} sandbox-s | {:.2}× (a)'s, {:.2}× (b)'s | reported |",
            c.sandbox / k as f64,
            a.sandbox / k as f64,
            b.sandbox / k as f64,
            c.sandbox / a.sandbox,
            c.sandbox / b.sandbox,
        ),
    ]
}

fn main() {
    common::run_table("sampling", compare);
}
