//! `rollout template render` and `rollout template parse`: what the service makes of a
//! model before anyone trains on it. `render` prints the prompt a conversation becomes
//! (the text, and the token IDs the service would send, tool results tokenized as the
//! episodes tokenize them) and which template and tool-call parser the model gets and
//! why; `parse` prints the reasoning, the content and the tool calls the service would
//! take from one model output. A reviewer compares both with transformers and vLLM's
//! parsers case by case.

use std::io::Read;
use std::path::Path;

use anyhow::Context;
use rollout::agent::episode::encode_conversation;
use rollout::agent::model::ModelFiles;
use rollout::agent::parse;
use serde_json::{Value, json};

/// Reads `input` (a file, or standard input when absent or `-`).
fn read_input(input: Option<&Path>) -> anyhow::Result<String> {
    match input {
        Some(p) if p != Path::new("-") => {
            std::fs::read_to_string(p).with_context(|| format!("cannot read {}", p.display()))
        }
        _ => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("cannot read standard input")?;
            Ok(s)
        }
    }
}

/// Loads the model directory `dir`, saying which one failed.
fn load(dir: &Path) -> anyhow::Result<ModelFiles> {
    ModelFiles::load(dir).with_context(|| format!("cannot load the model at {}", dir.display()))
}

/// `rollout template render`.
pub fn render(
    model_dir: &Path,
    input: Option<&Path>,
    parser: &str,
    json_out: bool,
) -> anyhow::Result<()> {
    let model = load(model_dir)?;
    let request: Value = serde_json::from_str(&read_input(input)?).context(
        "the input must be JSON: {\"messages\": [...], \"tools\": [...]} or a list of messages",
    )?;
    let (messages, tools, args) = match &request {
        Value::Array(m) => (m.clone(), None, serde_json::Map::new()),
        Value::Object(o) => (
            o.get("messages")
                .and_then(Value::as_array)
                .cloned()
                .context("`messages` must be a list of OpenAI chat messages")?,
            o.get("tools")
                .and_then(Value::as_array)
                .cloned()
                .filter(|t| !t.is_empty()),
            o.get("template_args")
                .and_then(Value::as_object)
                .cloned()
                .unwrap_or_default(),
        ),
        _ => {
            anyhow::bail!("the input must be a JSON object with `messages`, or a list of messages")
        }
    };
    let open = messages.last().is_some_and(|m| m["role"] != "assistant");
    let (ids, text) = encode_conversation(&model, &messages, tools.as_deref(), open, &args, true)
        .map_err(|e| {
        anyhow::anyhow!("the chat template cannot render this conversation: {e}")
    })?;
    let template = if tools.is_some() && model.tool_use.is_some() {
        (
            "tool_use",
            "tools are given and the model names a `tool_use` template, which transformers renders with then",
        )
    } else if model.tool_use.is_some() {
        (
            "default",
            "no tools are given (the model's `tool_use` template is for conversations with tools)",
        )
    } else {
        ("default", "the model has one chat template")
    };
    let chosen = parse::choose(parser, &model);
    if json_out {
        let (name, why) = match &chosen {
            Ok((p, why)) => (serde_json::to_value(p)?, why.clone()),
            Err(e) => (Value::Null, e.clone()),
        };
        let out = json!({
            "text": text,
            "ids": ids,
            "generation_prompt": open,
            "template": template.0,
            "template_why": template.1,
            "parser": name,
            "parser_why": why,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("{text}");
    println!("--");
    println!("{} tokens: {ids:?}", ids.len());
    println!("template: {} ({})", template.0, template.1);
    match chosen {
        Ok((p, why)) => println!(
            "parser: {} ({why})",
            serde_json::to_value(p)?.as_str().unwrap_or("?")
        ),
        Err(e) => println!("parser: none ({e})"),
    }
    Ok(())
}

/// `rollout template parse`.
pub fn parse_output(
    model_dir: &Path,
    input: Option<&Path>,
    parser: &str,
    reasoning_open: bool,
    json_out: bool,
) -> anyhow::Result<()> {
    let model = load(model_dir)?;
    let text = read_input(input)?;
    let (chosen, why) =
        parse::choose(parser, &model).map_err(|e| anyhow::anyhow!("no parser: {e}"))?;
    let turn = parse::parse_turn(chosen, &text, reasoning_open);
    let reasoning: Vec<&str> = parse::reasoning_for(chosen, &text, reasoning_open)
        .into_iter()
        .map(|(a, b)| &text[a..b])
        .collect();
    let calls: Vec<Value> = turn
        .calls
        .iter()
        .map(|c| match c {
            // The id the model wrote, in the formats whose calls carry one.
            Ok(c) if c.id.is_some() => {
                json!({"name": c.name, "arguments": c.arguments, "id": c.id})
            }
            Ok(c) => json!({"name": c.name, "arguments": c.arguments}),
            Err(e) => json!({"error": e.message, "raw": e.raw}),
        })
        .collect();
    let name = serde_json::to_value(chosen)?;
    if json_out {
        let out = json!({
            "parser": name, "parser_why": why, "reasoning": reasoning,
            "content": turn.content, "tool_calls": calls,
        });
        println!("{}", serde_json::to_string_pretty(&out)?);
        return Ok(());
    }
    println!("parser: {} ({why})", name.as_str().unwrap_or("?"));
    for r in &reasoning {
        println!("reasoning: {r:?}");
    }
    println!("content: {:?}", turn.content);
    for c in &calls {
        println!("tool call: {c}");
    }
    if calls.is_empty() {
        println!("tool calls: none");
    }
    Ok(())
}
