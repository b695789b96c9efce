//! Observation encoding benchmark (not a test): run with `cargo bench --bench
//! observations`.
//!
//! What one turn's observation costs the RUN loop to render and tokenize, with the
//! longest template the project has (Qwen3-Coder's published one, with two tools) and
//! a real-sized tool output (4 KiB of `ls -la`-like lines ending in a newline), three
//! ways, in the same run:
//!
//! - **render**: the glue's text with the output located in it
//!   (`TurnGlue::between_turns_pieces`), which every way needs;
//! - **apart** (before): each piece tokenized on its own, the output as plain text;
//! - **canonical** (now, `Tokenizer::encode_pieces`): the whole text tokenized in one
//!   go, checked against the template's own special tokens (and tokenized run by run
//!   instead when the output spells one, which this output does not).
//!
//! It prints microseconds per turn and the ratio canonical / apart. `BENCH_QUICK=1`
//! runs fewer turns.

use std::time::Instant;

use rollout::agent::model::ModelFiles;
use rollout::agent::render::TurnGlue;
use rollout::scripted::demo;
use serde_json::json;

fn main() {
    let turns: usize = if std::env::var_os("BENCH_QUICK").is_some() {
        200
    } else {
        2_000
    };
    let template = include_str!("../tests/fixtures/templates/qwen3_coder.jinja");
    let model: ModelFiles = demo::model_files(template, &[]).expect("the demo model");
    let tools = [
        json!({"type": "function", "function": {"name": "bash", "description": "Run a command.",
            "parameters": {"type": "object", "properties": {"command": {"type": "string"}}}}}),
        json!({"type": "function", "function": {"name": "finish", "description": "Answer.",
            "parameters": {"type": "object", "properties": {"answer": {"type": "string"}}}}}),
    ];
    let args = serde_json::Map::new();
    let glue = TurnGlue::new(
        model.template_for(true),
        &model.stop_tokens(),
        Some(&tools[..]),
        &args,
    )
    .expect("the template glues");
    let mut output = String::new();
    let mut i = 0;
    while output.len() < 4096 {
        output.push_str(&format!(
            "-rw-r--r-- 1 user user {:>6} Dec  7 12:{:02} file_{i}.py\n",
            i * 37,
            i % 60
        ));
        i += 1;
    }
    let history = vec![
        json!({"role": "user", "content": "List the files."}),
        json!({"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "bash", "arguments": {"command": "ls -la"}}}
        ]}),
    ];
    let new = vec![json!({"role": "tool", "content": output})];
    let tok = &model.tokenizer;

    let t = Instant::now();
    let mut pieces = Vec::new();
    for _ in 0..turns {
        pieces = glue
            .between_turns_pieces(&history, &new, true)
            .expect("the glue renders");
    }
    let render = t.elapsed().as_secs_f64() * 1e6 / turns as f64;

    let t = Instant::now();
    let mut apart = Vec::new();
    for _ in 0..turns {
        apart.clear();
        for (text, literal) in &pieces {
            let ids = if *literal {
                tok.encode_literal(text)
            } else {
                tok.encode(text)
            };
            apart.extend(ids.expect("encodes"));
        }
    }
    let apart_us = t.elapsed().as_secs_f64() * 1e6 / turns as f64;

    let t = Instant::now();
    let mut canonical = Vec::new();
    for _ in 0..turns {
        canonical = tok.encode_pieces(&pieces).expect("encodes");
    }
    let canonical_us = t.elapsed().as_secs_f64() * 1e6 / turns as f64;

    println!(
        "observation of {} bytes, {} turns each",
        output.len(),
        turns
    );
    println!("render (glue text, output located): {render:>8.1} µs/turn");
    println!(
        "tokenize apart (before):            {apart_us:>8.1} µs/turn ({} tokens)",
        apart.len()
    );
    println!(
        "tokenize canonical (now):           {canonical_us:>8.1} µs/turn ({} tokens)",
        canonical.len()
    );
    println!(
        "canonical / apart: {:.2}; per turn with the render: {:.2}",
        canonical_us / apart_us,
        (render + canonical_us) / (render + apart_us)
    );
}
