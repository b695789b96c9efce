//! `rollout replay`: a recorded episode run again against its recording.

use rollout::client::Client;

/// `rollout replay`: submits the replay of `job`, waits for its result and reports;
/// returns whether it went as the recorded episode did (no divergence, same reward).
/// With `as_policy`, prints the recording as a stand-in policy instead.
pub async fn replay(
    client: &Client,
    job: &str,
    batch: Option<String>,
    strict: bool,
    as_policy: bool,
) -> anyhow::Result<bool> {
    let original = client.job(job).await?;
    if as_policy {
        let policy = rollout::agent::replay::as_policy(&original.job)?;
        println!("{}", serde_json::to_string_pretty(&policy)?);
        return Ok(true);
    }
    let batch = batch.unwrap_or_else(|| format!("replay-{}", uuid::Uuid::now_v7().simple()));
    let task = rollout::agent::replay::replay_task(&original.job, &batch)?;
    let resp = client.submit(&[task], Some(&batch)).await?;
    let id = resp.jobs.first().map(|j| j.id.clone()).unwrap_or_default();
    eprintln!("replaying job {job} as job {id} (batch {batch})");
    let results = client.collect_results(&batch, 1).await?;
    let Some(now) = results.into_iter().find(|r| r.job_id == id) else {
        anyhow::bail!(
            "the replay's result did not arrive in batch {batch}; is another replay using it?"
        );
    };
    println!("{id}");
    let then = original.result.as_ref().and_then(|r| r.reward);
    let report = now.output["run"]["replay"].clone();
    let Ok(report) = serde_json::from_value::<rollout::agent::replay::ReplayReport>(report) else {
        eprintln!(
            "the replay ended {} without a report: {}",
            now.status.as_str(),
            now.error.as_deref().unwrap_or("no error recorded")
        );
        return Ok(false);
    };
    eprint!("{}", rollout::agent::replay::describe(&report));
    let show = |r: Option<f64>| r.map_or_else(|| "none".to_string(), |r| format!("{r}"));
    eprintln!(
        "reward: {} then, {} now (replay {})",
        show(then),
        show(now.reward),
        now.status.as_str()
    );
    let same =
        report.divergence.is_none() && report.tool_divergence.is_none() && then == now.reward;
    if strict && !same {
        eprintln!("the replay differs from the recorded episode");
    }
    Ok(same)
}
