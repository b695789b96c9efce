//! `rollout`: the gateway, admin commands and the all-in-one `up`.
//!
//! Each subcommand is a few lines over library code; see `rollout --help`.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use clap::{Parser, Subcommand};
use rollout::client::Client;
use rollout::config::Settings;
use rollout::domain::Stage;
use rollout::wiring;

mod cli;
use cli::table::{Align, Table};
use cli::tasks::TaskFiles;

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
        /// Wait for every result, with a progress bar, then print a summary with the
        /// reasons jobs did not end `done`.
        #[arg(long)]
        wait: bool,
        /// With --wait: exit with status 1 when any job ended `failed` or `timed_out`.
        #[arg(long, requires = "wait")]
        fail_on_error: bool,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Print results in delivery order: a row each, or JSON lines with --json.
    Results {
        /// Only this batch.
        #[arg(long)]
        batch: Option<String>,
        /// Start after this result `seq` (the cursor of `GET /v1/results`).
        #[arg(long, default_value_t = 0)]
        after: i64,
        /// Keep waiting for new results (long polls) instead of stopping at the last.
        #[arg(long, short)]
        follow: bool,
        /// Stop after this many results.
        #[arg(long)]
        count: Option<u64>,
        /// Each result as one JSON line (the API's result, trajectory included).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Cancel jobs, or a whole batch (plain or sampling). A job that already ended keeps
    /// its result.
    Cancel {
        /// The jobs to cancel.
        jobs: Vec<String>,
        /// Cancel this batch: its live jobs end `cancelled`.
        #[arg(long, required_unless_present = "jobs")]
        batch: Option<String>,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// List batches, submit a dynamic-sampling batch, show a batch's groups.
    Batches {
        #[command(subcommand)]
        action: BatchesAction,
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// Show job counts by status and stage.
    Status {
        /// Only this batch.
        #[arg(long)]
        batch: Option<String>,
        #[command(flatten)]
        gateway: GatewayArgs,
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
        #[command(flatten)]
        gateway: GatewayArgs,
    },
    /// List, register and remove inference backends (through the gateway).
    Backends {
        #[command(subcommand)]
        action: BackendsAction,
        #[command(flatten)]
        gateway: GatewayArgs,
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

/// Where the gateway is and its token, for the commands that talk to it.
#[derive(Debug, clap::Args)]
struct GatewayArgs {
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
}

#[derive(Debug, Subcommand)]
enum BatchesAction {
    /// The latest batches with their counters (sampling batches with their groups).
    List {
        /// How many.
        #[arg(long, default_value_t = 20)]
        limit: i64,
    },
    /// Submit a JSON Lines file of prompts as one dynamic-sampling batch (each prompt
    /// sampled --group-size times until --target-groups groups are informative).
    Submit {
        /// One prompt (a task) per line.
        file: PathBuf,
        /// G: samples per prompt.
        #[arg(long)]
        group_size: i64,
        /// K: informative groups wanted.
        #[arg(long)]
        target_groups: i64,
        /// Batch id (default: a fresh one).
        #[arg(long)]
        batch: Option<String>,
        /// Groups running at once (default: --target-groups).
        #[arg(long)]
        max_groups_in_flight: Option<i64>,
        /// Give up after this many prompts (default: all of them).
        #[arg(long)]
        max_groups: Option<i64>,
        /// Stamped on every job as `metadata.policy_version`.
        #[arg(long)]
        policy_version: Option<i64>,
        /// Samples older than this many policy versions end `stale`.
        #[arg(long)]
        max_staleness: Option<i64>,
        /// Print each accepted group as it is decided, until the batch ends.
        #[arg(long)]
        wait: bool,
    },
    /// A batch: a sampling batch's status and accepted groups with each sample's
    /// reward, or a plain batch's counters.
    Show {
        /// The batch.
        id: String,
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

/// A client of the gateway named by `--gateway` (default: `gateway.listen`), sending the
/// token from `--token` / `ROLLOUT_GATEWAY_TOKEN` or else `gateway.token`, so a machine
/// that runs the gateway needs no extra flag.
fn gateway_client(settings: &Settings, args: GatewayArgs) -> Client {
    let url = args
        .gateway
        .unwrap_or_else(|| format!("http://{}", settings.gateway.listen));
    let token = args
        .token
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
        command => client_command(&settings, command).await?,
    }
    Ok(())
}

/// The commands that talk to a gateway (submit, results, cancel, batches, status,
/// replay, backends).
async fn client_command(settings: &Settings, command: Command) -> anyhow::Result<()> {
    match command {
        Command::Submit {
            file,
            batch,
            wait,
            fail_on_error,
            gateway,
        } => {
            let files = TaskFiles::load(&[file])?;
            let client = gateway_client(settings, gateway);
            let ended = cli::jobs::submit(&client, &files, batch, wait).await?;
            if let (true, cli::jobs::Submitted::Failed(n)) = (fail_on_error, ended) {
                eprintln!("{n} jobs ended failed or timed out (--fail-on-error)");
                std::process::exit(1);
            }
        }
        Command::Results {
            batch,
            after,
            follow,
            count,
            json,
            gateway,
        } => {
            let client = gateway_client(settings, gateway);
            let args = cli::jobs::ResultsArgs {
                batch,
                after,
                follow,
                count,
                json,
            };
            cli::jobs::results(&client, args).await?;
        }
        Command::Cancel {
            jobs,
            batch,
            gateway,
        } => {
            let client = gateway_client(settings, gateway);
            cli::jobs::cancel(&client, &jobs, batch.as_deref()).await?;
        }
        Command::Batches { action, gateway } => {
            let client = gateway_client(settings, gateway);
            batches(&client, action).await?;
        }
        Command::Status { batch, gateway } => {
            let client = gateway_client(settings, gateway);
            status(&client, batch.as_deref()).await?;
        }
        Command::Replay {
            job,
            batch,
            strict,
            as_policy,
            gateway,
        } => {
            let client = gateway_client(settings, gateway);
            let same = replay(&client, &job, batch, strict, as_policy).await?;
            if strict && !same {
                std::process::exit(1);
            }
        }
        Command::Backends { action, gateway } => {
            let client = gateway_client(settings, gateway);
            match action {
                BackendsAction::List => list_backends(&client).await?,
                BackendsAction::Add(args) => add_backend(&client, args).await?,
                BackendsAction::Remove { id } => {
                    client.remove_backend(&id).await?;
                    eprintln!("removed backend {id}");
                }
            }
        }
        Command::Serve | Command::Migrate | Command::Node { .. } | Command::Up { .. } => {
            unreachable!("`main` runs the commands that do not talk to a gateway")
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

/// `rollout batches`: the action named.
async fn batches(client: &Client, action: BatchesAction) -> anyhow::Result<()> {
    match action {
        BatchesAction::List { limit } => cli::batches::list(client, limit).await,
        BatchesAction::Show { id } => cli::batches::show(client, &id).await,
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
            let args = cli::batches::SamplingArgs {
                batch,
                group_size,
                target_groups,
                max_groups_in_flight,
                max_groups,
                policy_version,
                max_staleness,
                wait,
            };
            cli::batches::submit(client, &files, args).await
        }
    }
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

/// `rollout status`: job counts by status and stage, and the batch's totals when one is
/// named.
async fn status(client: &Client, batch: Option<&str>) -> anyhow::Result<()> {
    let view = client.status(batch).await?;
    let mut t = Table::new(&[
        ("STATUS", Align::Left),
        ("STAGE", Align::Left),
        ("JOBS", Align::Right),
    ]);
    for c in &view.counts {
        t.row(vec![
            c.status.to_string(),
            c.stage.to_string(),
            c.count.to_string(),
        ]);
    }
    println!("{}", t.render());
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
    if list.is_empty() {
        eprintln!("no inference backends registered; add one with `rollout backends add`");
        return Ok(());
    }
    let mut t = Table::new(&[
        ("ID", Align::Left),
        ("KIND", Align::Left),
        ("MODEL", Align::Left),
        ("URL", Align::Left),
        ("HEALTHY", Align::Left),
        ("ACTIVE", Align::Right),
        ("WEIGHT", Align::Right),
    ]);
    for b in list {
        t.row(vec![
            b.spec.id,
            b.spec.kind.to_string(),
            b.spec.model,
            b.spec.url,
            (if b.healthy { "yes" } else { "no" }).to_string(),
            b.active.to_string(),
            b.spec.weight.to_string(),
        ]);
    }
    println!("{}", t.render());
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
#[derive(Debug)]
struct UpOptions {
    /// Workers of each stage.
    workers: usize,
    /// Tasks to submit once everything runs, with the batch to put them in.
    submit: Option<(TaskFiles, String)>,
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
