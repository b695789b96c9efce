//! `rollout backends list` and `rollout backends add`: the inference backends the
//! gateway knows, and registering one from flags.

use anyhow::Context;
use rollout::client::Client;

use super::args::AddBackend;
use super::table::{Align, Table};

/// `rollout backends list`: one line per backend.
pub async fn list_backends(client: &Client) -> anyhow::Result<()> {
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
pub async fn add_backend(client: &Client, args: AddBackend) -> anyhow::Result<()> {
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
