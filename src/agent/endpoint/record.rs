//! What each call an agent program made leaves in its episode's record: how its tokens
//! joined the samples, why, and what it asked and was answered.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::agent::trajectory::Drift;

/// How a call's tokens joined the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Merge {
    /// The episode's first call: it starts the first sample.
    First,
    /// Its prompt extends a sample's whole sequence: appended to it.
    Extends,
    /// Its prompt extends no sample: it starts one (see the call's `reason`).
    New,
}

/// One call an agent program made to its endpoint.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ModelCall {
    /// `chat.completions` or `completions`.
    pub route: String,
    /// The sample its tokens are in (absent for a refused call).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sample: Option<usize>,
    /// Its turn in that sample's `turns`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn: Option<usize>,
    /// How its tokens joined the samples.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub merge: Option<Merge>,
    /// Why it started a sample of its own, or why it was refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// Tokens between the sample's sequence and this call's output (the new messages,
    /// rendered), for a call that extends a sample.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub observation_tokens: usize,
    /// The prompt's length.
    pub prompt_tokens: usize,
    /// For a chat call: whether its messages, rendered and tokenized afresh, give the
    /// prompt it was sent (absent for the first call of a fresh render, which is that).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<Drift>,
    /// The earlier call whose conversation and answer this chat call's messages go on
    /// from (its prompt continues that call's tokens).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub continues: Option<usize>,
    /// The request body as the agent sent it; for a call that `continues` another,
    /// `messages` holds only what follows that call's conversation and answer (so a
    /// long episode's record grows with its calls, not with their square). For a
    /// refused call, `{"bytes": <the body's length>, "head": <its first bytes>}`: a
    /// refused body may be anything up to the endpoint's limit, and is not kept whole.
    pub request: Value,
    /// What it was answered: the assistant message (chat) or `{"text": ...}`, or the
    /// error.
    pub reply: Value,
    /// The OpenAI finish reason it was answered with.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<String>,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}
