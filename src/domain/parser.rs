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
}

impl Parser {
    /// Parses `hermes` or `bash_block`.
    pub fn from_name(s: &str) -> Option<Self> {
        match s {
            "hermes" => Some(Parser::Hermes),
            "bash_block" => Some(Parser::BashBlock),
            _ => None,
        }
    }
}
