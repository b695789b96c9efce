//! `rollout`: the gateway, admin commands and the all-in-one `up`.
//!
//! Each subcommand is a few lines over library code; see `rollout --help`.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rollout::client::{Client, read_tasks_jsonl};
use rollout::config::Settings;
use rollout::domain::{Stage, Task};
use rollout::wiring;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Rollout service for RL training of multi-turn LLM agents"
)]
struct Cli {
    /// Settings file (TOML); `ROLLOUT__SECTION__KEY` environment variables override it.
    #[arg(long, global = true, env = "ROLLOUT_CONFIG")]
    config: Option<PathBuf>,
    /// Log lines as `text` or `json` (default: the `log.json` setting).
    #[arg(long, global = true, value_enum)]
    log_format: Option<rollout::telemetry::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the HTTP gateway (and the reconciler).
    Serve,
    /// Apply database migrations and exit.
    Migrate,
    /// Submit tasks from a JSON Lines file.
    Submit {
        /// One task per line: {"kind": …, "spec": {…}, "client_id"?: …, "group_id"?: …}.
        file: PathBuf,
        /// Batch to submit into (default: a new batch).
        #[arg(long)]
        batch: Option<String>,
        /// Wait for every result, with a progress bar, then print a summary.
        #[arg(long)]
        wait: bool,
        /// Gateway URL (default: http:// + gateway.listen).
        #[arg(long, env = "ROLLOUT_GATEWAY")]
        gateway: Option<String>,
        /// The gateway's token, when it has one (default: gateway.token).
        #[arg(long, env = "ROLLOUT_GATEWAY_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Show job counts by status and stage.
    Status {
        /// Only this batch.
        #[arg(long)]
        batch: Option<String>,
        /// Gateway URL (default: http:// + gateway.listen).
        #[arg(long, env = "ROLLOUT_GATEWAY")]
        gateway: Option<String>,
        /// The gateway's token, when it has one (default: gateway.token).
        #[arg(long, env = "ROLLOUT_GATEWAY_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// Replay a finished `agent` or `agent_program` episode: its model side played back
    /// from its result (no inference backend is called), its tools run for real in a
    /// fresh sandbox, then graded. Prints where the environment first answered
    /// otherwise, and the reward then and now.
    Replay {
        /// The job to replay.
        job: String,
        /// Batch to submit the replay into (default: a new `replay-...` batch).
        #[arg(long)]
        batch: Option<String>,
        /// Exit with status 1 when the replay diverged or its reward differs.
        #[arg(long)]
        strict: bool,
        /// Print the recording as a policy file of the stand-in inference server
        /// (`rollout-scripted-llm serve --policy`) instead of replaying it.
        #[arg(long)]
        as_policy: bool,
        /// Gateway URL (default: http:// + gateway.listen).
        #[arg(long, env = "ROLLOUT_GATEWAY")]
        gateway: Option<String>,
        /// The gateway's token, when it has one (default: gateway.token).
        #[arg(long, env = "ROLLOUT_GATEWAY_TOKEN", hide_env_values = true)]
        token: Option<String>,
    },
    /// List, register and remove inference backends (through the gateway).
    Backends {
        #[command(subcommand)]
        action: BackendsAction,
        /// Gateway URL (default: http:// + gateway.listen).
        #[arg(long, env = "ROLLOUT_GATEWAY", global = true)]
        gateway: Option<String>,
        /// The gateway's token, when it has one (default: gateway.token).
        #[arg(
            long,
            env = "ROLLOUT_GATEWAY_TOKEN",
            hide_env_values = true,
            global = true
        )]
        token: Option<String>,
    },
    /// One node's workers in one process: by default INIT, RUN and EVAL, which share
    /// the node's sandboxes (`node.name`). What a Slurm job or a container runs on each
    /// machine; SIGTERM hands running work back within `stages.grace_ms`.
    Node {
        /// The stages to run, comma-separated.
        #[arg(long, value_delimiter = ',', default_value = "init,run,eval", value_parser = parse_stage)]
        stages: Vec<Stage>,
        /// Serve this process's Prometheus metrics at http://ADDR/metrics.
        #[arg(long)]
        metrics_listen: Option<String>,
    },
    /// Everything on one machine: NATS (started if none answers), SQLite under the state
    /// directory, the gateway and workers of every stage. Ctrl-C stops it all.
    Up {
        /// Workers of each stage.
        #[arg(long, default_value_t = 1)]
        workers: usize,
        /// Submit these JSON Lines files (repeat the flag for several) as one batch once
        /// up, and follow its progress.
        #[arg(long)]
        submit: Vec<PathBuf>,
        /// Batch id for --submit.
        #[arg(long)]
        batch: Option<String>,
        /// With --submit: stop when every submitted job has its result.
        #[arg(long)]
        exit_when_done: bool,
        /// Log to the terminal as the other commands do, instead of to
        /// `<state_dir>/logs/up.log` (with warnings on screen).
        #[arg(long)]
        logs_on_screen: bool,
    },
}

#[derive(Debug, Subcommand)]
enum BackendsAction {
    /// Every backend with its health and active jobs.
    List,
    /// Register a backend (or replace the one with the same id).
    Add(AddBackend),
    /// Unregister a backend.
    Remove {
        /// Its id.
        id: String,
    },
}

/// `rollout backends add`: the backend to register.
#[derive(Debug, clap::Args)]
struct AddBackend {
    /// A name unique in the pool.
    #[arg(long)]
    id: String,
    /// Base URL, e.g. http://10.0.0.5:8000.
    #[arg(long)]
    url: String,
    /// `vllm` or `sglang`.
    #[arg(long)]
    kind: String,
    /// The model it serves.
    #[arg(long)]
    model: String,
    /// The model directory (tokenizer.json, tokenizer_config.json) as the RUN
    /// workers see it.
    #[arg(long)]
    tokenizer: String,
    /// Relative capacity.
    #[arg(long, default_value_t = 1.0)]
    weight: f64,
    /// The name the server serves the model under, when it is not --model (vLLM's
    /// --served-model-name).
    #[arg(long)]
    served_model_name: Option<String>,
    /// The environment variable holding the server's --api-key (sent as a Bearer
    /// token); a variable, so the key stays out of shell history.
    #[arg(long)]
    api_key_env: Option<String>,
    /// `raw` (vLLM's default) or `processed` (SGLang, or vLLM with --logprobs-mode
    /// processed_logprobs).
    #[arg(long)]
    logprobs_mode: Option<String>,
}

fn load_tasks(path: &PathBuf) -> anyhow::Result<Vec<rollout::domain::Task>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let tasks = read_tasks_jsonl(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
    anyhow::ensure!(!tasks.is_empty(), "{} holds no tasks", path.display());
    Ok(tasks)
}

/// A client of the gateway named by `--gateway` (default: `gateway.listen`), sending the
/// token from `--token` / `ROLLOUT_GATEWAY_TOKEN` or else `gateway.token`, so a machine
/// that runs the gateway needs no extra flag.
fn gateway_client(settings: &Settings, gateway: Option<String>, token: Option<String>) -> Client {
    let url = gateway.unwrap_or_else(|| format!("http://{}", settings.gateway.listen));
    let token = token
        .filter(|t| !t.is_empty())
        .or_else(|| Some(settings.gateway.token.clone()));
    Client::new(&url).with_token(token)
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let mut settings = Settings::load(cli.config.as_deref())?;
    if let Some(f) = cli.log_format {
        f.apply(&mut settings.log);
    }
    let log_file = match &cli.command {
        Command::Up {
            logs_on_screen: false,
            ..
        } => Some(settings.state_dir.join("logs").join("up.log")),
        _ => None,
    };
    match &log_file {
        Some(file) => rollout::telemetry::init_to_file(&settings.log, file)
            .with_context(|| format!("cannot open the log file {}", file.display()))?,
        None => rollout::telemetry::init(&settings.log),
    }
    match cli.command {
        Command::Serve => serve(settings).await?,
        Command::Migrate => migrate(&settings).await?,
        Command::Submit {
            file,
            batch,
            wait,
            gateway,
            token,
        } => {
            let tasks = load_tasks(&file)?;
            let client = gateway_client(&settings, gateway, token);
            submit(&client, &tasks, batch, wait).await?;
        }
        Command::Status {
            batch,
            gateway,
            token,
        } => {
            let client = gateway_client(&settings, gateway, token);
            status(&client, batch.as_deref()).await?;
        }
        Command::Replay {
            job,
            batch,
            strict,
            as_policy,
            gateway,
            token,
        } => {
            let client = gateway_client(&settings, gateway, token);
            let same = replay(&client, &job, batch, strict, as_policy).await?;
            if strict && !same {
                std::process::exit(1);
            }
        }
        Command::Backends {
            action,
            gateway,
            token,
        } => {
            let client = gateway_client(&settings, gateway, token);
            match action {
                BackendsAction::List => list_backends(&client).await?,
                BackendsAction::Add(args) => add_backend(&client, args).await?,
                BackendsAction::Remove { id } => {
                    client.remove_backend(&id).await?;
                    eprintln!("removed backend {id}");
                }
            }
        }
        Command::Node {
            stages,
            metrics_listen,
        } => {
            let shutdown = rollout::shutdown::on_signals(|| std::process::exit(130));
            let args = wiring::WorkerArgs {
                config: cli.config,
                metrics_listen,
                log_format: cli.log_format,
            };
            wiring::worker_process(&stages, args, shutdown).await?;
        }
        Command::Up {
            workers,
            submit,
            batch,
            exit_when_done,
            logs_on_screen: _,
        } => {
            let opts = UpOptions {
                workers,
                submit: None,
                exit_when_done,
                log_file,
            };
            up(settings, opts, &submit, batch).await?
        }
    }
    Ok(())
}

/// A stage name on the command line (`init`, `run` or `eval`).
fn parse_stage(s: &str) -> Result<Stage, String> {
    Stage::parse(s.trim()).ok_or_else(|| format!("unknown stage `{s}`: use init, run or eval"))
}

/// `rollout serve`: the gateway (with the reconciler) until a signal, then the NATS
/// connection drained so nothing published is lost.
async fn serve(settings: Settings) -> anyhow::Result<()> {
    let shutdown = rollout::shutdown::on_signals(|| std::process::exit(130));
    let settings = Arc::new(settings);
    let deps = wiring::connect(settings.clone(), "rollout-gateway", true).await?;
    let listener = wiring::bind(&settings.gateway.listen).await?;
    wiring::run_gateway(deps.clone(), listener, shutdown).await?;
    let _ = deps.queue.client().drain().await;
    Ok(())
}

/// `rollout migrate`: connecting to the store applies its migrations.
async fn migrate(settings: &Settings) -> anyhow::Result<()> {
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

/// `rollout submit`: `tasks` into `batch` (a new one by default) in chunks; prints the
/// batch id, and with `wait` follows the batch to its summary.
async fn submit(
    client: &Client,
    tasks: &[rollout::domain::Task],
    batch: Option<String>,
    wait: bool,
) -> anyhow::Result<()> {
    let mut batch_id = batch;
    let mut total = 0u64;
    let mut duplicates = 0u64;
    let mut labels = std::collections::HashMap::new();
    // Chunks keep each request under the gateway's limits; the batch id of the
    // first chunk is reused so the whole file is one batch.
    for chunk in tasks.chunks(5000) {
        let resp = client.submit(chunk, batch_id.as_deref()).await?;
        total += resp.jobs.len() as u64;
        duplicates += resp.jobs.iter().filter(|j| j.duplicate).count() as u64;
        labels.extend(rollout::client::job_labels(chunk, &resp.jobs));
        batch_id = Some(resp.batch_id);
    }
    let batch_id = batch_id.expect("at least one chunk");
    println!("{batch_id}");
    eprintln!(
        "submitted {total} tasks to batch {batch_id} ({duplicates} already known by client_id)"
    );
    if wait {
        let summary = client.follow_batch(&batch_id, total, &labels).await?;
        eprintln!("{summary}");
    }
    Ok(())
}

/// `rollout replay`: submits the replay of `job`, waits for its result and reports;
/// returns whether it went as the recorded episode did (no divergence, same reward).
/// With `as_policy`, prints the recording as a stand-in policy instead.
async fn replay(
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
    let task = rollout::agent::replay::replay_task(&original.job)?;
    let batch = batch.unwrap_or_else(|| format!("replay-{}", uuid::Uuid::now_v7().simple()));
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

/// `rollout status`: job counts by status and stage, and the batch's totals when one is
/// named.
async fn status(client: &Client, batch: Option<&str>) -> anyhow::Result<()> {
    let view = client.status(batch).await?;
    println!("{:<10} {:<6} {:>8}", "STATUS", "STAGE", "JOBS");
    for c in &view.counts {
        println!("{:<10} {:<6} {:>8}", c.status, c.stage, c.count);
    }
    if let Some(b) = view.batch {
        println!(
            "batch {}: {} submitted, {} finished ({} done, {} failed, {} timed out, {} cancelled, {} stale)",
            b.id, b.submitted, b.finished, b.done, b.failed, b.timed_out, b.cancelled, b.stale
        );
    }
    Ok(())
}

/// `rollout backends list`: one line per backend.
async fn list_backends(client: &Client) -> anyhow::Result<()> {
    let list = client.backends().await?;
    println!(
        "{:<20} {:<7} {:<20} {:<32} {:<8} {:>6} {:>6}",
        "ID", "KIND", "MODEL", "URL", "HEALTHY", "ACTIVE", "WEIGHT"
    );
    for b in list {
        println!(
            "{:<20} {:<7} {:<20} {:<32} {:<8} {:>6} {:>6}",
            b.spec.id,
            b.spec.kind,
            b.spec.model,
            b.spec.url,
            if b.healthy { "yes" } else { "no" },
            b.active,
            b.spec.weight
        );
    }
    Ok(())
}

/// `rollout backends add`: the flags checked and read (the API key from its variable),
/// then registered.
async fn add_backend(client: &Client, args: AddBackend) -> anyhow::Result<()> {
    let AddBackend {
        id,
        url,
        kind,
        model,
        tokenizer,
        weight,
        served_model_name,
        api_key_env,
        logprobs_mode,
    } = args;
    let kind = rollout::domain::backend::WireKind::parse(&kind)
        .with_context(|| format!("--kind `{kind}`: use vllm or sglang"))?;
    let logprobs_mode = logprobs_mode
        .map(|m| {
            rollout::domain::backend::LogprobsMode::parse(&m)
                .with_context(|| format!("--logprobs-mode `{m}`: use raw or processed"))
        })
        .transpose()?;
    let api_key = api_key_env
        .map(|var| {
            std::env::var(&var)
                .map(rollout::domain::backend::ApiKey)
                .with_context(|| format!("--api-key-env: ${var} is not set"))
        })
        .transpose()?;
    let spec = rollout::domain::backend::BackendSpec {
        id,
        url,
        kind,
        model,
        tokenizer,
        weight,
        served_model_name,
        api_key,
        logprobs_mode,
    };
    let b = client.add_backend(&spec).await?;
    eprintln!(
        "registered backend {} ({} at {})",
        b.spec.id, b.spec.model, b.spec.url
    );
    Ok(())
}

/// Options of `rollout up`.
#[derive(Debug, Clone)]
struct UpOptions {
    /// Workers of each stage.
    workers: usize,
    /// Tasks to submit once everything runs, with the batch to put them in.
    submit: Option<(Vec<Task>, String)>,
    /// Where the log goes, when not to the terminal (said in the start-up line).
    log_file: Option<PathBuf>,
    /// Stop once the submitted batch has all its results.
    exit_when_done: bool,
}

/// `rollout up`: everything on this machine until a signal (or, with `exit_when_done`,
/// until the submitted batch is finished); fails when a submitted batch was refused, or
/// had results but none of them `done`.
async fn up(
    settings: Settings,
    mut opts: UpOptions,
    submit: &[PathBuf],
    batch: Option<String>,
) -> anyhow::Result<()> {
    anyhow::ensure!(opts.workers >= 1, "--workers must be at least 1");
    opts.submit = if submit.is_empty() {
        None
    } else {
        let mut tasks = Vec::new();
        for path in submit {
            tasks.extend(load_tasks(path)?);
        }
        let id = batch.unwrap_or_else(|| format!("up-{}", uuid::Uuid::now_v7().simple()));
        Some((tasks, id))
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
    if let Some((batch, batch_id)) = opts.submit {
        let client = Client::new(&format!("http://{}", running.addr))
            .with_token(Some(running.settings.gateway.token.clone()));
        let follow = async {
            let resp = client.submit(&batch, Some(&batch_id)).await?;
            eprintln!(
                "submitted {} tasks as batch {}",
                resp.jobs.len(),
                resp.batch_id
            );
            let labels = rollout::client::job_labels(&batch, &resp.jobs);
            client
                .follow_batch(&resp.batch_id, resp.jobs.len() as u64, &labels)
                .await
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
        Some(Err(e)) => Err(anyhow::Error::new(e).context("submitting the batch failed")),
        Some(Ok(s)) if s.results > 0 && s.done == 0 => {
            anyhow::bail!("no job of the batch finished `done`")
        }
        _ => Ok(()),
    }
}
