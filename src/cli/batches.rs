//! `rollout batches`: the latest batches, a dynamic-sampling batch submitted from a
//! prompt file, and one batch's groups.

use rollout::api::batches::{BatchRequest, BatchView};
use rollout::client::{Client, ClientError};
use rollout::domain::sampling::{AcceptedGroup, SamplingStatus};

use super::args::BatchesAction;
use super::table::{Align, Table, opt_f64};
use super::tasks::TaskFiles;

/// `rollout batches`: the action named.
pub async fn run(client: &Client, action: BatchesAction) -> anyhow::Result<()> {
    match action {
        BatchesAction::List { limit } => list(client, limit).await,
        BatchesAction::Show { id } => show(client, &id).await,
        BatchesAction::Submit {
            file,
            group_size,
            target_groups,
            batch,
            max_groups_in_flight,
            max_groups,
            policy_version,
            max_staleness,
            wait,
        } => {
            let files = TaskFiles::load(&[file])?;
            let args = SamplingArgs {
                batch,
                group_size,
                target_groups,
                max_groups_in_flight,
                max_groups,
                policy_version,
                max_staleness,
                wait,
            };
            submit(client, &files, args).await
        }
    }
}

/// `rollout batches list`: the latest `limit` batches with their counters; sampling
/// batches with their status and groups.
pub async fn list(client: &Client, limit: i64) -> anyhow::Result<()> {
    let d = client.dashboard_latest(limit).await?;
    let sampling: std::collections::HashMap<_, _> = d
        .sampling
        .iter()
        .map(|s| (s.batch_id.as_str(), s))
        .collect();
    let mut t = Table::new(&[
        ("BATCH", Align::Left),
        ("SAMPLING", Align::Left),
        ("SUBMITTED", Align::Right),
        ("ENDED", Align::Right),
        ("DONE", Align::Right),
        ("FAILED", Align::Right),
        ("TIMED OUT", Align::Right),
        ("CANCELLED", Align::Right),
        ("MEAN REWARD", Align::Right),
        ("LAST RESULT", Align::Left),
    ]);
    for b in &d.batches {
        let sampled = sampling.get(b.batch_id.as_str()).map_or_else(
            || "-".to_string(),
            |s| format!("{} {}/{} groups", s.status, s.informative, s.target_groups),
        );
        t.row(vec![
            b.batch_id.clone(),
            sampled,
            b.submitted.to_string(),
            b.finished.to_string(),
            b.done.to_string(),
            b.failed.to_string(),
            b.timed_out.to_string(),
            b.cancelled.to_string(),
            opt_f64(b.reward_mean, 3),
            b.last_result_at
                .map_or_else(|| "-".to_string(), |at| ago(d.generated_at, at)),
        ]);
    }
    if d.batches.is_empty() {
        eprintln!("no batches yet");
    } else {
        println!("{}", t.render());
    }
    Ok(())
}

/// How long before `now` `at` was, in words (both epoch ms).
fn ago(now: i64, at: i64) -> String {
    let s = (now - at).max(0) / 1000;
    match s {
        0..=119 => format!("{s} s ago"),
        120..=7199 => format!("{} min ago", s / 60),
        _ => format!("{} h ago", s / 3600),
    }
}

/// Options of `rollout batches submit`.
#[derive(Debug, Clone)]
pub struct SamplingArgs {
    /// Batch id (default: a fresh one).
    pub batch: Option<String>,
    /// G.
    pub group_size: i64,
    /// K.
    pub target_groups: i64,
    /// Groups running at once.
    pub max_groups_in_flight: Option<i64>,
    /// Prompts to try at most.
    pub max_groups: Option<i64>,
    /// Stamped on every job.
    pub policy_version: Option<i64>,
    /// The staleness bound.
    pub max_staleness: Option<i64>,
    /// Follow the batch until it ends, printing each accepted group.
    pub wait: bool,
}

/// `rollout batches submit`: the prompt file as one dynamic-sampling batch; prints its
/// id, and with `wait` each accepted group as it is decided, then the batch's end.
pub async fn submit(client: &Client, files: &TaskFiles, a: SamplingArgs) -> anyhow::Result<()> {
    let body = serde_json::json!({
        "batch_id": a.batch,
        "prompts": files.tasks,
        "group_size": a.group_size,
        "target_groups": a.target_groups,
        "max_groups_in_flight": a.max_groups_in_flight,
        "max_groups": a.max_groups,
        "policy_version": a.policy_version,
        "max_staleness": a.max_staleness,
    });
    let req: BatchRequest = serde_json::from_value(body)?;
    let view = client
        .submit_sampling(&req)
        .await
        .map_err(|e| files.explain(0, e))?;
    let id = view.batch.id.clone();
    println!("{id}");
    eprintln!(
        "sampling batch {id}: {} prompts, {} samples each, {} informative groups wanted{}",
        view.batch.prompt_count,
        a.group_size,
        a.target_groups,
        if view.duplicate {
            " (it existed already)"
        } else {
            ""
        }
    );
    if !a.wait {
        return Ok(());
    }
    let mut after = 0;
    loop {
        let page = client.sampling_groups(&id, after, 20_000).await?;
        for g in &page.groups {
            eprintln!("{}", group_line(g));
        }
        after = page.next_cursor;
        if page.status != SamplingStatus::Running && page.groups.is_empty() {
            break;
        }
    }
    let view = client.sampling_batch(&id).await?;
    eprintln!("{}", ended_line(&view));
    Ok(())
}

/// One accepted group in a line: its rank, group, mean and each sample's reward.
fn group_line(g: &AcceptedGroup) -> String {
    format!(
        "group {} ({}, prompt {}): mean reward {}, rewards {}",
        g.rank,
        g.group_id,
        g.prompt_index,
        opt_f64(g.reward_mean, 3),
        rewards(g)
    )
}

/// A group's samples' rewards, in the order of their results.
fn rewards(g: &AcceptedGroup) -> String {
    g.results
        .iter()
        .map(|r| opt_f64(r.reward, 2))
        .collect::<Vec<_>>()
        .join(" ")
}

/// How a sampling batch stands: status, reason and its counters.
fn ended_line(v: &BatchView) -> String {
    let b = &v.batch;
    let c = &b.counters;
    format!(
        "batch {} is {}{}: {} informative of {} wanted, {} uniform, {} incomplete, {} stale; \
         {} groups launched, {} decided; {} samples cancelled early",
        b.id,
        b.status.as_str(),
        b.reason
            .as_ref()
            .map(|r| format!(" ({r})"))
            .unwrap_or_default(),
        c.informative,
        b.params.target_groups,
        c.uniform,
        c.incomplete,
        c.stale_groups,
        c.groups_launched,
        c.groups_decided,
        c.jobs_saved
    )
}

/// `rollout batches show`: a sampling batch's status and every group it launched, with
/// its verdict, rank when accepted and each sample's reward; a plain batch's counters.
pub async fn show(client: &Client, id: &str) -> anyhow::Result<()> {
    let view = match client.sampling_batch(id).await {
        Ok(v) => v,
        Err(ClientError::Api { status: 404, .. }) => {
            // Not a sampling batch: a plain one has counters only.
            let s = client.status(Some(id)).await?;
            let Some(b) = s.batch else {
                anyhow::bail!("no batch with id `{id}`");
            };
            println!(
                "batch {}: {} submitted, {} ended ({} done, {} failed, {} timed out, {} cancelled, {} stale); not a sampling batch, so it has no groups",
                b.id, b.submitted, b.finished, b.done, b.failed, b.timed_out, b.cancelled, b.stale
            );
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    println!("{}", ended_line(&view));
    let verdicts = client.sampling_verdicts(id).await?;
    let jobs = client.batch_jobs(id).await?;
    let mut t = Table::new(&[
        ("GROUP", Align::Left),
        ("PROMPT", Align::Right),
        ("VERDICT", Align::Left),
        ("RANK", Align::Right),
        ("MEAN", Align::Right),
        ("STD", Align::Right),
        ("REWARDS", Align::Left),
    ]);
    for g in &verdicts.groups {
        let rewards = match &g.carried_from {
            Some(from) => format!("(in batch {from})"),
            None => jobs
                .iter()
                .filter(|j| j.group_id.as_deref() == Some(g.group_id.as_str()))
                .map(|j| {
                    j.reward
                        .map_or_else(|| j.status.as_str().to_string(), |r| format!("{r:.2}"))
                })
                .collect::<Vec<_>>()
                .join(" "),
        };
        t.row(vec![
            g.group_id.clone(),
            g.prompt_index.to_string(),
            g.state.clone(),
            g.accepted_rank
                .map_or_else(|| "-".into(), |r| r.to_string()),
            opt_f64(g.reward_mean, 3),
            opt_f64(g.reward_std, 3),
            rewards,
        ]);
    }
    if verdicts.groups.is_empty() {
        println!("no group launched yet");
    } else {
        println!("{}", t.render());
    }
    if verdicts.more {
        println!("(only the first groups launched are shown)");
    }
    Ok(())
}
