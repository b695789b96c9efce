//! The trajectory: what an episode hands the trainer.
//!
//! The shape follows verl's agent-loop output, which most trainers consume or convert
//! from: `prompt_ids`, then `response_ids` (everything after the prompt: the model's
//! tokens and the observation tokens between its turns), a `loss_mask` aligned with
//! `response_ids` (1 on tokens the model produced, 0 on observations) and the rollout
//! `logprobs` aligned the same way (0 on observations). Every model token is the ID the
//! inference server returned, appended verbatim; nothing is decoded and encoded again.

use serde::{Deserialize, Serialize};

use super::parse::{CallError, ToolCall};
use crate::domain::backend::LogprobsMode;
use crate::domain::policy::{VersionSpan, extend_spans, version_range};

/// Why an episode ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FinishReason {
    /// The model called the `finish` tool.
    Finished,
    /// A turn had no tool call (and the task stops on that).
    NoToolCall,
    /// The task's turn limit was reached.
    MaxTurns,
    /// The context (prompt and response) reached the task's token limit.
    ContextLength,
    /// One turn reached the per-turn token limit before the model ended it.
    TurnLength,
    /// The episode's wall-clock limit was reached.
    Timeout,
    /// The agent program of an `agent_program` episode exited (whatever its status).
    Exited,
    /// The agent program's calls were refused as often as its episode allows
    /// (`limits.max_refused_calls`): the episode was ended there.
    RefusedCalls,
}

impl FinishReason {
    /// The snake-case name used in results and metrics.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Finished => "finished",
            FinishReason::NoToolCall => "no_tool_call",
            FinishReason::MaxTurns => "max_turns",
            FinishReason::ContextLength => "context_length",
            FinishReason::TurnLength => "turn_length",
            FinishReason::Timeout => "timeout",
            FinishReason::Exited => "exited",
            FinishReason::RefusedCalls => "refused_calls",
        }
    }
}

/// One tool call of a turn as it was executed.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolRecord {
    /// The call as parsed (`None` when the model's text could not be parsed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<ToolCall>,
    /// Why the call could not be parsed or run, as the model was told.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<CallError>,
    /// The observation text the model saw.
    pub observation: String,
    /// Whether the tool ran and succeeded (a command exiting non-zero still ran).
    pub ok: bool,
    /// Time the call took, as the RUN worker saw it (µs).
    pub latency_us: u64,
}

/// One model turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Turn {
    /// The model's text (its token IDs decoded, for reading; training uses the IDs).
    pub text: String,
    /// Where the model's tokens of this turn are in `response_ids`: `[start, end)`.
    pub model_range: [usize; 2],
    /// Where the observation tokens that followed are in `response_ids` (empty when the
    /// episode ended on this turn).
    pub observation_range: [usize; 2],
    /// The tool calls, in order.
    pub tools: Vec<ToolRecord>,
    /// The backend that generated the turn.
    pub backend: String,
    /// Why generation stopped, as the server said.
    pub generation_finish: String,
    /// Wall time of the turn's generation (µs), retries and moves included.
    pub llm_latency_us: u64,
    /// Of that, time waiting for backends to answer (µs): requests in flight and
    /// backoff between retries.
    pub backend_wait_us: u64,
    /// Time in tools (µs).
    pub tool_latency_us: u64,
    /// The RUN worker's own time in this turn (µs): building requests and reading
    /// answers, parsing, rendering, tokenizing, bookkeeping; the turn's wall time minus
    /// the backend's and the tools' time.
    pub overhead_us: u64,
    /// Prompt tokens the backend found in its prefix cache, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cached_prompt_tokens: Option<u64>,
    /// Prompt length of this turn's request.
    pub prompt_tokens: usize,
    /// Which logprobs the backend returned for this turn (`raw`: before temperature
    /// and top-k/top-p; `processed`: after them).
    pub logprobs_mode: LogprobsMode,
    /// The policy version current when the turn's generation was sent (absent before
    /// the trainer announces one); its tokens carry it in the trajectory's
    /// `policy_versions`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<i64>,
    /// Set when a newer version was announced while the turn generated (the trainer
    /// updated the servers without pausing them): the turn's tokens may come from
    /// either, and carry the older, `policy_version`, so that staleness is never
    /// understated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version_end: Option<i64>,
    /// How many times the server aborted this turn's generation (a weight update in
    /// `abort` mode) and the turn went on from the tokens generated so far: a partial
    /// rollout, whose parts carry their own versions in `policy_versions`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub continued: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

pub use crate::backends::generate::BackendSwitch;

/// Whether re-tokenizing the finished conversation's text would give the same tokens.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Drift {
    /// True when the chat template's rendering of the whole conversation, tokenized,
    /// equals `prompt_ids + response_ids` (up to the template's end-of-turn text after
    /// the last token).
    pub identical: bool,
    /// The first index into `prompt_ids + response_ids` where they differ.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_difference: Option<usize>,
    /// Length of the re-tokenized sequence (0 when the check could not be made).
    pub retokenized_len: usize,
    /// Set when the check itself could not be made, with the reason: the chat template
    /// refused to re-render the conversation (Llama 3.1's refuses two calls in one
    /// turn), say. `identical` is then false: nothing was verified, and a trainer that
    /// re-tokenizes text cannot rely on getting these tokens back.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl Drift {
    /// The verdict of a check that could not be made, for `reason`.
    pub fn unchecked(reason: String) -> Self {
        Drift {
            identical: false,
            first_difference: None,
            retokenized_len: 0,
            error: Some(reason),
        }
    }

    /// The verdict as the drift metric labels it: `false`, `true`, or `error`.
    pub fn label(&self) -> &'static str {
        match (&self.error, self.identical) {
            (Some(_), _) => "error",
            (None, true) => "false",
            (None, false) => "true",
        }
    }
}

/// A finished (or partial) episode.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Trajectory {
    /// The rendered prompt's token IDs.
    pub prompt_ids: Vec<u32>,
    /// Everything after the prompt: model tokens and observation tokens.
    pub response_ids: Vec<u32>,
    /// 1 where `response_ids` holds a model token, 0 on observation tokens.
    pub loss_mask: Vec<u8>,
    /// The rollout logprob of each model token; 0 on observation tokens.
    pub logprobs: Vec<f32>,
    /// The turns.
    pub turns: Vec<Turn>,
    /// Why it ended (`None` while it runs, or when it failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finish_reason: Option<FinishReason>,
    /// The answer given with the `finish` tool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// The backend of the last turn.
    pub backend: String,
    /// The model name.
    pub model: String,
    /// Moves to other backends.
    pub backend_switches: Vec<BackendSwitch>,
    /// Which logprobs `logprobs` holds: `raw` or `processed` when every turn's came
    /// from backends of that kind, `mixed` when an episode moved between backends that
    /// differ (each turn says which), absent before the first turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logprobs_mode: Option<String>,
    /// The re-tokenization check (absent on a partial trajectory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<Drift>,
    /// Which policy version produced which model tokens: run-length spans over
    /// `response_ids`, in order (empty when no version was ever announced).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policy_versions: Vec<VersionSpan>,
    /// The oldest version any model token came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version_oldest: Option<i64>,
    /// The newest version any model token came from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version_newest: Option<i64>,
    /// The conversation as messages (for logs and for trainers that want text).
    pub messages: Vec<serde_json::Value>,
    /// Tool calls the model made over the turns (a successful `finish` is the end, not
    /// a call); absent where the service does not see the tools (an agent program runs
    /// its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<u32>,
    /// Of those, the ones that failed: refused (unparsable, unknown tool) or answered
    /// with an error. A training run follows the rate as a sign of a policy that lost
    /// the tools' format.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_errors: Option<u32>,
}

impl Trajectory {
    /// An empty trajectory starting from `prompt_ids`.
    pub fn new(prompt_ids: Vec<u32>, model: &str, messages: Vec<serde_json::Value>) -> Self {
        Trajectory {
            prompt_ids,
            response_ids: Vec::new(),
            loss_mask: Vec::new(),
            logprobs: Vec::new(),
            turns: Vec::new(),
            finish_reason: None,
            answer: None,
            backend: String::new(),
            model: model.to_string(),
            backend_switches: Vec::new(),
            logprobs_mode: None,
            drift: None,
            policy_versions: Vec::new(),
            policy_version_oldest: None,
            policy_version_newest: None,
            messages,
            tool_calls: None,
            tool_errors: None,
        }
    }

    /// Counts `turn`'s tool calls and failed ones into [`Trajectory::tool_calls`] and
    /// [`Trajectory::tool_errors`]; `finish` is the name of the tool that ends the
    /// episode (its successful call is not counted).
    pub fn count_tools(&mut self, turn: &Turn, finish: &str) {
        let calls = turn
            .tools
            .iter()
            .filter(|t| !(t.ok && t.call.as_ref().is_some_and(|c| c.name == finish)));
        let (mut n, mut failed) = (0u32, 0u32);
        for t in calls {
            n += 1;
            failed += u32::from(!t.ok);
        }
        *self.tool_calls.get_or_insert(0) += n;
        *self.tool_errors.get_or_insert(0) += failed;
    }

    /// Records that the model tokens `response_ids[from..to]` came from policy
    /// `version`.
    pub fn note_policy_version(&mut self, version: i64, from: usize, to: usize) {
        extend_spans(&mut self.policy_versions, version, from, to);
        let range = version_range(&self.policy_versions);
        self.policy_version_oldest = range.map(|(oldest, _)| oldest);
        self.policy_version_newest = range.map(|(_, newest)| newest);
    }

    /// Records that a turn's logprobs are of `mode`.
    pub fn note_logprobs_mode(&mut self, mode: LogprobsMode) {
        self.logprobs_mode = match self.logprobs_mode.take() {
            None => Some(mode.as_str().to_string()),
            Some(m) if m == mode.as_str() => Some(m),
            Some(_) => Some("mixed".to_string()),
        };
    }

    /// Total tokens: prompt and response.
    pub fn len(&self) -> usize {
        self.prompt_ids.len() + self.response_ids.len()
    }

    /// Whether there are no tokens at all.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends tokens the model produced, with their logprobs.
    pub fn push_model(&mut self, ids: &[u32], logprobs: &[f32]) {
        debug_assert_eq!(ids.len(), logprobs.len());
        self.response_ids.extend_from_slice(ids);
        self.loss_mask.extend(std::iter::repeat_n(1u8, ids.len()));
        self.logprobs.extend_from_slice(logprobs);
    }

    /// Appends tokens the model did not produce (observations, templates' glue).
    pub fn push_observation(&mut self, ids: &[u32]) {
        self.response_ids.extend_from_slice(ids);
        self.loss_mask.extend(std::iter::repeat_n(0u8, ids.len()));
        self.logprobs.extend(std::iter::repeat_n(0.0f32, ids.len()));
    }

    /// The whole token sequence: what the model's next request would carry.
    pub fn all_ids(&self) -> Vec<u32> {
        let mut v = Vec::with_capacity(self.len());
        v.extend_from_slice(&self.prompt_ids);
        v.extend_from_slice(&self.response_ids);
        v
    }
}

/// Compares `ours` with the re-tokenized conversation `again`; `tail` is what the
/// template writes after a turn's end-of-turn token (ChatML's `"\n"`), which no model
/// emits and which may legitimately follow our last token; `stops` are the model's
/// end-of-turn tokens, one of which may legitimately end ours where `again` stops just
/// before it (the templates that write none after the conversation's last message,
/// Kimi-K2's and GLM-4.5's: the model did emit it, and is trained to).
pub fn compare(ours: &[u32], again: &[u32], tail: &[u32], stops: &[u32]) -> Drift {
    let first = ours.iter().zip(again).position(|(a, b)| a != b);
    let retokenized_len = again.len();
    let same = match first {
        Some(_) => false,
        None if again.len() == ours.len() => true,
        None if again.len() > ours.len() => &again[ours.len()..] == tail,
        None => ours.len() == again.len() + 1 && ours.last().is_some_and(|t| stops.contains(t)),
    };
    Drift {
        identical: same,
        first_difference: if same {
            None
        } else {
            Some(first.unwrap_or(ours.len().min(again.len())))
        },
        retokenized_len,
        error: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn masks_and_logprobs_stay_aligned() {
        let mut t = Trajectory::new(vec![1, 2], "m", vec![]);
        t.push_model(&[3, 4], &[-0.1, -0.2]);
        t.push_observation(&[5]);
        t.push_model(&[6], &[-0.3]);
        assert_eq!(t.response_ids, vec![3, 4, 5, 6]);
        assert_eq!(t.loss_mask, vec![1, 1, 0, 1]);
        assert_eq!(t.logprobs, vec![-0.1, -0.2, 0.0, -0.3]);
        assert_eq!(t.all_ids(), vec![1, 2, 3, 4, 5, 6]);
    }

    #[test]
    fn drift_verdicts() {
        assert!(compare(&[1, 2, 3], &[1, 2, 3], &[], &[]).identical);
        assert!(compare(&[1, 2, 3], &[1, 2, 3, 9], &[9], &[]).identical);
        let d = compare(&[1, 2, 3], &[1, 7, 3], &[], &[]);
        assert_eq!((d.identical, d.first_difference), (false, Some(1)));
        let d = compare(&[1, 2, 3], &[1, 2, 3, 4, 5], &[9], &[]);
        assert_eq!((d.identical, d.first_difference), (false, Some(3)));
        let d = compare(&[1, 2, 3], &[1, 2], &[], &[]);
        assert_eq!((d.identical, d.first_difference), (false, Some(2)));
        // Our last token an end-of-turn token a re-render leaves out: no drift. Any
        // other token, or more than one, is.
        assert!(compare(&[1, 2, 3], &[1, 2], &[], &[3]).identical);
        let d = compare(&[1, 2, 3], &[1, 2], &[], &[4]);
        assert_eq!((d.identical, d.first_difference), (false, Some(2)));
        let d = compare(&[1, 2, 3, 3], &[1, 2], &[], &[3]);
        assert_eq!((d.identical, d.first_difference), (false, Some(2)));
    }
}
