//! `rollout serve`, `rollout migrate` and `rollout up`: the commands that run the
//! service (or prepare its database) rather than talk to a running one.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use rollout::client::Client;
use rollout::config::Settings;
use rollout::wiring;

use super::tasks::TaskFiles;

/// `rollout serve`: the gateway (with the reconciler) until a signal, then the NATS
/// connection drained so nothing published is lost.
pub async fn serve(settings: Settings) -> anyhow::Result<()> {
    let shutdown = rollout::shutdown::on_signals(|| std::process::exit(130));
    let settings = Arc::new(settings);
    let deps = wiring::connect(settings.clone(), "rollout-gateway", true).await?;
    let listener = wiring::bind(&settings.gateway.listen).await?;
    wiring::run_gateway(deps.clone(), listener, shutdown).await?;
    let _ = deps.queue.client().drain().await;
    Ok(())
}

/// `rollout migrate`: connecting to the store applies its migrations.
pub async fn migrate(settings: &Settings) -> anyhow::Result<()> {
    let url = settings.database_url();
    rollout::store::connect(&url, 1)
        .await
        .with_context(|| format!("migrating {}", rollout::config::redact_url(&url)))?;
    eprintln!(
        "migrations applied to {}",
        rollout::config::redact_url(&url)
    );
    Ok(())
}

/// Options of `rollout up`.
#[derive(Debug)]
pub struct UpOptions {
    /// Workers of each stage.
    pub workers: usize,
    /// Tasks to submit once everything runs, with the batch to put them in.
    pub submit: Option<(TaskFiles, String)>,
    /// Where the log goes, when not to the terminal (said in the start-up line).
    pub log_file: Option<PathBuf>,
    /// Stop once the submitted batch has all its results.
    pub exit_when_done: bool,
}

/// `rollout up`: everything on this machine until a signal (or, with `exit_when_done`,
/// until the submitted batch is finished); fails when a submitted batch was refused, or
/// had results but none of them `done`.
pub async fn up(
    settings: Settings,
    mut opts: UpOptions,
    submit: &[PathBuf],
    batch: Option<String>,
) -> anyhow::Result<()> {
    anyhow::ensure!(opts.workers >= 1, "--workers must be at least 1");
    opts.submit = if submit.is_empty() {
        None
    } else {
        let files = TaskFiles::load(submit)?;
        let id = batch.unwrap_or_else(|| format!("up-{}", uuid::Uuid::now_v7().simple()));
        Some((files, id))
    };
    let shutdown = rollout::shutdown::on_signals(|| std::process::exit(130));
    let running = wiring::start_up(settings, opts.workers, shutdown.clone()).await?;
    let logs = match &opts.log_file {
        Some(f) => format!(", log {} (warnings also here)", f.display()),
        None => String::new(),
    };
    eprintln!(
        "rollout is up: status page http://{}/ (API described at /openapi.json), {} \
         worker(s) per stage, node `{}`, database {}{logs}. Press Ctrl-C to stop.",
        running.addr,
        opts.workers,
        running.settings.node.name,
        rollout::config::redact_url(&running.settings.database_url())
    );
    let mut followed = None;
    if let Some((files, batch_id)) = opts.submit {
        let client = Client::new(&format!("http://{}", running.addr))
            .with_token(Some(running.settings.gateway.token.clone()));
        let batch = &files.tasks;
        let follow = async {
            let resp = client
                .submit(batch, Some(&batch_id))
                .await
                .map_err(|e| files.explain(0, e))?;
            eprintln!(
                "submitted {} tasks as batch {}",
                resp.jobs.len(),
                resp.batch_id
            );
            let labels = rollout::client::job_labels(batch, &resp.jobs);
            let summary = client
                .follow_batch(&resp.batch_id, resp.jobs.len() as u64, &labels)
                .await?;
            anyhow::Ok(summary)
        };
        tokio::select! {
            r = follow => {
                if let Ok(s) = &r {
                    eprintln!("batch {batch_id} finished: {s}");
                }
                // A refused batch stops everything, so the command exits non-zero.
                if r.is_err() || opts.exit_when_done {
                    shutdown.cancel();
                }
                followed = Some(r);
            }
            () = shutdown.cancelled() => {}
        }
    }
    running.finish().await?;
    match followed {
        Some(Err(e)) => Err(e.context("submitting the batch failed")),
        Some(Ok(s)) if s.results > 0 && s.done == 0 => {
            anyhow::bail!("no job of the batch finished `done`")
        }
        _ => Ok(()),
    }
}
