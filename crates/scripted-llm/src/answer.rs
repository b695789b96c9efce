//! The answering path both wire formats share: what a request asks ([`Ask`]), the
//! script's answer to it, cut by stop strings, stop tokens and the room in the context,
//! played with the simulated timing, the pause and the fault set ([`serve`]), and
//! recorded ([`record`]). The formats ([`crate::vllm`], [`crate::sglang`]) only decode
//! their request into an [`Ask`] and encode the [`Answer`], so both answer alike.

use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::response::Response;

use crate::faults::play_fault;
use crate::pause;
use crate::refuse::{bad_request_in, refuse_unknown_ids, refuse_while_paused, room};
use crate::script::stable_hash;
use crate::stats::Served;
use crate::{ScriptedConfig, Shared};

/// What a request asks for, from either format: the one shape [`serve`] takes, so the
/// formats differ only in how they decode and encode.
pub(crate) struct Ask {
    /// The prompt's token IDs (vLLM's `prompt`, SGLang's `input_ids`).
    pub(crate) prompt: Vec<u32>,
    /// vLLM's `max_tokens`, SGLang's `max_new_tokens`; absent, each server's default
    /// (see [`room`]).
    pub(crate) max_tokens: Option<usize>,
    /// Stop strings: the answer ends with the token that completes the first found.
    pub(crate) stop: Vec<String>,
    /// Stop tokens: the answer ends with the first of them.
    pub(crate) stop_token_ids: Vec<u32>,
    /// The sampling seed, which picks the script's variant; absent, one from a counter.
    pub(crate) seed: Option<u64>,
    /// The prefix cache's namespace.
    pub(crate) salt: Option<String>,
}

/// The rest of an aborted answer: its tokens from the abort on, and what stops them.
#[derive(Debug, Clone)]
pub(crate) struct Continuation {
    /// The tokens still to say.
    ids: Vec<u32>,
    /// What ends them (a stop string or token), as the answer reports it.
    matched: Option<serde_json::Value>,
    /// The script's variant and turn that made it (for the request log).
    variant: usize,
    /// The turn index.
    turn: usize,
}

/// How many aborted answers the stand-in remembers for continuation.
const MAX_CONTINUATIONS: usize = 4096;

/// What the script answers, after the cuts, the pause and the faults: what each format
/// encodes in its own shape.
pub(crate) struct Answer {
    /// The output token IDs.
    pub(crate) ids: Vec<u32>,
    /// Their pseudo-logprobs ([`pseudo_logprob`]).
    pub(crate) logprobs: Vec<f32>,
    /// The tokens decoded.
    pub(crate) text: String,
    /// `stop`, `length` or `abort`.
    pub(crate) finish: &'static str,
    /// The token or string that stopped it.
    pub(crate) matched: Option<serde_json::Value>,
    /// Prompt tokens found in the prefix cache.
    pub(crate) cached: usize,
    /// The weights' label over the output tokens, as `(label, start, end)` runs.
    pub(crate) versions: Vec<(String, usize, usize)>,
}

/// The script's answer to `prompt_text`: its tokens, cut after the first stop string or
/// stop token the request names (kept, as both servers keep it), or ended with the
/// model's end-of-sequence token; and what stopped it.
fn script_answer(
    cfg: &ScriptedConfig,
    prompt_text: &str,
    key: u64,
    ask: &Ask,
) -> Result<Continuation, String> {
    let vocab = &cfg.model.tokenizer;
    let pick = cfg.script.pick(prompt_text, key);
    let (mut ids, stopped_by) =
        cut_at_stop(vocab, &pick.text, &ask.stop).map_err(|e| e.to_string())?;
    let by_string = stopped_by.is_some();
    let mut matched = stopped_by.map(serde_json::Value::String);
    if let Some(at) = ids.iter().position(|id| ask.stop_token_ids.contains(id)) {
        ids.truncate(at + 1);
        matched = Some(ids[at].into());
    } else if !by_string {
        ids.push(cfg.model.eos_id);
        matched = Some(cfg.model.eos_id.into());
    }
    Ok(Continuation {
        ids,
        matched,
        variant: pick.variant,
        turn: pick.turn,
    })
}

impl Shared {
    /// Puts a prompt and its answer in the prefix cache, in `salt`'s namespace.
    fn cache_answer(&self, salt: Option<&str>, prompt: &[u32], ids: &[u32]) {
        let mut all = prompt.to_vec();
        all.extend_from_slice(ids);
        self.cache.lock().expect("lock").insert(salt, &all);
    }

    /// Remembers the rest of `whole`, aborted after `ids`, for a request that sends
    /// `prompt` and `ids` to continue it.
    fn remember_rest(&self, prompt: &[u32], ids: &[u32], whole: &Continuation) {
        let mut key = prompt.to_vec();
        key.extend_from_slice(ids);
        let rest = Continuation {
            ids: whole.ids[ids.len()..].to_vec(),
            ..whole.clone()
        };
        let mut map = self.continuations.lock().expect("lock");
        if map.len() >= MAX_CONTINUATIONS {
            map.clear();
        }
        map.insert(key, rest);
    }
}

/// Plays faults, then the script, with the simulated timing. `Err` is the response to
/// send instead.
pub(crate) async fn serve(s: &Shared, ask: Ask, format: &str) -> Result<Answer, Response> {
    let cfg = &s.cfg;
    let max_tokens = room(cfg, ask.prompt.len(), ask.max_tokens, format).map_err(|r| *r)?;
    if format == "vllm" {
        refuse_unknown_ids(cfg, &ask.prompt, &ask.stop_token_ids).map_err(|r| *r)?;
    }
    if let Some(r) = refuse_while_paused(s, format) {
        return Err(r);
    }
    // A paused server holds the request here (see `pause`).
    let mut ticket = s.pause.arrive();
    let admitted = ticket.admitted().await;
    let abort = if admitted {
        play_fault(s).await?
    } else {
        false
    };
    let vocab = &cfg.model.tokenizer;
    let prompt_text = vocab
        .decode(&ask.prompt)
        .map_err(|e| bad_request_in(format, format!("prompt: {e}")))?;
    let key = ask
        .seed
        .unwrap_or_else(|| stable_hash(&[cfg.seed, s.counter.fetch_add(1, Ordering::Relaxed)]));
    // A request that sends an aborted answer's tokens after its prompt continues it.
    let resumed = s.continuations.lock().expect("lock").remove(&ask.prompt);
    let whole = match resumed {
        Some(c) => c,
        None => script_answer(cfg, &prompt_text, key, &ask)
            .map_err(|e| bad_request_in(format, format!("script: {e}")))?,
    };
    let mut ids = whole.ids.clone();
    let mut matched = whole.matched.clone();
    let mut finish = "stop";
    if ids.len() > max_tokens {
        ids.truncate(max_tokens);
        finish = "length";
        matched = None;
    }
    if abort {
        ids.truncate(ids.len() / 2);
        finish = "abort";
        matched = None;
    }
    let mut logprobs: Vec<f32> = ids
        .iter()
        .enumerate()
        .map(|(i, &id)| pseudo_logprob(ask.prompt.len() + i, id))
        .collect();
    let cached = s
        .cache
        .lock()
        .expect("lock")
        .lookup(ask.salt.as_deref(), &ask.prompt);
    let wait = Duration::from_nanos(
        (ask.prompt.len() - cached) as u64 * cfg.prefill_ns_per_token
            + ids.len() as u64 * cfg.token_us * 1000,
    );
    let planned = ids.len();
    let (generated, labels) = if admitted {
        generate_labelled(s, &ticket, wait).await
    } else {
        (Err(Duration::ZERO), Vec::new())
    };
    if let Err(done) = generated {
        // Aborted: the tokens generated so far (none for a request still waiting).
        let keep = if admitted {
            generated_by(ids.len(), done, wait)
        } else {
            0
        };
        ids.truncate(keep);
        logprobs.truncate(keep);
        finish = "abort";
        matched = None;
    }
    drop(ticket);
    if finish == "abort" {
        s.remember_rest(&ask.prompt, &ids, &whole);
    }
    s.cache_answer(ask.salt.as_deref(), &ask.prompt, &ids);
    let text = vocab.decode(&ids).unwrap_or_default();
    let versions = label_runs(
        &labels,
        (planned, ids.len()),
        wait,
        &s.weight_version.lock().expect("lock"),
    );
    let answer = Answer {
        ids,
        logprobs,
        text,
        finish,
        matched,
        cached,
        versions,
    };
    record(s, format, key, &ask.prompt, &answer, &whole);
    Ok(answer)
}

/// Spends `wait` generating (see [`pause::Ticket::generate`]), noting the weights'
/// label each time the clock (re)starts: vLLM tags each output token with the label
/// current when it was sampled, and the label changes while paused. The labels come
/// with the time generated when each took over.
async fn generate_labelled(
    s: &Shared,
    ticket: &pause::Ticket<'_>,
    wait: Duration,
) -> (Result<(), Duration>, Vec<(Duration, String)>) {
    let mut labels: Vec<(Duration, String)> = Vec::new();
    let generated = ticket
        .generate_with(wait, |done| {
            let now = s.weight_version.lock().expect("lock").clone();
            if labels.last().is_none_or(|(_, l)| *l != now) {
                labels.push((done, now));
            }
        })
        .await;
    (generated, labels)
}

/// The tokens of `text` up to the one that completes the first of `stops` to occur in
/// it, and that stop string: as vLLM and SGLang stop, on the detokenized output, keeping
/// the whole token that completed the string even when the string ends inside it.
/// Without a stop string in `text`, all its tokens.
fn cut_at_stop(
    vocab: &rollout_model::tokenizer::Tokenizer,
    text: &str,
    stops: &[String],
) -> Result<(Vec<u32>, Option<String>), rollout_model::tokenizer::TokenizerError> {
    let mut ids = vocab.encode(text)?;
    let first = stops
        .iter()
        .filter(|st| !st.is_empty())
        .filter_map(|st| text.find(st.as_str()).map(|i| (i + st.len(), st)))
        .min_by_key(|(end, _)| *end);
    let Some((_, stop)) = first else {
        return Ok((ids, None));
    };
    for k in 1..=ids.len() {
        if vocab.decode(&ids[..k])?.contains(stop.as_str()) {
            ids.truncate(k);
            break;
        }
    }
    Ok((ids, Some(stop.clone())))
}

/// The label of each output token, as runs: `planned` tokens were to be generated over
/// `wait` and the first `n` were (fewer when aborted); `labels` holds the label from
/// each point of the generation on (the first from its start). None (a request
/// answered without generating) gives `current` throughout.
fn label_runs(
    labels: &[(Duration, String)],
    (planned, n): (usize, usize),
    wait: Duration,
    current: &str,
) -> Vec<(String, usize, usize)> {
    let mut runs: Vec<(String, usize, usize)> = Vec::new();
    for (i, (at, label)) in labels.iter().enumerate() {
        let start = if i == 0 {
            0
        } else {
            generated_by(planned, *at, wait).min(n)
        };
        if let Some(last) = runs.last_mut() {
            last.2 = start;
        }
        runs.push((label.clone(), start, n));
    }
    runs.retain(|(_, start, end)| end > start);
    if runs.is_empty() && n > 0 {
        runs.push((current.to_string(), 0, n));
    }
    runs
}

/// How many of `n` tokens, generated over `wait`, were out after `done`.
fn generated_by(n: usize, done: Duration, wait: Duration) -> usize {
    if wait.is_zero() {
        return n;
    }
    usize::try_from(n as u128 * done.as_nanos() / wait.as_nanos()).map_or(n, |k| k.min(n))
}

/// Counts an answered request and keeps it in the log of served requests (the last
/// `keep_requests`), for tests to inspect.
fn record(s: &Shared, format: &str, key: u64, prompt: &[u32], a: &Answer, pick: &Continuation) {
    s.requests.fetch_add(1, Ordering::Relaxed);
    s.prompt_tokens
        .fetch_add(prompt.len() as u64, Ordering::Relaxed);
    s.cached_tokens
        .fetch_add(a.cached as u64, Ordering::Relaxed);
    s.completion_tokens
        .fetch_add(a.ids.len() as u64, Ordering::Relaxed);
    if s.cfg.keep_requests > 0 {
        let mut log = s.served.lock().expect("lock");
        if log.len() >= s.cfg.keep_requests {
            log.pop_front();
        }
        log.push_back(Served {
            format: format.into(),
            key,
            prompt_len: prompt.len(),
            cached_tokens: a.cached,
            output_ids: a.ids.clone(),
            logprobs: a.logprobs.clone(),
            variant: pick.variant,
            turn: pick.turn,
        });
    }
}

/// A deterministic logprob in [-4, -0.001] for token `id` at `position`: the same
/// token at the same place always gets the same one, so a test can recompute what the
/// server sent and check the service stored it unchanged.
pub fn pseudo_logprob(position: usize, id: u32) -> f32 {
    let h = stable_hash(&[position as u64, u64::from(id)]);
    -(0.001 + (h % 4000) as f32 / 1000.0)
}

/// Counts a request in flight for as long as it lives, and as aborted if it is dropped
/// before [`InFlight::done`] (the client closed the connection).
pub(crate) struct InFlight<'a> {
    shared: &'a Shared,
    done: bool,
}

impl<'a> InFlight<'a> {
    /// Counts a request in flight from now.
    pub(crate) fn new(shared: &'a Shared) -> Self {
        shared.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight {
            shared,
            done: false,
        }
    }

    /// The request was answered: no longer in flight, and not aborted.
    pub(crate) fn done(mut self) {
        self.done = true;
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.shared.in_flight.fetch_sub(1, Ordering::Relaxed);
        if !self.done {
            self.shared.aborted.fetch_add(1, Ordering::Relaxed);
        }
    }
}
