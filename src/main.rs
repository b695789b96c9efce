//! `rollout`: the gateway, admin commands and the all-in-one `up`.
//!
//! Each subcommand is a few lines over library code; see `rollout --help`. The command
//! line is `cli::args`; each command's work is a module of `cli`.

#![forbid(unsafe_code)]

use anyhow::Context;
use clap::Parser;
use rollout::config::Settings;
use rollout::wiring;

mod cli;
use cli::args::{BackendsAction, Cli, Command, TemplateAction, gateway_client};
use cli::services::UpOptions;
use cli::tasks::TaskFiles;

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
        Command::Serve => cli::services::serve(settings).await?,
        Command::Migrate => cli::services::migrate(&settings).await?,
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
            cli::services::up(settings, opts, &submit, batch).await?
        }
        Command::Template { action } => match action {
            TemplateAction::Render {
                model,
                input,
                parser,
                json,
            } => cli::template::render(&model, input.as_deref(), &parser, json)?,
            TemplateAction::Parse {
                model,
                input,
                parser,
                reasoning_open,
                json,
            } => cli::template::parse_output(
                &model,
                input.as_deref(),
                &parser,
                reasoning_open,
                json,
            )?,
        },
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
            cli::batches::run(&client, action).await?;
        }
        Command::Status { batch, gateway } => {
            let client = gateway_client(settings, gateway);
            cli::status::status(&client, batch.as_deref()).await?;
        }
        Command::Replay {
            job,
            batch,
            strict,
            as_policy,
            gateway,
        } => {
            let client = gateway_client(settings, gateway);
            let same = cli::replay::replay(&client, &job, batch, strict, as_policy).await?;
            if strict && !same {
                std::process::exit(1);
            }
        }
        Command::Backends { action, gateway } => {
            let client = gateway_client(settings, gateway);
            match action {
                BackendsAction::List => cli::backends::list_backends(&client).await?,
                BackendsAction::Add(args) => cli::backends::add_backend(&client, args).await?,
                BackendsAction::Remove { id } => {
                    client.remove_backend(&id).await?;
                    eprintln!("removed backend {id}");
                }
            }
        }
        Command::Serve
        | Command::Migrate
        | Command::Node { .. }
        | Command::Up { .. }
        | Command::Template { .. } => {
            unreachable!("`main` runs the commands that do not talk to a gateway")
        }
    }
    Ok(())
}
