//! Which syntax a model's tool calls are read in: a name in settings and task specs,
//! implemented by `agent::parse`.

use serde::{Deserialize, Serialize};

/// How a turn's text becomes tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Parser {
    /// `<tool_call>{"name": …, "arguments": {…}}</tool_call>` blocks (Hermes, Qwen).
    #[default]
    Hermes,
    /// One fenced bash block per turn, run by the `bash` tool.
    BashBlock,
    /// DeepSeek-R1's (and V3's) `<｜tool▁calls▁begin｜>` sections.
    DeepseekR1,
    /// Qwen3-Coder's XML calls: `<tool_call><function=NAME><parameter=KEY>value
    /// </parameter></function></tool_call>` (vLLM's `qwen3_coder`).
    Qwen3Coder,
    /// GLM-4.5's calls: `<tool_call>NAME<arg_key>KEY</arg_key><arg_value>VALUE
    /// </arg_value></tool_call>` (vLLM's `glm45`).
    Glm45,
    /// Llama 3.x's JSON calls, `{"name": …, "parameters": {…}}` objects (vLLM's
    /// `llama3_json`).
    Llama3Json,
    /// A Python list of keyword calls, `[f(x=1), g()]` (Llama 3.2's and Llama 4's
    /// pythonic templates; vLLM's `pythonic`).
    Pythonic,
    /// Mistral's `[TOOL_CALLS]` calls: a JSON list of `{"name", "arguments", "id"}`
    /// objects (tokenizers before v11: Mistral 7B v0.3, Nemo, Small 3.1) or
    /// `NAME[ARGS]{…}` after each marker (v11 on: Devstral, Magistral, Small 3.2)
    /// (vLLM's `mistral`).
    Mistral,
    /// Kimi-K2's `<|tool_calls_section_begin|>` sections, each call named by its id
    /// `functions.NAME:N` (vLLM's `kimi_k2`).
    KimiK2,
    /// gpt-oss's harmony messages: `analysis` reasoning, `final` answers, calls as
    /// messages to `functions.NAME` (vLLM's harmony parser, `openai`).
    GptOss,
}

impl Parser {
    /// Every parser, by the name settings and task specs give it.
    pub const ALL: [(&'static str, Parser); 10] = [
        ("hermes", Parser::Hermes),
        ("bash_block", Parser::BashBlock),
        ("deepseek_r1", Parser::DeepseekR1),
        ("qwen3_coder", Parser::Qwen3Coder),
        ("glm45", Parser::Glm45),
        ("llama3_json", Parser::Llama3Json),
        ("pythonic", Parser::Pythonic),
        ("mistral", Parser::Mistral),
        ("kimi_k2", Parser::KimiK2),
        ("gpt_oss", Parser::GptOss),
    ];

    /// The name that asks for the parser the model's own chat template implies (the
    /// agent loop finds it by having the template write a call; see `agent::parse`).
    pub const AUTO: &'static str = "auto";

    /// The parser named `s` (one of [`Parser::ALL`]; not [`Parser::AUTO`], which names
    /// no parser until a model is known).
    pub fn from_name(s: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == s).map(|&(_, p)| p)
    }

    /// Whether `s` is a name settings and specs may give: a parser's, or `auto`.
    pub fn is_name(s: &str) -> bool {
        s == Self::AUTO || Self::from_name(s).is_some()
    }

    /// The parsers' names, for messages: `` `hermes`, `bash_block`, … ``.
    pub fn expected_names() -> String {
        let names: Vec<String> = Self::ALL.iter().map(|(n, _)| format!("`{n}`")).collect();
        names.join(", ")
    }

    /// What a bad name is told: the names there are.
    pub fn expected() -> String {
        format!(
            "must be `{}` or one of {}",
            Self::AUTO,
            Self::expected_names()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each name reads back as the parser whose serde name it is.
    #[test]
    fn names_are_the_serde_names() {
        for (name, parser) in Parser::ALL {
            assert_eq!(serde_json::to_value(parser).unwrap(), name);
            assert_eq!(Parser::from_name(name), Some(parser));
        }
        assert_eq!(Parser::from_name("json"), None);
        assert!(Parser::is_name("auto") && !Parser::is_name("json"));
        assert!(Parser::expected().contains("`qwen3_coder`"));
    }
}
