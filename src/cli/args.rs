//! The `rollout` command line: its commands, flags and arguments (clap), and the gateway
//! client the commands that talk to one build from `--gateway` and `--token`.

use std::path::PathBuf;

use clap::{Parser, Subcommand};
use rollout::client::Client;
use rollout::config::Settings;
use rollout::domain::Stage;

#[derive(Debug, Parser)]
#[command(
    version,
    about = "Rollout service for RL training of multi-turn LLM agents"
)]
pub struct Cli {
    /// Settings file (TOML); `ROLLOUT__SECTION__KEY` environment variables override it.
    #[arg(long, global = true, env = "ROLLOUT_CONFIG")]
    pub config: Option<PathBuf>,
    /// Log lines as `text` or `json` (default: the `log.json` setting).
    #[arg(long, global = true, value_enum)]
    pub log_format: Option<rollout::telemetry::LogFormat>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
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
    /// See what the service makes of a model before training on it: the prompt a
    /// conversation becomes (`render`), and the tool calls it takes from a model's
    /// output (`parse`). Needs no service running.
    Template {
        #[command(subcommand)]
        action: TemplateAction,
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

/// What `rollout template` does.
#[derive(Debug, Subcommand)]
pub enum TemplateAction {
    /// Print the prompt a conversation becomes with the model's chat template, its token
    /// IDs as the service sends them (tool results tokenized as episodes tokenize them),
    /// and which template and tool-call parser the model gets, and why. Reads
    /// `{"messages": [...], "tools": [...], "template_args": {...}}` (or a list of
    /// messages) as JSON.
    Render {
        /// The model directory (`tokenizer.json`, `tokenizer_config.json`, …).
        #[arg(long)]
        model: PathBuf,
        /// The conversation (JSON); standard input when absent or `-`.
        #[arg(long)]
        input: Option<PathBuf>,
        /// The tool-call parser: `auto` (from the template) or a parser's name.
        #[arg(long, default_value = "auto")]
        parser: String,
        /// One JSON object: text, ids, template and parser, each with why.
        #[arg(long)]
        json: bool,
    },
    /// Print the reasoning, the content and the tool calls the service takes from one
    /// model output (its text, as the model generated it).
    Parse {
        /// The model directory.
        #[arg(long)]
        model: PathBuf,
        /// The model's output text; standard input when absent or `-`.
        #[arg(long)]
        input: Option<PathBuf>,
        /// The tool-call parser: `auto` (from the template) or a parser's name.
        #[arg(long, default_value = "auto")]
        parser: String,
        /// The prompt ended by opening the model's reasoning (`<think>`).
        #[arg(long)]
        reasoning_open: bool,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
}

/// Where the gateway is and its token, for the commands that talk to it.
#[derive(Debug, clap::Args)]
pub struct GatewayArgs {
    /// Gateway URL (default: http:// + gateway.listen).
    #[arg(long, env = "ROLLOUT_GATEWAY", global = true)]
    pub gateway: Option<String>,
    /// The gateway's token, when it has one (default: gateway.token).
    #[arg(
        long,
        env = "ROLLOUT_GATEWAY_TOKEN",
        hide_env_values = true,
        global = true
    )]
    pub token: Option<String>,
}

#[derive(Debug, Subcommand)]
pub enum BatchesAction {
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
pub enum BackendsAction {
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
pub struct AddBackend {
    /// A name unique in the pool.
    #[arg(long)]
    pub id: String,
    /// Base URL, e.g. http://10.0.0.5:8000.
    #[arg(long)]
    pub url: String,
    /// `vllm` or `sglang`.
    #[arg(long)]
    pub kind: String,
    /// The model it serves.
    #[arg(long)]
    pub model: String,
    /// The model directory (tokenizer.json, tokenizer_config.json) as the RUN
    /// workers see it.
    #[arg(long)]
    pub tokenizer: String,
    /// Relative capacity.
    #[arg(long, default_value_t = 1.0)]
    pub weight: f64,
    /// The name the server serves the model under, when it is not --model (vLLM's
    /// --served-model-name).
    #[arg(long)]
    pub served_model_name: Option<String>,
    /// The environment variable holding the server's --api-key (sent as a Bearer
    /// token); a variable, so the key stays out of shell history.
    #[arg(long)]
    pub api_key_env: Option<String>,
    /// `raw` (vLLM's default) or `processed` (SGLang, or vLLM with --logprobs-mode
    /// processed_logprobs).
    #[arg(long)]
    pub logprobs_mode: Option<String>,
}

/// A client of the gateway named by `--gateway` (default: `gateway.listen`), sending the
/// token from `--token` / `ROLLOUT_GATEWAY_TOKEN` or else `gateway.token`, so a machine
/// that runs the gateway needs no extra flag.
pub fn gateway_client(settings: &Settings, args: GatewayArgs) -> Client {
    let url = args
        .gateway
        .unwrap_or_else(|| format!("http://{}", settings.gateway.listen));
    let token = args
        .token
        .filter(|t| !t.is_empty())
        .or_else(|| Some(settings.gateway.token.clone()));
    Client::new(&url).with_token(token)
}

/// A stage name on the command line (`init`, `run` or `eval`).
fn parse_stage(s: &str) -> Result<Stage, String> {
    Stage::parse(s.trim()).ok_or_else(|| format!("unknown stage `{s}`: use init, run or eval"))
}
