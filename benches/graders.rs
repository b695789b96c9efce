//! Grader benchmark (not a test): run with `cargo bench --bench graders`.
//!
//! EVAL throughput and sandbox time per job for each grader, on the service as
//! `rollout up` runs it in this process (bubblewrap sandboxes, SQLite, a private
//! nats-server), with 4 EVAL slots. Every job is a `shell` task whose RUN writes a correct
//! answer and whose EVAL grades it:
//!
//! - **command** `true`: the baseline, a fresh EVAL sandbox that does nothing;
//! - **math**: a boxed fraction against its truth, in the EVAL worker's process;
//! - **code (3 I/O cases)**: a Python program run on three stdin/stdout cases;
//! - **code (pytest)**: two unit tests run by pytest;
//! - **swe**: the `clamp` repository of `examples/swe` (cloned at `base_commit`), the gold
//!   patch, the test patch, pytest on the named tests.
//!
//! Per grader: the median EVAL stage time (claim to result), EVAL throughput (jobs over
//! the time from the first EVAL start to the last result) and sandbox seconds per job
//! (the RUN sandbox from INIT start to RUN end, plus the EVAL stage when the grader
//! needs a sandbox: the math grader needs none). Ratios are against the `command`
//! baseline measured in the same run. `BENCH_QUICK=1` runs fewer jobs.

use std::path::Path;
use std::time::Duration;

use rollout::domain::{Job, Status, Task};
use serde_json::{Value, json};

mod common;
#[path = "common/service.rs"]
mod service;

/// EVAL slots.
const EVAL_SLOTS: usize = 4;

/// A grader under test: its name and the task that exercises it.
struct Case {
    name: &'static str,
    sandboxed: bool,
    task: Box<dyn Fn(usize) -> Task>,
}

fn shell(steps: Value, grader: Value, sandbox: Value) -> Task {
    Task::new(
        "shell",
        json!({"steps": steps, "grader": grader, "sandbox": sandbox}),
    )
}

fn write(path: &str, text: &str) -> Value {
    json!({"tool": "file", "args": {"command": "create", "path": path, "file_text": text}})
}

fn cases(repos: &Path) -> Vec<Case> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let instance: Value = serde_json::from_str(
        std::fs::read_to_string(root.join("examples/swe/instances.jsonl"))
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let patches: Value = serde_json::from_str(
        &std::fs::read_to_string(root.join("examples/swe/patches.json")).unwrap(),
    )
    .unwrap();
    let gold = patches[instance["instance_id"].as_str().unwrap()]["gold"]
        .as_str()
        .unwrap()
        .to_string();
    let clamp = repos.join("clamp");
    vec![
        Case {
            name: "command `true` (baseline)",
            sandboxed: true,
            task: Box::new(|_| {
                shell(
                    json!([write("a.txt", "x")]),
                    json!({"type": "command", "command": "true"}),
                    json!({}),
                )
            }),
        },
        Case {
            name: "math",
            sandboxed: false,
            task: Box::new(|i| {
                shell(
                    json!([{"tool": "bash", "args": {"command": format!("echo 'so \\boxed{{\\frac{{{i}}}{{{}}}}}'", i + 1)}}]),
                    json!({"type": "math", "answer": format!("\\frac{{{}}}{{{}}}", 2 * i, 2 * i + 2)}),
                    json!({}),
                )
            }),
        },
        Case {
            name: "code (3 I/O cases)",
            sandboxed: true,
            task: Box::new(|_| {
                shell(
                    json!([write(
                        "solution.py",
                        "print(sum(map(int, input().split())))\n"
                    )]),
                    json!({"type": "code", "run": "python3 solution.py", "cases": [
                        {"stdin": "1 2\n", "stdout": "3"}, {"stdin": "5 5\n", "stdout": "10"},
                        {"stdin": "-1 1\n", "stdout": "0"}]}),
                    json!({}),
                )
            }),
        },
        Case {
            name: "code (pytest, 2 tests)",
            sandboxed: true,
            task: Box::new(|_| {
                shell(
                    json!([write("calc.py", "def add(a, b):\n    return a + b\n")]),
                    json!({"type": "code", "test_command": "python3 -m pytest -rA -p no:cacheprovider test_calc.py",
                        "tests": {"test_calc.py": "from calc import add\n\ndef test_a():\n    assert add(1, 2) == 3\n\ndef test_b():\n    assert add(-1, 1) == 0\n"}}),
                    json!({}),
                )
            }),
        },
        Case {
            name: "swe (tiny repository)",
            sandboxed: true,
            task: Box::new(move |_| {
                let quoted = format!("'{}'", gold.replace('\'', "'\\''"));
                shell(
                    json!([{"tool": "bash", "args": {"command": format!("printf '%s' {quoted} | git apply")}}]),
                    json!({"type": "swe", "instance": instance, "repo_url": clamp}),
                    json!({}),
                )
            }),
        },
    ]
}

/// One grader's figures.
struct Figures {
    eval_median_ms: f64,
    eval_per_s: f64,
    sandbox_s_per_job: f64,
}

async fn measure(env: &service::Env, case: &Case, n: usize, batch: &str) -> Figures {
    let tasks: Vec<Task> = (0..n).map(|i| (case.task)(i)).collect();
    let resp = env.client.submit(&tasks, Some(batch)).await.unwrap();
    let summary = env
        .client
        .follow_batch(&resp.batch_id, n as u64, &Default::default())
        .await
        .unwrap();
    assert_eq!(summary.done, n as u64, "{}: {summary}", case.name);
    assert!(
        (summary.reward_sum - n as f64).abs() < 1e-9,
        "{}: every answer is right, yet {summary}",
        case.name
    );
    let jobs: Vec<Job> = env
        .deps
        .store
        .list_jobs(&rollout::store::JobQuery {
            batch: Some(batch.into()),
            status: Some(Status::Done),
            cursor: None,
            limit: 100_000,
            max_bytes: i64::MAX,
        })
        .await
        .unwrap()
        .jobs;
    let ms = |a: Option<i64>, b: Option<i64>| (b.unwrap() - a.unwrap()) as f64;
    let mut evals: Vec<f64> = jobs
        .iter()
        .map(|j| ms(j.timings.eval.started_at, j.finished_at))
        .collect();
    evals.sort_by(f64::total_cmp);
    let first = jobs
        .iter()
        .filter_map(|j| j.timings.eval.started_at)
        .min()
        .unwrap();
    let last = jobs.iter().filter_map(|j| j.finished_at).max().unwrap();
    let sandbox_ms: f64 = jobs
        .iter()
        .map(|j| {
            let run = ms(j.timings.init.started_at, j.timings.run.finished_at);
            let eval = if case.sandboxed {
                ms(j.timings.eval.started_at, j.finished_at)
            } else {
                0.0
            };
            run + eval
        })
        .sum();
    Figures {
        eval_median_ms: evals[common::rank(evals.len(), 0.5)],
        eval_per_s: n as f64 / ((last - first).max(1) as f64 / 1000.0),
        sandbox_s_per_job: sandbox_ms / 1000.0 / n as f64,
    }
}

fn main() {
    if !common::started_by_cargo_bench("graders") {
        return;
    }
    let quick = common::quick();
    let n = if quick { 8 } else { 48 };
    let repos = tempfile::tempdir().unwrap();
    let built = std::process::Command::new("python3")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/make-swe-examples.py"))
        .arg("--repos")
        .arg(repos.path())
        .status()
        .unwrap();
    assert!(built.success(), "building the example repositories failed");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap();
    let rows = rt.block_on(async {
        let env = service::start(|s| s.stages.eval.concurrency = EVAL_SLOTS).await;
        let mut rows = Vec::new();
        for (i, case) in cases(repos.path()).iter().enumerate() {
            // One unmeasured job first, so nothing is cold.
            measure(&env, case, 1, &format!("warm-{i}")).await;
            rows.push((case.name, measure(&env, case, n, &format!("g{i}")).await));
        }
        env.shutdown.cancel();
        tokio::time::sleep(Duration::from_millis(200)).await;
        rows
    });
    let base = &rows[0].1;
    println!("{n} jobs per grader, {EVAL_SLOTS} EVAL slots, bubblewrap sandboxes");
    println!();
    println!(
        "| grader | EVAL median (ms) | vs baseline | EVAL jobs/s | vs baseline | sandbox-s per job | vs baseline |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (name, f) in &rows {
        println!(
            "| {name} | {:.1} | {:.2}x | {:.1} | {:.2}x | {:.2} | {:.2}x |",
            f.eval_median_ms,
            f.eval_median_ms / base.eval_median_ms,
            f.eval_per_s,
            f.eval_per_s / base.eval_per_s,
            f.sandbox_s_per_job,
            f.sandbox_s_per_job / base.sandbox_s_per_job,
        );
    }
}
