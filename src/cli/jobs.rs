//! `rollout submit`, `rollout results` and `rollout cancel`: plain jobs from the
//! command line.

use std::io::Write;

use rollout::client::{Client, job_labels};
use rollout::domain::{JobResult, Status};

use super::table::{Align, Table, opt_f64};
use super::tasks::TaskFiles;

/// What `rollout submit` ended with, for its exit status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Submitted {
    /// Submitted (and, with `--wait`, every job ended `done` or was cancelled).
    Ok,
    /// With `--wait`: this many jobs ended `failed` or `timed_out`.
    Failed(u64),
}

/// `rollout submit`: the tasks into `batch` (a new one by default) in chunks; prints the
/// batch id, and with `wait` follows the batch to its summary with the reasons jobs
/// did not end `done`.
pub async fn submit(
    client: &Client,
    files: &TaskFiles,
    batch: Option<String>,
    wait: bool,
) -> anyhow::Result<Submitted> {
    const CHUNK: usize = 5000;
    let mut batch_id = batch;
    let mut total = 0u64;
    let mut duplicates = 0u64;
    let mut labels = std::collections::HashMap::new();
    // Chunks keep each request under the gateway's limits; the batch id of the first
    // chunk is reused so the whole file is one batch.
    for (i, chunk) in files.tasks.chunks(CHUNK).enumerate() {
        let resp = client
            .submit(chunk, batch_id.as_deref())
            .await
            .map_err(|e| files.explain(i * CHUNK, e))?;
        total += resp.jobs.len() as u64;
        duplicates += resp.jobs.iter().filter(|j| j.duplicate).count() as u64;
        labels.extend(job_labels(chunk, &resp.jobs));
        batch_id = Some(resp.batch_id);
    }
    let batch_id = batch_id.expect("a task file holds at least one task");
    println!("{batch_id}");
    eprintln!(
        "submitted {total} tasks to batch {batch_id} ({duplicates} already known by client_id)"
    );
    if !wait {
        return Ok(Submitted::Ok);
    }
    let summary = client.follow_batch(&batch_id, total, &labels).await?;
    eprintln!("{summary}");
    Ok(match summary.failed_jobs() {
        0 => Submitted::Ok,
        n => Submitted::Failed(n),
    })
}

/// Options of `rollout results`.
#[derive(Debug, Clone)]
pub struct ResultsArgs {
    /// Only this batch.
    pub batch: Option<String>,
    /// Start after this `seq`.
    pub after: i64,
    /// Keep waiting for new results instead of stopping at the last one there is.
    pub follow: bool,
    /// Stop after this many.
    pub count: Option<u64>,
    /// Print each result as one JSON line instead of a table row.
    pub json: bool,
}

/// `rollout results`: results in delivery order, as JSON lines or one row each; with
/// `follow`, long-polls for more until `count` have come (or forever).
pub async fn results(client: &Client, args: ResultsArgs) -> anyhow::Result<()> {
    let mut after = args.after;
    let mut shown = 0u64;
    let mut stdout = std::io::stdout().lock();
    let mut header = !args.json;
    loop {
        let wait_ms = if args.follow { 20_000 } else { 0 };
        let page = client
            .results(args.batch.as_deref(), after, wait_ms)
            .await?;
        after = page.next_cursor;
        let room = args.count.map_or(usize::MAX, |c| {
            usize::try_from(c.saturating_sub(shown)).unwrap_or(usize::MAX)
        });
        let take: Vec<JobResult> = page.results.into_iter().take(room).collect();
        shown += take.len() as u64;
        if args.json {
            for r in &take {
                writeln!(stdout, "{}", serde_json::to_string(r)?)?;
            }
        } else if !take.is_empty() || header {
            // Each page is aligned on its own; the header comes with the first.
            let text = result_table(&take).render();
            for line in text.lines().skip(usize::from(!header)) {
                writeln!(stdout, "{line}")?;
            }
            header = false;
        }
        stdout.flush()?;
        let done = args.count.is_some_and(|c| shown >= c);
        if done || (!args.follow && take.is_empty()) {
            return Ok(());
        }
    }
}

/// Results as table rows: where they are, how they ended, with what.
fn result_table(results: &[JobResult]) -> Table {
    let mut t = Table::new(&[
        ("SEQ", Align::Right),
        ("JOB", Align::Left),
        ("CLIENT ID", Align::Left),
        ("STATUS", Align::Left),
        ("REWARD", Align::Right),
        ("FINISH", Align::Left),
        ("ERROR", Align::Left),
    ]);
    for r in results {
        let finish = r.output["run"]["finish_reason"].as_str().unwrap_or("-");
        t.row(vec![
            r.seq.to_string(),
            r.job_id.clone(),
            r.client_id.clone().unwrap_or_else(|| "-".into()),
            r.status.as_str().to_string(),
            opt_f64(r.reward, 3),
            finish.to_string(),
            if r.status == Status::Done {
                String::new()
            } else {
                rollout::client::failure_reason(r.error.as_deref())
            },
        ]);
    }
    t
}

/// `rollout cancel`: each job cancelled (a job that already ended keeps its result),
/// or a whole batch; says what happened to each.
pub async fn cancel(client: &Client, jobs: &[String], batch: Option<&str>) -> anyhow::Result<()> {
    if let Some(batch) = batch {
        match client.cancel_batch(batch).await? {
            rollout::api::batches::CancelledBatch::Plain(p) => eprintln!(
                "batch {batch} cancelled: {} live jobs are being cancelled; {} of {} had already ended",
                p.cancelling, p.batch.finished, p.batch.submitted
            ),
            rollout::api::batches::CancelledBatch::Sampling(v) => eprintln!(
                "sampling batch {batch} is {}: {} live samples are being cancelled, {} groups accepted",
                v.batch.status.as_str(),
                v.cancelling.unwrap_or(0),
                v.batch.counters.informative
            ),
        }
    }
    let mut missing = 0;
    for id in jobs {
        match client.cancel(id).await {
            Ok(r) => eprintln!("job {id} ended {}", r.status.as_str()),
            // 409: it had ended before; its result stands, which is not a failure.
            Err(rollout::client::ClientError::Api {
                status: 409,
                message,
                ..
            }) => eprintln!("job {id}: {message}; its result stands"),
            Err(e @ rollout::client::ClientError::Api { status: 404, .. }) => {
                eprintln!("job {id}: {e}");
                missing += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
    anyhow::ensure!(
        missing == 0,
        "{missing} of the {} job ids given name no job",
        jobs.len()
    );
    Ok(())
}
