//! A small model directory the project makes itself: a byte-level BPE tokenizer trained
//! on the spot and the project's ChatML / Hermes-tool-call chat template.
//!
//! Tests, benchmarks and the README demo need a `tokenizer.json` and a
//! `tokenizer_config.json` that the RUN workers and the stand-in server both load;
//! downloading a real model's is not an option. Training is deterministic, so every run
//! (and every process of one run) gets the same vocabulary.

use std::path::Path;

use rollout_model::model::{ModelError, ModelFiles};
use rollout_model::tokenizer::Tokenizer;

/// The ChatML template with Hermes-style tool calls (Qwen2.5 / Qwen3 style).
pub const CHATML_TEMPLATE: &str =
    include_str!("../../../tests/fixtures/templates/chatml_tools.jinja");

/// Special tokens of the demo vocabulary.
pub const SPECIAL_TOKENS: [&str; 5] = [
    "<|endoftext|>",
    "<|im_start|>",
    "<|im_end|>",
    "<tool_call>",
    "</tool_call>",
];

/// DeepSeek-R1's special tokens (its tokenizer's, which its chat template writes): for
/// model directories that play R1's turn format.
pub const DEEPSEEK_R1_TOKENS: [&str; 13] = [
    "<｜begin▁of▁sentence｜>",
    "<｜end▁of▁sentence｜>",
    "<｜User｜>",
    "<｜Assistant｜>",
    "<｜tool▁calls▁begin｜>",
    "<｜tool▁calls▁end｜>",
    "<｜tool▁call▁begin｜>",
    "<｜tool▁call▁end｜>",
    "<｜tool▁sep｜>",
    "<｜tool▁outputs▁begin｜>",
    "<｜tool▁outputs▁end｜>",
    "<｜tool▁output▁begin｜>",
    "<｜tool▁output▁end｜>",
];

/// Mistral's special tokens (its tekken and sentencepiece tokenizers alike), for tests
/// of its templates and calls.
pub const MISTRAL_TOKENS: [&str; 12] = [
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "[TOOL_CALLS]",
    "[ARGS]",
    "[AVAILABLE_TOOLS]",
    "[/AVAILABLE_TOOLS]",
    "[TOOL_RESULTS]",
    "[/TOOL_RESULTS]",
    "[SYSTEM_PROMPT]",
    "[/SYSTEM_PROMPT]",
];

const CORPUS: &[&str] = &[
    "You are a helpful assistant. Use the tools to inspect and change files, then answer.",
    "# Tools\n\nYou may call one or more functions to assist with the user query.\n",
    "{\"name\": \"bash\", \"arguments\": {\"command\": \"ls -la && cat README.md\"}}",
    "{\"name\": \"python\", \"arguments\": {\"code\": \"print(sum(range(10)))\"}}",
    "{\"name\": \"file\", \"arguments\": {\"command\": \"str_replace\", \"path\": \"add.py\", \"old_str\": \"a - b\", \"new_str\": \"a + b\"}}",
    "{\"name\": \"finish\", \"arguments\": {\"answer\": \"42\"}}",
    "{\"type\": \"function\", \"function\": {\"name\": \"bash\", \"description\": \"Run a command in a persistent bash shell.\", \"parameters\": {\"type\": \"object\", \"properties\": {\"command\": {\"type\": \"string\"}}, \"required\": [\"command\"]}}}",
    "<tool_response>\nexit code 0\n</tool_response>",
    "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n",
    "The quick brown fox jumps over the lazy dog. The answer is 5. I will run the tests.",
    "Traceback (most recent call last):\n  File \"<stdin>\", line 1, in <module>\nNameError: name 'x' is not defined",
    "Let me look at the repository first, then fix the bug and check the result.",
];

/// Trains the demo tokenizer; `extra` text (a script's turns, say) joins the corpus.
pub fn tokenizer(extra: &[&str]) -> Result<Tokenizer, ModelError> {
    let mut corpus: Vec<&str> = CORPUS.to_vec();
    corpus.push(CHATML_TEMPLATE);
    corpus.extend_from_slice(extra);
    Ok(Tokenizer::train_bpe(&corpus, 2000, &SPECIAL_TOKENS)?)
}

/// The demo `tokenizer_config.json` around `template`.
pub fn tokenizer_config(template: &str) -> serde_json::Value {
    serde_json::json!({
        "bos_token": null,
        "eos_token": "<|im_end|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 32768,
        "chat_template": template,
    })
}

/// The demo model in memory, with `template` as its chat template.
pub fn model_files(template: &str, extra: &[&str]) -> Result<ModelFiles, ModelError> {
    ModelFiles::from_parts(tokenizer(extra)?, &tokenizer_config(template))
}

/// Writes the demo model directory (`tokenizer.json`, `tokenizer_config.json`) to `dir`.
pub fn write_model_dir(dir: &Path, template: &str, extra: &[&str]) -> Result<(), ModelError> {
    let io = |path: &Path, source| ModelError::Io {
        path: path.to_path_buf(),
        source,
    };
    std::fs::create_dir_all(dir).map_err(|e| io(dir, e))?;
    let tok = tokenizer(extra)?;
    let tok_path = dir.join("tokenizer.json");
    std::fs::write(&tok_path, tok.to_json()?).map_err(|e| io(&tok_path, e))?;
    let cfg_path = dir.join("tokenizer_config.json");
    let cfg = serde_json::to_string_pretty(&tokenizer_config(template)).expect("JSON");
    std::fs::write(&cfg_path, cfg).map_err(|e| io(&cfg_path, e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(m: &ModelFiles, tools: bool) -> String {
        let msgs = [serde_json::json!({"role": "user", "content": "hi"})];
        let tool = [serde_json::json!({"type": "function", "function": {"name": "bash"}})];
        m.template_for(tools)
            .render(&msgs, tools.then_some(&tool[..]), true, &Default::default())
            .unwrap()
    }

    /// Templates are chosen as transformers chooses them: `chat_template.jinja` (and
    /// `additional_chat_templates/`) over the config's, and `tool_use` when tools are
    /// given.
    #[test]
    fn templates_are_chosen_as_transformers_chooses_them() {
        let dir = tempfile::tempdir().unwrap();
        write_model_dir(dir.path(), "CONFIG {{ messages[0].content }}", &[]).unwrap();
        let m = ModelFiles::load(dir.path()).unwrap();
        assert_eq!(render(&m, true), "CONFIG hi");
        // A named list in the config: `tool_use` with tools, `default` without.
        let cfg_path = dir.path().join("tokenizer_config.json");
        let mut cfg: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&cfg_path).unwrap()).unwrap();
        cfg["chat_template"] = serde_json::json!([
            {"name": "default", "template": "PLAIN {{ messages[0].content }}"},
            {"name": "tool_use", "template": "TOOLS {{ tools | length }} {{ messages[0].content }}"},
        ]);
        std::fs::write(&cfg_path, cfg.to_string()).unwrap();
        let m = ModelFiles::load(dir.path()).unwrap();
        assert_eq!(render(&m, false), "PLAIN hi");
        assert_eq!(render(&m, true), "TOOLS 1 hi");
        // transformers 5's files win over the config's list.
        std::fs::write(
            dir.path().join("chat_template.jinja"),
            "FILE {{ messages[0].content }}",
        )
        .unwrap();
        let m = ModelFiles::load(dir.path()).unwrap();
        assert_eq!(render(&m, true), "FILE hi");
        let extra = dir.path().join("additional_chat_templates");
        std::fs::create_dir(&extra).unwrap();
        std::fs::write(
            extra.join("tool_use.jinja"),
            "FILE-TOOLS {{ messages[0].content }}",
        )
        .unwrap();
        let m = ModelFiles::load(dir.path()).unwrap();
        assert_eq!(render(&m, false), "FILE hi");
        assert_eq!(render(&m, true), "FILE-TOOLS hi");
    }
}
