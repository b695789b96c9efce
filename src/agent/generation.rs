//! One model turn's generation, shared by the built-in loop and the model endpoint of
//! agent programs: the turn waits while a weight update holds generation, reads the
//! job's status alongside, stops at the episode's deadline, goes on from its tokens
//! when the server aborts it (an update in `abort` mode), and tags every token with the
//! policy version that produced it.

use std::ops::ControlFlow;
use std::time::{Duration, Instant};

use async_trait::async_trait;

use super::trajectory::FinishReason;
use crate::backends::generate::{GenerateError, Generated, Generator};
use crate::backends::wire::{Finish, Generation, Sampling};
use crate::domain::duration_us;
use crate::policy::PolicyWatch;

/// Whether the job is still wanted; read at every turn boundary.
#[async_trait]
pub trait TurnGuard: Send + Sync {
    /// False once the job was cancelled or taken over.
    async fn still_wanted(&self) -> bool;
}

/// A guard that always says yes (tests, benchmarks).
#[derive(Debug, Clone, Copy, Default)]
pub struct AlwaysWanted;

#[async_trait]
impl TurnGuard for AlwaysWanted {
    async fn still_wanted(&self) -> bool {
        true
    }
}

/// What a turn's generation needs from its episode.
pub(crate) struct TurnSource<'a> {
    /// The current policy version, and the hold of a weight update.
    pub policy: &'a PolicyWatch,
    /// When the episode must end.
    pub deadline: tokio::time::Instant,
    /// The sampling parameters, the model's stop tokens among the stop tokens.
    pub sampling: &'a Sampling,
    /// Tokens at most in one turn.
    pub max_new_tokens: usize,
}

/// Why a turn's generation stopped the episode.
#[derive(Debug)]
pub(crate) enum GenStop {
    /// The job is no longer wanted.
    Cancelled,
    /// No backend could go on.
    Backend(String),
}

/// The policy versions a turn's generation ran under: the version current when each of
/// its parts was sent (one part, unless the server aborted it and the turn went on from
/// its tokens), and the version current when the last came back.
#[derive(Debug, Clone)]
pub(crate) struct TurnVersions {
    /// The turn's tokens in runs, each with the version that produced it
    /// ([`part_spans`]), in order.
    pub(crate) spans: Vec<(usize, Option<i64>)>,
    /// How many requests generated the turn (more than one when aborts cut it).
    pub(crate) parts: usize,
    /// The version current when the last part came back.
    pub(crate) answered: Option<i64>,
}

impl TurnVersions {
    /// The version of the turn's first tokens (its oldest).
    pub(crate) fn sent(&self) -> Option<i64> {
        self.spans.first().and_then(|&(_, v)| v)
    }

    /// The newer version, when one was announced while the last part generated and
    /// its last tokens are not tagged with it.
    pub(crate) fn changed(&self) -> Option<i64> {
        let last = self.spans.last().and_then(|&(_, v)| v);
        (self.answered != last).then_some(self.answered).flatten()
    }
}

/// The runs of generation `g`'s tokens, each with the policy version that produced
/// it: the server's own labels where it gives one for every token (vLLM 0.33's
/// `weight_versions`; the service labels each backend's weights with the version it
/// makes current), else `version` for all of them. A label is believed only between
/// `version` (the version the request was sent under) and `answered` (the newest the
/// episode knew when the answer came): that is where an update can have fallen, and a
/// label outside it (another numbering, a backend labelled by someone else) would
/// otherwise make a sample look fresher, or staler, than it is.
pub(crate) fn part_spans(
    g: &Generation,
    version: Option<i64>,
    answered: Option<i64>,
) -> Vec<(usize, Option<i64>)> {
    let n = g.token_ids.len();
    let whole = vec![(n, version)];
    let (Some(spans), Some(low), Some(high)) = (&g.weight_versions, version, answered) else {
        return whole;
    };
    let mut at = 0;
    let mut runs: Vec<(usize, Option<i64>)> = Vec::with_capacity(spans.len());
    for s in spans {
        let label = s.version.trim().parse::<i64>().ok();
        let Some(v) = label.filter(|v| (low..=high).contains(v)) else {
            return whole;
        };
        if s.start != at || s.end <= s.start || s.end > n {
            return whole;
        }
        match runs.last_mut() {
            Some((len, Some(last))) if *last == v => *len += s.end - s.start,
            _ => runs.push((s.end - s.start, Some(v))),
        }
        at = s.end;
    }
    if at == n && n > 0 { runs } else { whole }
}

/// How many times in a row one turn's generation may be aborted with no token gained
/// before the episode gives up on the backend.
const MAX_EMPTY_ABORTS: u32 = 20;

/// Generates the turn, reading the job's status alongside (so the read costs
/// nothing) and watching the deadline; returns the generation, its latency, and the
/// policy versions it ran under. A weight update in progress holds the turn until
/// its resume; a generation the server aborts (an update in `abort` mode) goes on,
/// once the update is over, from the tokens it had generated: they are kept, with
/// their logprobs and version, and the rest is generated under the new version.
pub(crate) async fn generate_turn(
    source: &TurnSource<'_>,
    llm: &mut dyn Generator,
    guard: &dyn TurnGuard,
    context: &[u32],
    turn: usize,
    room: usize,
) -> Result<ControlFlow<FinishReason, (Generated, u64, TurnVersions)>, GenStop> {
    let mut sampling = source.sampling.clone();
    let budget = match source.budget(room) {
        Ok(budget) => budget,
        Err(why) => return Ok(ControlFlow::Break(why)),
    };
    let t_llm = Instant::now();
    let check = guard.still_wanted();
    tokio::pin!(check);
    let mut checked = false;
    let mut parts: Vec<(Generated, Option<i64>)> = Vec::new();
    let mut empty_aborts = 0u32;
    loop {
        let so_far: usize = parts
            .iter()
            .map(|(g, _)| g.generation.token_ids.len())
            .sum();
        if so_far >= budget {
            // Aborted with the whole budget generated: the turn is complete.
            break;
        }
        // A continuation sends the turn's tokens so far after the context.
        let continued: Option<Vec<u32>> = (!parts.is_empty()).then(|| {
            let mut prompt = context.to_vec();
            for (g, _) in &parts {
                prompt.extend_from_slice(&g.generation.token_ids);
            }
            prompt
        });
        let sampling = &mut sampling;
        let llm = &mut *llm;
        let generate = async move {
            let held = Instant::now();
            source.policy.ready().await;
            if held.elapsed() > Duration::from_millis(1) {
                metrics::histogram!(crate::metrics::TURN_HELD).record(held.elapsed().as_secs_f64());
            }
            let sent_under = source.policy.current();
            sampling.max_tokens = Some((budget - so_far) as u64);
            // KV the servers computed under another version must not be reused
            // under this one: the version is the prefix cache's namespace.
            sampling.cache_salt = sent_under.map(|v| format!("policy-v{v}"));
            let prompt = continued.as_deref().unwrap_or(context);
            let r = llm.generate(prompt, sampling, turn).await;
            (r, sent_under)
        };
        tokio::pin!(generate);
        let (generated, sent_under) = loop {
            tokio::select! {
                g = &mut generate => break g,
                wanted = &mut check, if !checked => {
                    checked = true;
                    if !wanted {
                        return Err(GenStop::Cancelled);
                    }
                }
                _ = tokio::time::sleep_until(source.deadline) => {
                    return Ok(ControlFlow::Break(FinishReason::Timeout));
                }
            }
        };
        match generated.map(|g| source.settle(g, sent_under)) {
            Ok((g, sent_under, false)) => {
                let gained = g.generation.token_ids.len();
                tracing::info!(
                    tokens = gained,
                    turn = turn,
                    "generation aborted by the server: the turn goes on from its tokens once generation resumes"
                );
                metrics::counter!(crate::metrics::GENERATIONS_CONTINUED).increment(1);
                empty_aborts = if gained == 0 { empty_aborts + 1 } else { 0 };
                if empty_aborts > MAX_EMPTY_ABORTS {
                    return Err(GenStop::Backend(format!(
                        "the backend aborted this turn's generation {empty_aborts} times in a row without generating a token"
                    )));
                }
                parts.push((g, sent_under));
                // The abort may be an update's, whose broadcast can come after its
                // answer: read the pause from the database before going on.
                source.policy.catch_up().await;
            }
            Ok((g, sent_under, true)) => {
                parts.push((g, sent_under));
                break;
            }
            Err(GenerateError::ContextFull(_)) => {
                return Ok(ControlFlow::Break(FinishReason::ContextLength));
            }
            Err(e) => return Err(GenStop::Backend(e.to_string())),
        }
    }
    let llm_us = duration_us(t_llm.elapsed());
    let answered = source.policy.current();
    let versions = TurnVersions {
        spans: parts
            .iter()
            .flat_map(|(g, v)| part_spans(&g.generation, *v, answered))
            .collect(),
        parts: parts.len(),
        answered,
    };
    // A budget above 0 makes at least one part.
    let done = |whole| ControlFlow::Continue((whole, llm_us, versions));
    Ok(join_parts(parts).map_or(ControlFlow::Break(FinishReason::TurnLength), done))
}

impl TurnSource<'_> {
    /// The most tokens the turn may generate with `room` left in the context (a
    /// task's own `max_tokens` can only lower the per-turn limit); when that is none,
    /// why the turn cannot be asked for (no room left, or a limit of 0 tokens).
    fn budget(&self, room: usize) -> Result<usize, FinishReason> {
        let asked = self
            .sampling
            .max_tokens
            .map_or(usize::MAX, |m| usize::try_from(m).unwrap_or(usize::MAX));
        match self.max_new_tokens.min(asked).min(room) {
            0 if room == 0 => Err(FinishReason::ContextLength),
            0 => Err(FinishReason::TurnLength),
            budget => Ok(budget),
        }
    }

    /// A generation part sent under `sent_under`, with the version its tokens carry and
    /// whether it ends the turn (see [`TurnSource::ends_turn`]). A request the server refused
    /// as paused was generated after the pause ended: under the weights current now,
    /// not those it was first sent under.
    fn settle(&self, mut g: Generated, sent_under: Option<i64>) -> (Generated, Option<i64>, bool) {
        let version = if g.generation.after_pause {
            self.policy.current()
        } else {
            sent_under
        };
        let ends = self.ends_turn(&mut g);
        (g, version, ends)
    }

    /// Whether generation `g` ends the turn: false when the server cut it (aborted) and
    /// the turn goes on from its tokens; true otherwise, including when it was aborted
    /// just as it produced a stop token (the turn is over, not cut: it is marked so).
    fn ends_turn(&self, g: &mut Generated) -> bool {
        if g.generation.finish != Finish::Aborted {
            return true;
        }
        let stopped = g
            .generation
            .token_ids
            .last()
            .is_some_and(|t| self.sampling.stop_token_ids.contains(t));
        if stopped {
            g.generation.finish = Finish::Stop;
        }
        stopped
    }
}

/// One turn's generation from its parts (a generation the server aborted, then its
/// continuation): their tokens and logprobs in order, the last part's finish, backend
/// and logprobs mode, the first part's cache hit, and the time waited on all. None
/// without a part (a turn whose budget was 0 asks the backend nothing).
fn join_parts(parts: Vec<(Generated, Option<i64>)>) -> Option<Generated> {
    let mut parts = parts.into_iter().map(|(g, _)| g);
    let mut whole = parts.next()?;
    for g in parts {
        whole.generation.token_ids.extend(g.generation.token_ids);
        whole.generation.logprobs.extend(g.generation.logprobs);
        whole.generation.finish = g.generation.finish;
        whole.generation.text = None;
        whole.backend = g.backend;
        whole.logprobs_mode = g.logprobs_mode;
        whole.backend_wait += g.backend_wait;
    }
    if whole.generation.finish == Finish::Aborted {
        // Aborted with the whole budget generated: as long as it may be.
        whole.generation.finish = Finish::Length;
    }
    Some(whole)
}

pub(crate) fn finish_name(f: Finish) -> &'static str {
    match f {
        Finish::Stop => "stop",
        Finish::Length => "length",
        Finish::Aborted => "aborted",
        Finish::Other => "other",
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::agent::trajectory::BackendSwitch;

    /// A backend that must not be asked.
    struct Unasked;

    #[async_trait]
    impl Generator for Unasked {
        async fn generate(
            &mut self,
            _prompt_ids: &[u32],
            _sampling: &Sampling,
            _turn: usize,
        ) -> Result<Generated, GenerateError> {
            Err(GenerateError::Refused(
                "asked for a turn allowed no token".into(),
            ))
        }

        fn take_switches(&mut self) -> Vec<BackendSwitch> {
            Vec::new()
        }
    }

    /// A turn allowed no token asks the backend nothing and says why (it once panicked
    /// RUN: "a turn has a part", and the job was run again).
    #[tokio::test]
    async fn a_turn_allowed_no_token_is_not_asked_for() {
        let policy = PolicyWatch::at_version(None);
        let zero = Sampling {
            max_tokens: Some(0),
            ..Sampling::default()
        };
        let any = Sampling::default();
        for (sampling, room, why) in [
            (&zero, 100, FinishReason::TurnLength),
            (&any, 0, FinishReason::ContextLength),
        ] {
            let source = TurnSource {
                policy: &policy,
                deadline: tokio::time::Instant::now() + Duration::from_secs(60),
                sampling,
                max_new_tokens: 16,
            };
            let r = generate_turn(&source, &mut Unasked, &AlwaysWanted, &[1], 0, room).await;
            assert!(
                matches!(r, Ok(ControlFlow::Break(w)) if w == why),
                "{why:?}"
            );
        }
    }
}
