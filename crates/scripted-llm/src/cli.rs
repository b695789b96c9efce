//! The `rollout-scripted-llm` command: a stand-in inference server for tests, benchmarks
//! and the demo.
//!
//! **It plays a script; it is not a model.** It speaks vLLM's `POST /v1/completions` and
//! SGLang's `POST /generate` token-in and token-out, answering with the assistant turns a
//! script file gives per task (see [`crate::script`]), as real token IDs of
//! the model directory's tokenizer with deterministic pseudo-logprobs. It simulates
//! per-token generation time and a prefix cache (cached prompt tokens are reported the
//! way vLLM and SGLang report them), and plays faults on `POST /control`.
//!
//! `write-model` makes the small model directory (a byte-level BPE tokenizer trained on
//! the spot and the project's ChatML chat template) that the server and the RUN workers
//! then both load, so they agree on every token.
//!
//! The command lives here, not in the service, so that its binary links this crate and
//! the two below it alone; the service's `rollout-scripted-llm` target only calls
//! [`main`].

use std::path::PathBuf;
use std::sync::Arc;

use crate::script::Script;
use crate::{ScriptedConfig, ScriptedServer, demo};
use anyhow::Context;
use clap::{Parser, Subcommand};
use rollout_model::model::ModelFiles;

#[derive(Parser)]
#[command(
    name = "rollout-scripted-llm",
    version,
    about = "A stand-in vLLM/SGLang server that plays a script (not a model), for tests, benchmarks and demos"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve until Ctrl-C or SIGTERM.
    Serve {
        /// Address to listen on (port 0 picks a free one; the address is printed).
        #[arg(long, default_value = "127.0.0.1:8000")]
        listen: String,
        /// The model directory (tokenizer.json and tokenizer_config.json).
        #[arg(long)]
        model: PathBuf,
        /// The script file (JSON): which turns to play for which task. `--policy`, its
        /// first name, still works.
        #[arg(long = "policy", visible_alias = "script", value_name = "FILE")]
        script: Option<PathBuf>,
        /// The model name it reports.
        #[arg(long, default_value = "scripted")]
        model_name: String,
        /// Seed for requests that carry none.
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Simulated time per generated token, in microseconds.
        #[arg(long, default_value_t = 0)]
        token_us: u64,
        /// Simulated prefill time per uncached prompt token, in nanoseconds.
        #[arg(long, default_value_t = 0)]
        prefill_ns: u64,
        /// Prefix cache block size in tokens.
        #[arg(long, default_value_t = 16)]
        block_size: usize,
        /// Prefix cache capacity in blocks.
        #[arg(long, default_value_t = 65_536)]
        cache_blocks: usize,
        /// Context length in tokens.
        #[arg(long, default_value_t = 32_768)]
        max_model_len: usize,
        /// Answer like a vLLM without `return_token_ids` (IDs only as `token_id:<id>`).
        #[arg(long)]
        legacy_vllm: bool,
        /// Report cached prompt tokens in vLLM answers, as vLLM does with this flag.
        #[arg(long)]
        enable_prompt_tokens_details: bool,
        /// Honour SGLang's `sampling_seed`, as SGLang does with this flag.
        #[arg(long)]
        enable_deterministic_inference: bool,
        /// Want `Authorization: Bearer <key>`, as both servers do with `--api-key`; read
        /// from this environment variable.
        #[arg(long)]
        api_key_env: Option<String>,
        /// How long `GET /health` takes, in milliseconds (SGLang's runs a generation).
        #[arg(long, default_value_t = 0)]
        health_delay_ms: u64,
    },
    /// Write the demo model directory (tokenizer trained on the spot, ChatML template).
    WriteModel {
        /// Where to write tokenizer.json and tokenizer_config.json.
        dir: PathBuf,
        /// A script file whose turns join the tokenizer's training text (`--script`
        /// as well).
        #[arg(long = "policy", visible_alias = "script", value_name = "FILE")]
        script: Option<PathBuf>,
        /// A chat template to use instead of the built-in ChatML one.
        #[arg(long)]
        template: Option<PathBuf>,
    },
}

fn read_script(path: Option<&PathBuf>) -> anyhow::Result<Script> {
    match path {
        Some(p) => {
            let text = std::fs::read_to_string(p)
                .with_context(|| format!("cannot read the script file {}", p.display()))?;
            Script::from_json(&text).map_err(anyhow::Error::msg)
        }
        None => Ok(Script::default()),
    }
}

/// Runs the command line's command. Logs go to stderr (`RUST_LOG` overrides `info`);
/// stdout carries only what scripts read (the address it listens on).
pub fn main() -> anyhow::Result<()> {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the async runtime")?
        .block_on(run(Cli::parse().command))
}

async fn run(command: Command) -> anyhow::Result<()> {
    match command {
        Command::WriteModel {
            dir,
            script,
            template,
        } => {
            let script = read_script(script.as_ref())?;
            let turns: Vec<&str> = script
                .rules
                .iter()
                .flat_map(|r| &r.variants)
                .chain(&script.fallback)
                .flat_map(|v| v.turns.iter().map(String::as_str))
                .collect();
            let template = match template {
                Some(p) => std::fs::read_to_string(&p)
                    .with_context(|| format!("cannot read the template {}", p.display()))?,
                None => demo::CHATML_TEMPLATE.to_string(),
            };
            demo::write_model_dir(&dir, &template, &turns)?;
            println!("wrote {}", dir.display());
        }
        Command::Serve {
            listen,
            model,
            script,
            model_name,
            seed,
            token_us,
            prefill_ns,
            block_size,
            cache_blocks,
            max_model_len,
            legacy_vllm,
            enable_prompt_tokens_details,
            enable_deterministic_inference,
            api_key_env,
            health_delay_ms,
        } => {
            let files = ModelFiles::load(&model).with_context(|| {
                format!(
                    "cannot load the model directory {} (make one with `rollout-scripted-llm write-model DIR`)",
                    model.display()
                )
            })?;
            let mut cfg = ScriptedConfig::new(Arc::new(files), read_script(script.as_ref())?);
            cfg.model_name = model_name;
            cfg.seed = seed;
            cfg.token_us = token_us;
            cfg.prefill_ns_per_token = prefill_ns;
            cfg.block_size = block_size;
            cfg.cache_blocks = cache_blocks;
            cfg.max_model_len = max_model_len;
            cfg.legacy_vllm = legacy_vllm;
            cfg.prompt_tokens_details = enable_prompt_tokens_details;
            cfg.deterministic = enable_deterministic_inference;
            cfg.health_delay_ms = health_delay_ms;
            cfg.api_key = api_key_env
                .map(|var| {
                    std::env::var(&var).with_context(|| format!("--api-key-env: ${var} is not set"))
                })
                .transpose()?;
            let listener = tokio::net::TcpListener::bind(&listen)
                .await
                .with_context(|| format!("cannot listen on {listen}"))?;
            let server = ScriptedServer::spawn(listener, cfg)?;
            // One line on stdout, for scripts that started it on port 0.
            println!("listening on {}", server.url());
            tracing::info!(url = %server.url(), "rollout-scripted-llm serving (a scripted stand-in, not a model)");
            rollout_core::shutdown::on_signals(|| std::process::exit(130))
                .cancelled()
                .await;
            server.stop().await;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The script file's flag kept its first name, `--policy` (what existing commands and
    /// scripts say), and also answers to `--script`.
    #[test]
    fn the_script_flag_answers_to_its_old_and_new_names() {
        for flag in ["--policy", "--script"] {
            let serve = Cli::try_parse_from(["x", "serve", "--model", "m", flag, "s.json"])
                .unwrap()
                .command;
            assert!(
                matches!(serve, Command::Serve { script: Some(p), .. } if p.as_os_str() == "s.json"),
                "serve {flag}"
            );
            let write = Cli::try_parse_from(["x", "write-model", "d", flag, "s.json"])
                .unwrap()
                .command;
            assert!(
                matches!(write, Command::WriteModel { script: Some(p), .. } if p.as_os_str() == "s.json"),
                "write-model {flag}"
            );
        }
    }
}
