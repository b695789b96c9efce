//! How calls join samples, the way AReaL and Agent Lightning assemble them: a call whose
//! prompt extends a sample's whole token sequence is appended to it (the new prompt
//! tokens with loss mask 0, the output with 1); otherwise it starts a sample.

use std::time::Instant;

use super::{Endpoint, Merge};
use crate::agent::generation::{self, finish_name};
use crate::agent::trajectory::{Trajectory, Turn};
use crate::backends::generate::Generated;
use crate::domain::duration_us;

impl Endpoint {
    /// Puts a call's tokens into the samples; returns the sample, the turn's index in
    /// it, the verdict, the observation tokens before the call's output, and (for a
    /// new sample) where its prompt leaves the last sample's tokens.
    pub(super) fn assemble(
        &mut self,
        prompt: &[u32],
        generated: Generated,
        llm_us: u64,
        versions: generation::TurnVersions,
        text: &str,
        t_call: Instant,
    ) -> (usize, usize, Merge, usize, Option<usize>) {
        let found = self.samples.iter().rposition(|s| {
            s.len() <= prompt.len()
                && s.prompt_ids[..] == prompt[..s.prompt_ids.len()]
                && s.response_ids[..] == prompt[s.prompt_ids.len()..s.len()]
        });
        let diverges = match found {
            Some(_) => None,
            None => self.samples.last().map(|s| {
                let all = s.all_ids();
                all.iter()
                    .zip(prompt)
                    .position(|(a, b)| a != b)
                    .unwrap_or(all.len().min(prompt.len()))
            }),
        };
        let (index, merge, obs) = match found {
            Some(i) => {
                let s = &mut self.samples[i];
                let obs = &prompt[s.len()..];
                s.push_observation(obs);
                if let Some(last) = s.turns.last_mut() {
                    last.observation_range = [last.model_range[1], s.response_ids.len()];
                }
                (i, Merge::Extends, obs.len())
            }
            None => {
                let merge = if self.samples.is_empty() {
                    Merge::First
                } else {
                    Merge::New
                };
                self.samples.push(Trajectory::new(
                    prompt.to_vec(),
                    &self.ep.model_name,
                    Vec::new(),
                ));
                (self.samples.len() - 1, merge, 0)
            }
        };
        let Generated {
            generation: g,
            backend,
            logprobs_mode,
            backend_wait,
        } = generated;
        let s = &mut self.samples[index];
        let start = s.response_ids.len();
        s.push_model(&g.token_ids, &g.logprobs);
        let mut from = start;
        for &(len, version) in &versions.spans {
            if let Some(v) = version {
                s.note_policy_version(v, from, from + len);
            }
            from += len;
        }
        s.backend = backend.clone();
        s.note_logprobs_mode(logprobs_mode);
        let wall = duration_us(t_call.elapsed());
        let waited = duration_us(backend_wait);
        s.turns.push(Turn {
            text: text.to_string(),
            model_range: [start, s.response_ids.len()],
            observation_range: [s.response_ids.len(); 2],
            tools: Vec::new(),
            backend,
            generation_finish: finish_name(g.finish).to_string(),
            llm_latency_us: llm_us,
            backend_wait_us: waited,
            tool_latency_us: 0,
            overhead_us: wall.saturating_sub(waited),
            cached_prompt_tokens: g.cached_prompt_tokens,
            prompt_tokens: prompt.len(),
            logprobs_mode,
            policy_version: versions.sent(),
            policy_version_end: versions.changed(),
            continued: u32::try_from(versions.parts - 1).unwrap_or(u32::MAX),
        });
        (index, s.turns.len() - 1, merge, obs, diverges)
    }
}
