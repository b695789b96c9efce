//! The stand-in server's script: which assistant turns it plays for which task.
//!
//! A script file is JSON (what the `--policy` flag of `rollout-scripted-llm` reads, and
//! `--script` as well; the flag keeps its old name so existing commands go on working):
//!
//! ```json
//! {
//!   "assistant_marker": "<|im_start|>assistant",
//!   "rules": [
//!     {"match": "Fix add() in add.py",
//!      "variants": [
//!        {"weight": 3, "turns": ["<tool_call>\n{\"name\": \"bash\", ...}\n</tool_call>", "Done."]},
//!        {"weight": 1, "turns": ["I give up."]}
//!      ]}
//!   ],
//!   "fallback": [{"turns": ["I cannot help with that."]}]
//! }
//! ```
//!
//! The server decodes the prompt, takes the first rule whose `match` text occurs in it,
//! and counts the `assistant_marker`s to know which turn it is asked for (the last
//! marker opens the turn being generated), or, when the script names a
//! `turn_end_marker`, the turns the prompt already holds. A variant is the script of one possible
//! episode; at each turn the server keeps the variants whose earlier turns appear in the
//! prompt and picks one of them by weight, from a hash of the request's `seed` (or of
//! the server's seed and a request counter when there is none). So the samples of one
//! group, sent with different seeds, play different variants, while each keeps to its
//! own script across turns.

use serde::{Deserialize, Serialize};

/// A script file: the turns the stand-in plays for each task. A script, not a policy:
/// it only chooses, by weight and seed, among the turns it is given (the service's own
/// `policy` module is about the trained policy's weight versions, an unrelated thing).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Script {
    /// The text that opens an assistant turn in a rendered prompt.
    #[serde(default = "default_marker")]
    pub assistant_marker: String,
    /// Text that ends each of the model's turns, for turn formats whose later turns
    /// open with no marker of their own (DeepSeek-R1's go on straight after the tool
    /// outputs): when set, the turn asked for is how many of these the prompt holds,
    /// and `assistant_marker` is not counted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub turn_end_marker: Option<String>,
    /// Rules, first match wins.
    #[serde(default)]
    pub rules: Vec<Rule>,
    /// Variants for prompts no rule matches.
    #[serde(default = "default_fallback")]
    pub fallback: Vec<Variant>,
}

fn default_marker() -> String {
    "<|im_start|>assistant".into()
}

fn default_fallback() -> Vec<Variant> {
    vec![Variant {
        weight: 1.0,
        turns: vec!["The script has no turn for this prompt.".into()],
    }]
}

impl Default for Script {
    fn default() -> Self {
        Script {
            assistant_marker: default_marker(),
            turn_end_marker: None,
            rules: Vec::new(),
            fallback: default_fallback(),
        }
    }
}

/// Scripts for prompts containing `match`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    /// Text the decoded prompt must contain.
    #[serde(rename = "match")]
    pub matches: String,
    /// The possible episodes.
    pub variants: Vec<Variant>,
}

/// One scripted episode.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Variant {
    /// Relative probability.
    #[serde(default = "one")]
    pub weight: f64,
    /// The assistant turns, in order, as text (special tokens written out are encoded as
    /// their IDs). The end-of-turn token is appended by the server.
    pub turns: Vec<String>,
}

fn one() -> f64 {
    1.0
}

/// What the script says for one request.
#[derive(Debug, Clone, PartialEq)]
pub struct Pick {
    /// The turn's text.
    pub text: String,
    /// Which rule matched (`None`: the fallback).
    pub rule: Option<usize>,
    /// Which variant was played.
    pub variant: usize,
    /// The turn index.
    pub turn: usize,
}

/// FNV-1a, for picks that must not change between builds or runs.
pub fn stable_hash(parts: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for b in p.to_le_bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    // A final avalanche so nearby inputs spread over the whole range.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

impl Script {
    /// Parses and checks a script file's text, naming the field at fault when it is wrong.
    pub fn from_json(text: &str) -> Result<Self, String> {
        let mut de = serde_json::Deserializer::from_str(text);
        let p: Script = serde_path_to_error::deserialize(&mut de)
            .map_err(|e| format!("script file: {}: {}", e.path(), e.inner()))?;
        for (i, r) in p.rules.iter().enumerate() {
            if r.variants.is_empty() {
                return Err(format!(
                    "script file: rules[{i}].variants must not be empty"
                ));
            }
            if r.matches.is_empty() {
                return Err(format!("script file: rules[{i}].match must not be empty"));
            }
        }
        for v in p.rules.iter().flat_map(|r| &r.variants).chain(&p.fallback) {
            if !(v.weight.is_finite() && v.weight > 0.0) {
                return Err("script file: every variant's weight must be above 0".into());
            }
            if v.turns.is_empty() {
                return Err("script file: every variant needs at least one turn".into());
            }
        }
        if p.fallback.is_empty() {
            return Err("script file: fallback must not be empty".into());
        }
        Ok(p)
    }

    /// The turn to play for the decoded `prompt`; `key` is the sample's seed.
    pub fn pick(&self, prompt: &str, key: u64) -> Pick {
        let turn = match &self.turn_end_marker {
            Some(end) => prompt.matches(end.as_str()).count(),
            None => prompt
                .matches(self.assistant_marker.as_str())
                .count()
                .saturating_sub(1),
        };
        let (rule, variants) = match self
            .rules
            .iter()
            .enumerate()
            .find(|(_, r)| prompt.contains(r.matches.as_str()))
        {
            Some((i, r)) => (Some(i), &r.variants),
            None => (None, &self.fallback),
        };
        // Variants still consistent with the turns already in the prompt.
        let mut candidates: Vec<usize> = (0..variants.len())
            .filter(|&v| {
                variants[v]
                    .turns
                    .iter()
                    .take(turn)
                    .all(|t| prompt.contains(t.as_str()))
            })
            .collect();
        if candidates.is_empty() {
            candidates = (0..variants.len()).collect();
        }
        let total: f64 = candidates.iter().map(|&v| variants[v].weight).sum();
        let r = (stable_hash(&[key, turn as u64]) >> 11) as f64 / (1u64 << 53) as f64 * total;
        let mut acc = 0.0;
        let mut chosen = *candidates.last().expect("at least one variant");
        for &v in &candidates {
            acc += variants[v].weight;
            if r < acc {
                chosen = v;
                break;
            }
        }
        let turns = &variants[chosen].turns;
        let text = turns
            .get(turn)
            .or_else(|| turns.last())
            .cloned()
            .unwrap_or_default();
        Pick {
            text,
            rule,
            variant: chosen,
            turn,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn script() -> Script {
        Script::from_json(
            r#"{"rules": [{"match": "task-a", "variants": [
                {"turns": ["A1", "A2 right"]},
                {"turns": ["A1", "A2 wrong"]},
                {"turns": ["B1", "B2"]}
            ]}]}"#,
        )
        .unwrap()
    }

    #[test]
    fn counts_turns_and_keeps_to_the_variant_in_the_prompt() {
        let p = script();
        let first = "<|im_start|>user\ntask-a<|im_end|>\n<|im_start|>assistant\n";
        let picks: Vec<Pick> = (0..64).map(|seed| p.pick(first, seed)).collect();
        assert!(picks.iter().all(|k| k.turn == 0 && k.rule == Some(0)));
        // Different seeds play different variants.
        let mut seen: Vec<usize> = picks.iter().map(|k| k.variant).collect();
        seen.sort_unstable();
        seen.dedup();
        assert_eq!(seen, vec![0, 1, 2]);
        // The second turn follows the first turn's text.
        let second = format!("{first}B1<|im_end|>\nobs\n<|im_start|>assistant\n");
        for seed in 0..16 {
            let k = p.pick(&second, seed);
            assert_eq!((k.turn, k.text.as_str()), (1, "B2"));
        }
    }

    #[test]
    fn same_seed_same_pick_and_fallback_without_a_match() {
        let p = script();
        let prompt = "<|im_start|>assistant\n";
        assert_eq!(p.pick("task-a", 7), p.pick("task-a", 7));
        let k = p.pick(prompt, 1);
        assert_eq!(k.rule, None);
        assert!(k.text.contains("no turn"));
    }

    #[test]
    fn bad_files_are_explained() {
        let e = Script::from_json(r#"{"rules": [{"match": "x", "variants": []}]}"#).unwrap_err();
        assert!(e.contains("rules[0].variants"), "{e}");
        let e = Script::from_json(r#"{"rulez": []}"#).unwrap_err();
        assert!(e.contains("rulez"), "{e}");
    }
}
