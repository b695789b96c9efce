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
}

impl Parser {
    /// Parses `hermes`, `bash_block` or `deepseek_r1`.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "hermes" => Some(Parser::Hermes),
            "bash_block" => Some(Parser::BashBlock),
            "deepseek_r1" => Some(Parser::DeepseekR1),
            _ => None,
        }
    }
}
