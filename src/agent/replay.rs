//! Recordings and replays of episodes.
//!
//! A finished episode's result is its recording. For the built-in loop, that is each
//! turn's token IDs and logprobs (in `response_ids`), its text, and each tool call with
//! its observation. For an agent program, it is each call's request, reply and tokens
//! (in its `samples`). A replay runs the task again in a fresh sandbox, with the model
//! side played back from the recording ([`Replayer`], a [`Generator`] that answers
//! every request with the recorded tokens) and the tools run for real. It reports the
//! first divergence: the first request whose prompt is not the recorded one (something
//! the environment returned differs), and, for the built-in loop, the first tool whose
//! observation differs. Graders and environments can so be checked against old
//! episodes without a GPU; no backend is called.
//!
//! A replay shows the recorded episode (its text, its tokens) in its own result, so
//! who may replay what is scoped ([`check_scope`]): a task may replay a job of its own
//! batch; a job of another batch only when its spec says so
//! (`replay_across_batches: true`), so that a task set cannot pull another batch's
//! recordings into this one's results without the submitter meaning it.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::trajectory::{BackendSwitch, Trajectory};
use crate::backends::generate::{GenerateError, Generated, Generator};
use crate::backends::wire::{Finish, Generation, Sampling};
use crate::domain::backend::LogprobsMode;

/// One recorded model request: the prompt it was sent and what it produced.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordedCall {
    /// The prompt's token IDs.
    pub prompt: Vec<u32>,
    /// The output's token IDs.
    pub output: Vec<u32>,
    /// Their logprobs.
    pub logprobs: Vec<f32>,
    /// How the generation ended (`stop` or `length`).
    pub finish: Finish,
}

/// Why a run's output cannot be replayed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("the recording cannot be read: {0}")]
pub struct RecordingError(pub String);

/// The model side of a recorded run, in order: the built-in loop's turns, or an agent
/// program's calls (refused calls, which generated nothing, left out).
pub fn recorded_calls(run: &Value) -> Result<Vec<RecordedCall>, RecordingError> {
    if let Some(calls) = run.get("calls").and_then(Value::as_array) {
        let samples: Vec<Trajectory> = serde_json::from_value(run["samples"].clone())
            .map_err(|e| RecordingError(format!("`samples`: {e}")))?;
        let mut out = Vec::new();
        for (i, c) in calls.iter().enumerate() {
            let (Some(s), Some(t)) = (c["sample"].as_u64(), c["turn"].as_u64()) else {
                continue;
            };
            let sample = samples
                .get(usize::try_from(s).unwrap_or(usize::MAX))
                .ok_or_else(|| {
                    RecordingError(format!("call {i} names sample {s}, which is missing"))
                })?;
            out.push(turn_call(
                sample,
                usize::try_from(t).unwrap_or(usize::MAX),
                i,
            )?);
        }
        return Ok(out);
    }
    let traj: Trajectory = serde_json::from_value(run.clone())
        .map_err(|e| RecordingError(format!("not a trajectory: {e}")))?;
    (0..traj.turns.len())
        .map(|t| turn_call(&traj, t, t))
        .collect()
}

/// Turn `t` of `traj` as a recorded call (`what` names it in errors).
fn turn_call(traj: &Trajectory, t: usize, what: usize) -> Result<RecordedCall, RecordingError> {
    let turn = traj
        .turns
        .get(t)
        .ok_or_else(|| RecordingError(format!("call {what} names turn {t}, which is missing")))?;
    let [a, b] = turn.model_range;
    if a > b || b > traj.response_ids.len() || b > traj.logprobs.len() {
        return Err(RecordingError(format!(
            "turn {t}'s model range is outside its tokens"
        )));
    }
    let mut prompt = traj.prompt_ids.clone();
    prompt.extend_from_slice(&traj.response_ids[..a]);
    Ok(RecordedCall {
        prompt,
        output: traj.response_ids[a..b].to_vec(),
        logprobs: traj.logprobs[a..b].to_vec(),
        finish: if turn.generation_finish == "length" {
            Finish::Length
        } else {
            Finish::Stop
        },
    })
}

/// Where a replay first left its recording.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// The request (turn or call, 0-based) whose prompt differs.
    pub call: usize,
    /// The first token index where the prompts differ.
    pub at_token: usize,
    /// The recorded prompt's length.
    pub recorded_tokens: usize,
    /// The replayed prompt's length.
    pub replayed_tokens: usize,
    /// The text around the difference, recorded and replayed (decoded, for reading).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub recorded_text: Option<String>,
    /// See `recorded_text`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub replayed_text: Option<String>,
}

/// Why a task of batch `batch` may not replay `original`, if it may not: a replay is
/// scoped to its own batch, unless its spec permits another (`across_batches`, its
/// `replay_across_batches`). Checked at submit and again before RUN plays a recording.
pub fn check_scope(
    original: &crate::domain::Job,
    batch: &str,
    across_batches: bool,
) -> Result<(), ScopeError> {
    if original.batch_id == batch || across_batches {
        return Ok(());
    }
    Err(ScopeError {
        job: original.id.clone(),
        batch: original.batch_id.clone(),
    })
}

/// A replay of a job of another batch, not permitted by its spec.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error(
    "job `{job}` is of batch `{batch}`: a task replays jobs of its own batch only, unless its spec says `replay_across_batches: true` (a replay shows the recorded episode in its result)"
)]
pub struct ScopeError {
    /// The job it would replay.
    pub job: String,
    /// That job's batch.
    pub batch: String,
}

/// The task that replays `job` in batch `into`: its own task with `spec.replay_of` set
/// (and `replay_across_batches` when `into` is not the job's batch: whoever names a
/// job to replay asks for it explicitly), under a client id of its own. Only an
/// `agent` or `agent_program` job that finished its RUN stage has a recording.
pub fn replay_task(
    job: &crate::domain::Job,
    into: &str,
) -> Result<crate::domain::Task, RecordingError> {
    if job.kind != "agent" && job.kind != "agent_program" {
        return Err(RecordingError(format!(
            "job {} is a `{}` job; only `agent` and `agent_program` episodes are recorded",
            job.id, job.kind
        )));
    }
    let recorded = job
        .run_output
        .as_ref()
        .filter(|o| o.get("turns").is_some() || o.get("calls").is_some());
    if recorded.is_none() {
        return Err(RecordingError(format!(
            "job {} has no recorded episode yet (status {}, stage {}): replay it once its RUN stage has finished",
            job.id,
            job.status.as_str(),
            job.stage.as_str()
        )));
    }
    let mut spec = job.task["spec"].clone();
    spec["replay_of"] = Value::String(job.id.clone());
    if job.batch_id != into {
        spec["replay_across_batches"] = Value::Bool(true);
    }
    let mut task = crate::domain::Task::new(&job.kind, spec);
    task.client_id = Some(format!(
        "replay-{}-{}",
        job.id,
        uuid::Uuid::now_v7().simple()
    ));
    task.metadata = serde_json::json!({"replay_of": job.id});
    Ok(task)
}

/// A recorded episode as a policy file of the stand-in inference server
/// (`rollout-scripted-llm serve --policy`): one rule, matching the episode's opening
/// user message, that plays its model turns in order. A stand-in serving it answers the
/// same task with the same turns, so a recording becomes a script for tests and demos.
/// An agent program whose calls made several samples (several conversations) cannot be
/// played this way: the stand-in counts turns within one conversation.
pub fn as_policy(job: &crate::domain::Job) -> Result<Value, RecordingError> {
    let run = job
        .run_output
        .as_ref()
        .ok_or_else(|| RecordingError(format!("job {} has no recorded episode", job.id)))?;
    let (messages, texts): (Vec<Value>, Vec<String>) = if let Some(calls) = run["calls"].as_array()
    {
        let answered: Vec<&Value> = calls.iter().filter(|c| c["sample"].is_u64()).collect();
        if answered.iter().any(|c| c["sample"] != 0) {
            return Err(RecordingError(format!(
                "job {}'s calls made several samples (conversations); a stand-in policy plays one",
                job.id
            )));
        }
        let first = answered.first().map(|c| c["request"]["messages"].clone());
        let texts = run["samples"][0]["turns"]
            .as_array()
            .map(|t| {
                t.iter()
                    .map(|t| t["text"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default();
        (
            first
                .and_then(|m| m.as_array().cloned())
                .unwrap_or_default(),
            texts,
        )
    } else {
        let texts = run["turns"]
            .as_array()
            .map(|t| {
                t.iter()
                    .map(|t| t["text"].as_str().unwrap_or_default().to_string())
                    .collect()
            })
            .unwrap_or_default();
        let messages = job.task["spec"]["messages"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        (messages, texts)
    };
    let opening = messages
        .iter()
        .rev()
        .find(|m| m["role"] == "user")
        .and_then(|m| m["content"].as_str())
        .filter(|c| !c.is_empty())
        .ok_or_else(|| {
            RecordingError(format!(
                "job {} opens with no user message to match",
                job.id
            ))
        })?;
    if texts.is_empty() {
        return Err(RecordingError(format!(
            "job {} recorded no model turn",
            job.id
        )));
    }
    Ok(
        serde_json::json!({"rules": [{"match": opening, "variants": [{"weight": 1.0, "turns": texts}]}]}),
    )
}

/// The report in a few lines, for a terminal.
pub fn describe(report: &ReplayReport) -> String {
    let mut out = format!(
        "model requests: {} recorded, {} replayed\n",
        report.recorded_calls, report.replayed_calls
    );
    match &report.divergence {
        None => out.push_str("every prompt was the recorded one: the environment answered as it did then\n"),
        Some(d) => out.push_str(&format!(
            "request {} first left the recording, at prompt token {} ({} tokens recorded, {} replayed)\n  then: {:?}\n  now:  {:?}\n",
            d.call,
            d.at_token,
            d.recorded_tokens,
            d.replayed_tokens,
            d.recorded_text.as_deref().unwrap_or_default(),
            d.replayed_text.as_deref().unwrap_or_default()
        )),
    }
    if let Some(t) = &report.tool_divergence {
        out.push_str(&format!(
            "the first tool answering otherwise: turn {}, call {} ({})\n  then: {:?}\n  now:  {:?}\n",
            t.turn,
            t.tool,
            t.call,
            clip(&t.recorded),
            clip(&t.replayed)
        ));
    }
    out
}

fn clip(s: &str) -> String {
    if s.chars().count() <= 200 {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(200).collect::<String>())
    }
}

/// A tool whose observation differs between the recording and the replay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolDivergence {
    /// The turn.
    pub turn: usize,
    /// The call's index in the turn.
    pub tool: usize,
    /// The call, as parsed.
    pub call: Value,
    /// What it returned then.
    pub recorded: String,
    /// What it returned now.
    pub replayed: String,
}

/// What a replay found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ReplayReport {
    /// The job replayed.
    pub of: String,
    /// The recorded model requests.
    pub recorded_calls: usize,
    /// The requests the replay made.
    pub replayed_calls: usize,
    /// The first request whose prompt was not the recorded one (none: the environment
    /// gave back the same tokens throughout).
    pub divergence: Option<Divergence>,
    /// For the built-in loop: the first tool whose observation differs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_divergence: Option<ToolDivergence>,
}

/// A [`Generator`] that plays a recording back: request `i` is answered with recorded
/// call `i`'s tokens, whatever its prompt; the first prompt that is not the recorded one
/// is noted. A request past the recording's end fails: the replay asked for more than
/// the episode made.
pub struct Replayer {
    calls: Vec<RecordedCall>,
    next: usize,
    divergence: Option<(usize, Vec<u32>)>,
}

impl Replayer {
    /// Plays `calls`.
    pub fn new(calls: Vec<RecordedCall>) -> Self {
        Replayer {
            calls,
            next: 0,
            divergence: None,
        }
    }

    /// The report, with the differing text decoded by `decode`.
    pub fn report(&self, of: &str, decode: impl Fn(&[u32]) -> String) -> ReplayReport {
        let divergence = self.divergence.as_ref().map(|(call, got)| {
            let want = &self.calls[*call].prompt;
            let at = want
                .iter()
                .zip(got)
                .position(|(a, b)| a != b)
                .unwrap_or(want.len().min(got.len()));
            let around = |ids: &[u32]| {
                let from = at.saturating_sub(8).min(ids.len());
                let to = (at + 24).min(ids.len());
                decode(&ids[from..to])
            };
            Divergence {
                call: *call,
                at_token: at,
                recorded_tokens: want.len(),
                replayed_tokens: got.len(),
                recorded_text: Some(around(want)),
                replayed_text: Some(around(got)),
            }
        });
        ReplayReport {
            of: of.to_string(),
            recorded_calls: self.calls.len(),
            replayed_calls: self.next,
            divergence,
            tool_divergence: None,
        }
    }
}

#[async_trait]
impl Generator for Replayer {
    async fn generate(
        &mut self,
        prompt_ids: &[u32],
        _sampling: &Sampling,
        _turn: usize,
    ) -> Result<Generated, GenerateError> {
        let i = self.next;
        let Some(rec) = self.calls.get(i) else {
            return Err(GenerateError::Refused(format!(
                "the recording holds {} model requests and the replay asked for another",
                self.calls.len()
            )));
        };
        if self.divergence.is_none() && rec.prompt != prompt_ids {
            self.divergence = Some((i, prompt_ids.to_vec()));
        }
        self.next += 1;
        Ok(Generated {
            generation: Generation {
                token_ids: rec.output.clone(),
                logprobs: rec.logprobs.clone(),
                finish: rec.finish,
                cached_prompt_tokens: None,
                text: None,
                after_pause: false,
                weight_versions: None,
            },
            backend: "replay".into(),
            logprobs_mode: LogprobsMode::Raw,
            backend_wait: std::time::Duration::ZERO,
        })
    }

    fn take_switches(&mut self) -> Vec<BackendSwitch> {
        Vec::new()
    }
}

/// The first tool call whose observation differs between the recorded trajectory and
/// the replayed one (the built-in loop's).
pub fn first_tool_divergence(recorded: &Value, replayed: &Trajectory) -> Option<ToolDivergence> {
    let turns = recorded["turns"].as_array()?;
    for (t, (rec, now)) in turns.iter().zip(&replayed.turns).enumerate() {
        let rec_tools = rec["tools"].as_array().cloned().unwrap_or_default();
        for (i, r) in rec_tools.iter().enumerate() {
            let then = r["observation"].as_str().unwrap_or_default();
            let now_obs = now.tools.get(i).map_or("", |x| x.observation.as_str());
            if then != now_obs {
                return Some(ToolDivergence {
                    turn: t,
                    tool: i,
                    call: r["call"].clone(),
                    recorded: then.to_string(),
                    replayed: now_obs.to_string(),
                });
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn run() -> Value {
        let mut t = Trajectory::new(vec![1, 2], "m", vec![]);
        t.push_model(&[3, 4], &[-0.1, -0.2]);
        t.push_observation(&[5]);
        t.push_model(&[6, 7], &[-0.3, -0.4]);
        let turn = |a: usize, b: usize| {
            json!({"text": "", "model_range": [a, b], "observation_range": [b, b], "tools": [],
                   "backend": "b", "generation_finish": "stop", "llm_latency_us": 0,
                   "backend_wait_us": 0, "tool_latency_us": 0, "overhead_us": 0,
                   "prompt_tokens": 0, "logprobs_mode": "raw"})
        };
        let mut v = serde_json::to_value(&t).unwrap();
        v["turns"] = json!([turn(0, 2), turn(3, 5)]);
        v
    }

    #[tokio::test]
    async fn a_recording_plays_back_and_notes_the_first_prompt_that_differs() {
        let calls = recorded_calls(&run()).unwrap();
        assert_eq!(calls[1].prompt, vec![1, 2, 3, 4, 5]);
        assert_eq!(calls[1].output, vec![6, 7]);
        let mut r = Replayer::new(calls);
        let s = Sampling::default();
        assert_eq!(
            r.generate(&[1, 2], &s, 0)
                .await
                .unwrap()
                .generation
                .token_ids,
            vec![3, 4]
        );
        // The environment answered otherwise: token 4 of the prompt differs.
        let g = r.generate(&[1, 2, 3, 4, 9], &s, 1).await.unwrap();
        assert_eq!(g.generation.token_ids, vec![6, 7]);
        assert!(
            r.generate(&[1], &s, 2).await.is_err(),
            "past the recording's end"
        );
        let report = r.report("j", |ids| format!("{ids:?}"));
        let d = report.divergence.unwrap();
        assert_eq!((d.call, d.at_token, d.recorded_tokens), (1, 4, 5));
        assert_eq!(report.replayed_calls, 2);
    }

    #[test]
    fn an_agent_programs_calls_are_read_from_its_samples() {
        let sample = run();
        let program = json!({
            "samples": [sample],
            "calls": [{"sample": 0, "turn": 0}, {"reason": "refused"}, {"sample": 0, "turn": 1}],
        });
        let calls = recorded_calls(&program).unwrap();
        assert_eq!(calls.len(), 2, "the refused call generated nothing");
        assert_eq!(calls[1].prompt, vec![1, 2, 3, 4, 5]);
        let broken = json!({"samples": [], "calls": [{"sample": 0, "turn": 0}]});
        assert!(recorded_calls(&broken).is_err());
    }
}
